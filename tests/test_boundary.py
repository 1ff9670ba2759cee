"""The library boundary: no module of rotviz/ outside rotviz.ui imports streamlit (rotviz/ui/ and
the checkout's app.py are the only UI layer; rotviz.ui's __init__ and options import none
either, so that rotviz.cli reads the options without it), and what the pages import on their
first line costs no engine import."""

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import rotviz
from rotviz.ui import options

ROOT = Path(__file__).resolve().parents[1]
UI = ROOT / "rotviz" / "ui"
# the app's helper modules (rotviz/ui/), which rotviz/ui/main.py does not list as pages
HELPERS = ("boot.py", "sidebar.py", "runtime.py", "run.py", "show.py", "section.py")
# what rotviz.ui holds that imports no streamlit (rotviz.cli reads the options)
NO_STREAMLIT = ("rotviz.ui", "rotviz.ui.options", "rotviz.ui.views")


def _in_ui(name: str) -> bool:
    return name == "rotviz.ui" or name.startswith("rotviz.ui.")


def test_importing_every_rotviz_module_leaves_streamlit_unloaded():
    every = [m.name for m in pkgutil.walk_packages(rotviz.__path__, "rotviz.")]
    assert {"rotviz.match.layers", "rotviz.measures.barrier", "rotviz.plots",
            "rotviz.app.roots", "rotviz.ui.options", "rotviz.ui.views.barrier"} <= set(every)
    names = [n for n in every if not _in_ui(n) or n in NO_STREAMLIT]
    code = (
        "import importlib, sys\n"
        f"for n in {names!r}:\n"
        "    if n != 'rotviz.__main__':\n"
        "        importlib.import_module(n)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'streamlit'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_no_source_file_of_rotviz_mentions_a_streamlit_import():
    """Outside rotviz/ui/, and in rotviz.ui's own __init__, options and views/__init__."""
    quiet = {UI / "__init__.py", UI / "options.py", UI / "views" / "__init__.py"}
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "rotviz").rglob("*.py")
        if (UI not in p.parents or p in quiet)
        and ("import streamlit" in p.read_text() or "from streamlit" in p.read_text())
    ]
    assert offenders == []
    assert "import streamlit" in (UI / "app.py").read_text()  # the check sees the app's files


def _page_files() -> list[Path]:
    return [ROOT / "app.py", *sorted(UI.glob("*.py")), *sorted((UI / "views").glob("*.py"))]


def _top_level_rotviz_imports(path: Path) -> list[str]:
    """The rotviz modules (and `from` targets) a file imports outside any function."""
    out = []
    for node in ast.parse(path.read_text()).body:  # the module's own statements only
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += ([f"rotviz.{a.name}" for a in node.names] if node.module == "rotviz"
                    else [node.module])
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return [n for n in out if n.split(".")[0] == "rotviz"]


def test_pages_import_the_engine_only_inside_functions():
    """A page paints before torch loads: what app.py and rotviz/ui/ import at module level
    from rotviz loads no torch, transformers or scipy. A page that needs an engine name
    imports it from its home inside the function that uses it."""
    names = sorted({n for p in _page_files() for n in _top_level_rotviz_imports(p)})
    assert "rotviz.app" in names and "rotviz.app.specs" in names
    code = (
        "import importlib, sys\n"
        f"for n in {names!r}:\n"
        "    importlib.import_module(n)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'scipy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", names


def test_every_page_is_listed_in_main_navigation():
    """The app's pages live in rotviz/ui/views/ and rotviz/ui/main.py's st.navigation is the
    only page list (boot.py and the helpers in HELPERS are not pages). No folder named pages/
    sits beside main.py or the checkout's app.py: streamlit would take the app for an old-style
    multipage app (PagesManager.uses_pages_directory) and run a fresh server's first script
    run, and every AppTest run, over its own listing of that folder, without main.py's frame
    (its navigation then reads "main", "barrier", ... and the page title is the file name)."""
    assert not (ROOT / "pages").exists() and not (UI / "pages").exists()
    main = (UI / "main.py").read_text()
    pages = sorted(p for p in (UI / "views").glob("*.py") if p.name != "__init__.py")
    assert len(pages) >= 10  # the app has its pages (an empty glob would pass the rest)
    for page in pages:
        assert page.name not in HELPERS
        assert f'st.Page(PAGE_DIR / "{page.name}"' in main, page.name
    assert main.count("st.Page(") == len(pages)
    assert not {p.name for p in UI.glob("*.py")} - {*HELPERS, "__init__.py", "app.py", "main.py",
                                                    "options.py"}


def test_streamlit_config_toml_equals_the_options():
    """The checkout's .streamlit/config.toml (for `streamlit run app.py`) holds the settings
    `rotviz serve` passes as flags (rotviz.ui.options), no more and no less."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(ROOT / ".streamlit" / "config.toml", "rb") as f:
        assert tomllib.load(f) == options.OPTIONS
    flags = options.flags()
    assert flags[flags.index("--theme.primaryColor") + 1] == "#0072B2"
    assert flags[flags.index("--server.headless") + 1] == "true"
    assert len(flags) == 2 * sum(len(v) for v in options.OPTIONS.values())

"""The library boundary: no module of rotviz/ imports streamlit (app.py and rotviz/ui/ are the
only UI layer), and what the pages import on their first line costs no engine import."""

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import rotviz

ROOT = Path(__file__).resolve().parents[1]
# the app's helper modules (rotviz/ui/), which rotviz/ui/main.py does not list as pages
HELPERS = ("boot.py", "sidebar.py", "runtime.py", "run.py", "show.py", "section.py")


def test_importing_every_rotviz_module_leaves_streamlit_unloaded():
    names = [m.name for m in pkgutil.walk_packages(rotviz.__path__, "rotviz.")]
    assert {"rotviz.match.layers", "rotviz.measures.barrier", "rotviz.plots",
            "rotviz.app.roots"} <= set(names)
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
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "rotviz").rglob("*.py")
        if "import streamlit" in p.read_text() or "from streamlit" in p.read_text()
    ]
    assert offenders == []


def _page_files() -> list[Path]:
    return [ROOT / "app.py", ROOT / "rotviz/ui/main.py", *sorted((ROOT / "app_pages").glob("*.py"))]


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


def test_no_folder_named_pages():
    """Streamlit lists a folder named pages/ next to the entrypoint as pages of its own; the
    app's pages live in rotviz/ui/ and rotviz/ui/main.py's st.navigation is the only page list
    (boot.py and the helpers in HELPERS are not pages)."""
    assert not (ROOT / "pages").exists()
    app_py = (ROOT / "rotviz/ui/main.py").read_text()
    for page in sorted((ROOT / "app_pages").glob("*.py")):
        if page.name not in HELPERS:
            assert f'st.Page("rotviz/ui/{page.name}"' in app_py, page.name

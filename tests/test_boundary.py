"""The library boundary: no module of rotviz/ imports streamlit (pages are the only UI layer),
and the pages reach the library only through its app-facing part."""

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import rotviz

ROOT = Path(__file__).resolve().parents[1]


def test_importing_every_rotviz_module_leaves_streamlit_unloaded():
    names = [m.name for m in pkgutil.walk_packages(rotviz.__path__, "rotviz.")]
    assert {"rotviz.match.layers", "rotviz.analysis.landscape", "rotviz.plots",
            "rotviz.appconfig"} <= set(names)
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


# What app.py and pages/ may import from rotviz: the app-facing library and the plots.
APP_FACING = ("rotviz.app", "rotviz.appconfig", "rotviz.explore", "rotviz.plots")


def test_pages_import_only_the_app_facing_library():
    offenders = []
    for path in [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = ([f"rotviz.{a.name}" for a in node.names] if node.module == "rotviz"
                         else [node.module])
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n.split(".")[0] == "rotviz"
                          and not any(n == m or n.startswith(m + ".") for m in APP_FACING)]
    assert offenders == []

"""The library boundary: no module of rotviz/ imports streamlit (pages are the only UI layer)."""

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

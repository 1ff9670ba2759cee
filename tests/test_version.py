"""One version source (rotviz/version.py): the installed package's metadata, `rotviz
--version` and `rotviz.__version__` all say the same, and CHANGELOG.md has its entry."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import rotviz
from rotviz.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_one_version_everywhere(capsys):
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"rotviz {rotviz.__version__}\n"
    assert version("rotviz") == rotviz.__version__  # pyproject reads rotviz/version.py
    assert f"## {rotviz.__version__}" in (REPO / "CHANGELOG.md").read_text()

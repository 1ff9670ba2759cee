"""The documentation stands alone and stays true: docs/cli.md holds the options reference of
the code it ships with, the README stays short, and every relative link resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rotviz.cli import manual

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "RESULTS.md"]


def test_the_options_reference_is_current():
    """Regenerate with `python -m rotviz.cli.manual --write` after changing an option or a
    record."""
    got = manual.in_doc((REPO / "docs" / "cli.md").read_text())
    assert got, "docs/cli.md lost its generated block"
    stale = "docs/cli.md is stale: python -m rotviz.cli.manual --write"
    assert got == manual.reference().strip("\n"), stale


def test_the_reference_names_every_command():
    text = manual.reference()
    for cmd in ("match", "barrier", "plane", "merge", "distances", "spectra", "eval", "serve"):
        assert f"### `rotviz {cmd}`" in text
    assert "--match SPEC" in text.split("### `rotviz match`")[1].split("###")[0]


def test_the_readme_reads_in_five_minutes():
    """At most 150 lines of it, besides the two example modules a contributor copies (a
    measurement and a merge method, run as they are written by tests/test_dropin.py)."""
    from tests.test_dropin import readme_modules

    modules = readme_modules()
    assert len(modules) == 2
    examples = sum(len(code.splitlines()) + 3 for code in modules.values())  # fences, path
    assert len((REPO / "README.md").read_text().splitlines()) - examples <= 150


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc):
    text = doc.read_text()
    assert "REFERENCE.md" not in text and "../shared" not in text
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"

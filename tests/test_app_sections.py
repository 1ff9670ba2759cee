"""Records declare their page sections (rotviz.measures.Section): what each declares names
its record's own parameters, the topic pages get the sections they compose, and a section's
first look holds few controls (the essential parameters; the rest wait under "More
options"). Cheap: no page runs here (tests/test_app.py runs the pages)."""

from __future__ import annotations

import pytest

from rotviz.measures import measurements, sections

TOPIC_PAGES = ("barrier", "landscape", "match", "merge", "spectra", "training",
               "function")
DECLARED = [m for m in measurements() if m.section is not None]


def test_the_topic_pages_get_their_sections_in_order():
    assert [m.name for m in sections("landscape")] == ["slice", "bend", "layerwise", "hessian",
                                                     "teleport", "teleport_train"]
    assert [m.name for m in sections("training")] == ["training", "spawn", "conserved",
                                                       "trajectory"]
    assert [m.name for m in sections("merge")] == ["fusion", "merge_sweep", "many",
                                                   "taskvectors"]
    assert [m.name for m in sections("barrier")] == ["barrier", "plane"]
    assert sections("nowhere") == ()


@pytest.mark.parametrize("record", DECLARED, ids=lambda m: m.name)
def test_a_section_names_its_records_parameters(record):
    sec = record.section
    names = {p.name for p in record.parameters()}
    assert sec.page in TOPIC_PAGES
    assert set(sec.defaults) <= names, set(sec.defaults) - names
    assert set(sec.hidden) <= names, set(sec.hidden) - names
    assert record.values(dict(sec.defaults))  # the small defaults are within their bounds
    assert len(sec.tabs) in (0, 2)  # a tab per figure where it has them (the plane's two)


@pytest.mark.parametrize("record", DECLARED, ids=lambda m: m.name)
def test_a_sections_first_look_holds_few_controls(record):
    """The Landscape page's slice showed 13 controls at once; each section now shows its
    essential parameters and folds the rest."""
    shown = [p for p in record.parameters()
             if p.essential and p.name not in record.section.hidden]
    assert len(shown) <= 6, [p.name for p in shown]
    if record.name == "slice":
        assert [p.name for p in shown] == ["around", "directions", "grid"]

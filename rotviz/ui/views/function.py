"""Function: what matching keeps. The weights move a long way; the representations, the
halves of the two models and the interpolated activations say what the function did.

Its sections are the records that declare one on this page (rotviz.measures' `Section`:
representation similarity, layer swaps, variance collapse), composed by rotviz/ui/section.py
with the page's matching. Nothing computes before its Run is pressed.
"""

from __future__ import annotations

import streamlit as st

from rotviz import app
from rotviz.measures import Measurement
from rotviz.ui import run, section, sidebar

s = sidebar.setup()
st.title("What the function keeps")
st.markdown(
    "Matching moves the source's weights a long way inside its symmetry class and changes "
    "nothing it computes. This page looks at the function itself: how alike the two models' "
    "layers are, whether the first layers of one can feed the rest of the other, and what "
    "happens to the activations between them. Each section computes only when you press its "
    "**Run**."
)

spec, layers = run.pair_matching(
    s, "f", "Matching for B'", "weight",
    "How the source is moved inside its symmetry class; each section compares the anchor "
    "with the source before and after.")

READY = run.require_pair(s)


def cfg_of(record: Measurement, values: dict, refs: list[str] | None = None,
           spec_: str | None = None) -> dict:
    """A section's configuration: the page's matching and layers, the record's values."""
    return app.measure_cfg(s.base(), spec, layers, **values)


section.compose("function", s, "f", section.Hooks(cfg=cfg_of, ready=READY))

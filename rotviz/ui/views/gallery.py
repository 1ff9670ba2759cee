"""Gallery: the papers' figures reproduced on the sidebar's pair, one per gallery record
(rotviz.gallery), each with its caption, the commands that regenerate it and its data. Each
run is a registered measurement computed through the app's cache (shared with the other
pages); the figures compute on Run."""

import streamlit as st

from rotviz import app
from rotviz.gallery import Pair, entries
from rotviz.gallery.make import drawn
from rotviz.ui import run, runtime, show, sidebar

s = sidebar.setup()
st.title("Paper figures")
st.markdown(
    "The figures of the seed paper (*Beyond the Permutation Symmetry of Transformers*: "
    "Figures 4-6 and Table 1) and the generalized-LMC paper's learned-matching barrier, made "
    "on the pair in the sidebar. Each figure is drawn from its table alone, and each comes "
    "with the `rotviz` commands that make it again. `rotviz figures --out DIR` writes them "
    "all, with their data and one report.html for a reading group."
)
ENTRIES = {e.name: e for e in entries()}

with st.form("gallery_form"):
    chosen = st.multiselect("Figures", list(ENTRIES), list(ENTRIES), key="g_names",
                            format_func=lambda n: ENTRIES[n].title, bind="query-params")
    submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")


def body() -> None:
    if not run.require_pair(s):
        return
    pair = Pair(s.anchor, s.source, s.data)
    picked = [ENTRIES[n] for n in chosen]
    total = sum(len(e.runs) for e in picked)
    made = []
    with show.progress("Making the figures", total, stop="gallery") as step:
        for e in picked:
            results = []
            for one in e.runs:
                step(f"{e.title}: {e.measurement}, matching {one.match}")
                cfg = app.measure_cfg(s.base(), one.match, **one.params)
                results.append(runtime.compute(e.measurement, cfg, step.detail))
            made.append((e, results))
    for e, results in made:
        rows, _, fig = drawn(e, results)
        st.subheader(e.title)
        st.caption(e.paper)
        show.chart(fig, f"gallery_{e.name}")
        st.markdown(e.caption)
        st.code("\n".join(e.commands(pair)), language="bash")
        show.export(e.name, {"page": "gallery", "figure": e.name, **s.base()},
                      {"runs": results}, {e.name: rows}, {e.name: fig})


if run.section_wanted("gallery", submitted):
    if not chosen:
        st.warning("Pick at least one figure.")
    else:
        run.guard(body)

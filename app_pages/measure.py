"""Measure: any registered measurement (rotviz.measures) of the pair, its parameters drawn
from its record. A measurement a plug-in registers appears here with nothing else to write."""

import streamlit as st

from app_pages import common
from rotviz import app
from rotviz.app.export import measurement_files
from rotviz.app.specs import SPEC_CHOICES
from rotviz.limits import MAX_LAYERS_TEXT
from rotviz.measures import measurements
from rotviz.plots import style

s = common.setup()
st.title("Every measurement")
st.markdown(
    "Each measurement rotviz knows is a record: a name, its parameters with their bounds, how "
    "to run it on the matched pair and how to draw it. This page lists them all (built-in and "
    "registered by plug-ins) and runs one on the pair, matched once and shared with the "
    "other pages."
)
RECORDS = {m.name: m for m in measurements()}
offered, residual_why = common.offered_specs(s, SPEC_CHOICES)

name = st.selectbox("Measurement", list(RECORDS), format_func=lambda n: RECORDS[n].label,
                    key="x_name", bind="query-params")  # outside the form: its fields follow it
record = RECORDS[name]
st.caption(record.describe() + ("" if record.pair else " (of the anchor alone: the matching "
                                                       "below does not apply)"))

with st.form("measure_form"):
    c = st.columns(2)
    spec = c[0].selectbox("Matching", offered, offered.index("seed"),
                          format_func=style.nice_label, key="x_spec", bind="query-params")
    layers = c[1].text_input("Layers to match (empty = all)", "", key="x_layers",
                             max_chars=MAX_LAYERS_TEXT, bind="query-params")
    cols = st.columns(3)
    params = {p.name: common.param_input(cols[i % 3], p, f"x_{name}_{p.name}")
              for i, p in enumerate(record.parameters())}
    submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")


def body() -> None:
    if not common.require_pair(s):
        return
    if not common.should_run("measure", submitted, s):
        st.info("Press **Run** to compute it.")
        return
    cfg = app.measure_cfg(s.base(), spec, layers, **params)
    with common.progress("Measuring", 1, stop="measure") as step:
        step(f"{record.label}: matching with {style.nice_label(spec)}, then measuring")
        result = common.compute(name, cfg, step.detail)
    common.function_badge(result.get("max_output_diff"), result["tolerance"])
    tables, figures = measurement_files(name, result)
    for key, fig in figures.items():
        common.chart(fig, f"measure_{key}")
    for rows in tables.values():
        common.table(rows)
    common.export(name, {"page": "measure", "measurement": name, **cfg}, result, tables,
                  figures)


common.guard(body)

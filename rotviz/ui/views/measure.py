"""Measure: any registered measurement (rotviz.measures) of the pair, its parameters drawn
from its record. A measurement a plug-in registers appears here with nothing else to write.

A record that takes other inputs than one matched pair (`Measurement.inputs`: the symmetry
ladder, series of checkpoints, N models) gets its references (the sidebar's pair where it
names an anchor and a source), its matchings, once each, and computes on Run only."""

import streamlit as st

from rotviz import app
from rotviz.app import figures
from rotviz.app.export import measurement_animation, measurement_files
from rotviz.app.specs import SPEC_CHOICES, spec_label
from rotviz.limits import MAX_LAYERS_TEXT
from rotviz.measures import measurements
from rotviz.ui import run, runtime, section, show, sidebar

s = sidebar.setup()
st.title("Every measurement")
st.markdown(
    "Each measurement rotviz knows is a record: a name, its parameters with their bounds, how "
    "to run it on the matched pair and how to draw it. This page lists them all (built-in and "
    "registered by plug-ins) and runs one on the pair, matched once and shared with the "
    "other pages."
)
RECORDS = {m.name: m for m in measurements()}
offered, residual_why = run.offered_specs(s, SPEC_CHOICES)

name = st.selectbox("Measurement", list(RECORDS), format_func=lambda n: RECORDS[n].label,
                    key="x_name", bind="query-params")  # outside the form: its fields follow it
record = RECORDS[name]
st.caption(record.describe() + ("" if record.pair else " (of the anchor alone: the matching "
                                                       "below does not apply)"))
inputs = record.inputs
PAIR = {"anchor": s.anchor, "source": s.source}  # what the sidebar fills in

with st.form("measure_form"):
    if inputs is None:
        c = st.columns(2)
        spec = c[0].selectbox("Matching", offered, offered.index("seed"),
                              format_func=figures.nice_label, key="x_spec", bind="query-params")
        layers = c[1].text_input("Layers to match (empty = all)", "", key="x_layers",
                                 max_chars=MAX_LAYERS_TEXT, bind="query-params")
    else:
        c = st.columns(len(inputs.args))
        texts = [c[i].text_input(arg, PAIR.get(arg, ""), key=f"x_{name}_{arg}", help=text
                                 + (" (comma-separated)" if inputs.least else ""))
                 for i, (arg, text) in enumerate(inputs.args)]
        refs = [r.strip() for t in texts for r in (t.split(",") if inputs.least else [t])
                if r.strip()]
        # the record's own matchings first (its rungs, in order), then the others offered,
        # each meaning once ('act' and 'weight,act' are one)
        mine = {spec_label(sp) for sp in inputs.default_specs}
        choices = run.offered_specs(s, inputs.default_specs + tuple(
            sp for sp in SPEC_CHOICES if spec_label(sp) not in mine))[0]
        default = [sp for sp in inputs.default_specs if sp in choices]
        if not inputs.default_specs:
            specs = []
        elif inputs.one_spec:
            specs = [st.selectbox("Matching", choices, key=f"x_{name}_spec",
                                  format_func=figures.nice_label)]
        else:
            specs = st.multiselect("Matchings (once each, in this order)", choices, default,
                                   format_func=figures.nice_label, key=f"x_{name}_specs",
                                   bind="query-params")
    # the essential parameters first, the rest under "More options" (as on the topic pages);
    # what the record's animation needs (the barrier's answers on 4 inputs) starts on
    params = section.widgets(record, f"x_{name}", defaults=record.animate_params)
    submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")


def draw(result: dict, cfg: dict) -> None:
    """The record's figure, its animation (`animate`), its text (`markdown`) and
    table, and the export."""
    tables, figs = measurement_files(name, result, s.style())
    for key, fig in figs.items():
        show.chart(fig, f"measure_{key}")
    anim = measurement_animation(name, result)
    if anim is not None:
        show.animation(anim, f"measure_{name}_anim", f"{name}-animation")
    markdown = record.markdown
    if markdown is not None:
        st.markdown(markdown(result))
    for rows in tables.values():
        show.table(rows)
    show.export(name, {"page": "measure", "measurement": name, **cfg}, result, tables,
                  figs, {name: anim} if anim is not None else None)


def body() -> None:
    if not run.require_pair(s, loss=record.data):  # the weights' views take any head
        return
    if not run.should_run("measure", submitted, s):
        st.info("Press **Run** to compute it.")
        return
    cfg = app.measure_cfg(s.base(), spec, layers, **params)
    with show.progress("Measuring", 1, stop="measure") as step:
        step(f"{record.label}: matching with {figures.nice_label(spec)}, then measuring")
        result = runtime.compute(name, cfg, step.detail)
    show.function_badge(result.get("max_output_diff"), result["tolerance"])
    show.blocks_badge(result.get("block_checks"))  # a model stacked from blocks (passthrough)
    draw(result, cfg)


def inputs_body() -> None:
    """A record of other inputs: computed on Run only (it matches once per matching)."""
    if not specs:
        st.warning("Pick at least one matching.")
        return
    cfg = app.inputs_cfg(s.base(), refs, specs, **params)
    with show.progress("Measuring", 1, stop=f"measure_{name}") as step:
        step(f"{record.label}: {len(specs)} matching(s)")
        result = runtime.compute(name, cfg, step.detail, run.stopper())
    draw(result, cfg)


if inputs is None:
    run.guard(body)
elif run.section_wanted(f"measure_{name}", submitted):
    run.guard(inputs_body)

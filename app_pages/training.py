"""Training: barriers over training and instability against the spawn step (Frankle et al.,
2020).

Two sections, each a registered measurement of series (rotviz.measures.training and
.spawn) run through the app's cache (`runtime.compute(name, app.inputs_cfg(...))`), their
widgets drawn from the records' parameters. They open on the zoo's spawn series, so both
charts run out of the box; nothing computes before its Run is pressed.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app_pages import run, runtime, show, sidebar
from rotviz import app
from rotviz.app.export import measurement_files
from rotviz.app.specs import SPEC_CHOICES
from rotviz.measures import measurement
from rotviz.plots import style
from rotviz.plots import training as tplots

SERIES = ("zoo:vit-digits-run-a", "zoo:vit-digits-run-b")
SPAWN = "zoo:vit-digits-spawn"
SMALL = {"points": 5}  # a quick first Run: 5 points on each step's path

s = sidebar.setup()
st.title("Barriers over training and spawn instability")
st.markdown(
    "Frankle et al. (2020) asked when two runs that share their start stop ending up in "
    "different basins. **Over training**: two runs saved at the same steps, the barrier "
    "between them at each step. **Against the spawn step**: children copied from one parent "
    "run at step *k* and trained to the end in two data orders; once the barrier between "
    "them is zero, training is *stable* from *k* on. Each pair is matched (every matching "
    "you pick) and its barrier measured exactly as on the Barrier page. The defaults are the "
    "zoo's spawn series (a digits ViT); folders under the model roots work too "
    "(docs/landscape.md gives the layouts)."
)

c = st.columns([2, 1])
specs = c[0].multiselect("Matchings (one line each)", list(SPEC_CHOICES), ["none", "seed"],
                         format_func=style.nice_label, key="t_specs", bind="query-params",
                         help="Each pair is measured once per matching.")
data = c[1].text_input("Data", "digits", key="t_data", bind="query-params",
                       help="The data the barriers are measured on (its test split).")


def form(name: str, fields: dict[str, str]) -> tuple[bool, dict[str, str], dict[str, Any]]:
    """The section's references and the record's parameters, with a Run button."""
    record = measurement(name)
    with st.form(f"t_{name}_form"):
        cols = st.columns(len(fields))
        refs = {k: cols[i].text_input(label, default, key=f"t_{name}_{k}",
                                      bind="query-params")
                for i, (k, (label, default)) in enumerate(fields.items())}
        pcols = st.columns(4)
        values = {p.name: show.param_input(pcols[i % 4], p, f"t_{name}_{p.name}",
                                             SMALL.get(p.name))
                  for i, p in enumerate(record.parameters())}
        pressed = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:",
                                    key=f"t_{name}_run")
    return pressed, refs, values


def wanted(name: str, submitted: bool) -> bool:
    return run.section_wanted(f"train_{name}", submitted)


def section(name: str, refs: list[str], values: dict, draw, what: str) -> dict | None:
    """The section's result, drawn with its table and export (None without a matching)."""
    if not specs:
        st.warning("Pick at least one matching.")
        return None
    cfg = app.inputs_cfg({**s.base(), "data": data}, refs, specs, **values)
    with show.progress(what, 1, stop=f"train_{name}") as step:
        step(f"{len(specs)} matching(s) at each step, {values['points']} points per path")
        result = runtime.compute(name, cfg, step.detail, run.stopper())
    fig = draw(result, s.font)
    show.chart(fig, f"t_{name}_chart")
    tables, _ = measurement_files(name, result)
    with st.expander("Table", icon=":material/table:"):
        for rows in tables.values():
            show.table(rows)
    show.export(name, {"page": "training", **cfg}, result, tables, {name: fig})
    return result


# ---- 1. over training ------------------------------------------------------------------------

st.header("1. The barrier between two runs over training", anchor="training")
st.markdown(
    "Each series is a folder of `checkpoint-<step>/` model folders (Hugging Face Trainer's "
    "layout), `zoo:NAME`, or `ORG/NAME` from the local Hugging Face cache (its `step<N>` "
    "revisions, or those named: `ORG/NAME@step1000,step2000`; when the cache lies under the "
    "model roots). Steps are paired by number. The zoo's two runs share their start, so "
    "their barrier is 0 at step 0."
)
t_run, t_refs, t_values = form("training", {"a": ("Series A", SERIES[0]),
                                            "b": ("Series B", SERIES[1])})


def training_body() -> None:
    r = section("training", [t_refs["a"], t_refs["b"]], t_values,
                tplots.barriers_over_training, "Barriers over training")
    if r is None:
        return
    e = r["extra"]
    left = [f"{len(e[k])} step(s) only in {e[s_]}" for k, s_ in (("only_a", "series_a"),
                                                                   ("only_b", "series_b"))
            if e[k]]
    st.caption(f"{len(r['x'])} common steps on {r['n']} test samples"
               + (f"; left out: {'; '.join(left)}." if left else "."))


if wanted("training", t_run):
    run.guard(training_body)

# ---- 2. against the spawn step ---------------------------------------------------------------

st.header("2. Instability against the spawn step", anchor="spawn")
st.markdown(
    "A spawn folder holds `spawn-<k>/a/` and `spawn-<k>/b/`: the two children copied from "
    "the parent at step *k* and trained to the end in different data orders. Children "
    "spawned at the last step are the parent itself, twice: their barrier is 0."
)
k_run, k_refs, k_values = form("spawn", {"folder": ("Spawn folder", SPAWN)})


def spawn_body() -> None:
    r = section("spawn", [k_refs["folder"]], k_values, tplots.instability_by_spawn_step,
                "Spawn instability")
    if r is not None:
        st.caption(f"Spawn steps {', '.join(map(str, r['x']))}, on {r['n']} test samples.")


if wanted("spawn", k_run):
    run.guard(spawn_body)

"""Landscape: the loss around and between the two models, beyond the straight line.

Four sections, each a registered measurement run through the app's cache
(`runtime.compute(name, app.measure_cfg(...))`), its widgets drawn from the record's
parameters: a slice around the anchor or any point of the pair (with a random plane beside
its gauge-fixed twin), a trained curved path with its bend on the A/B/B' plane, layer-wise
barriers and the Hessian's top eigenvalues. Nothing computes
before its Run is pressed (first paint stays cheap), and the defaults here are small (an
11 x 11 grid, few training steps) so that a first Run answers in seconds on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

from app_pages import run, runtime, show, sidebar
from rotviz import app
from rotviz.app.export import measurement_files
from rotviz.app.specs import SPEC_CHOICES
from rotviz.limits import MAX_LAYERS_TEXT
from rotviz.measures import measurement
from rotviz.plots import barrier as bplots
from rotviz.plots import curves as cplots
from rotviz.plots import slices as splots
from rotviz.plots import style

# Section defaults that differ from the records' (CLI) defaults: small, for a quick first Run.
SMALL = {
    "slice": {"grid": 11},
    "bend": {"steps": 50, "points": 11},
    "layerwise": {"points": 5},
    "hessian": {"iterations": 20, "examples": 128},
}
PLANE_GRID = 11  # the A/B/B' plane under the curved path

s = sidebar.setup()
st.title("The loss landscape around and between the models")
st.markdown(
    "The Barrier page walks the straight line from the anchor **A** to the source. This page "
    "looks around it: the loss on a random plane through A, a *curved* path to the matched "
    "source **B'** whose bend is trained to avoid the barrier, which layers make the "
    "barrier, and how sharp the minimum at A is. Each section computes only when you press "
    "its **Run**."
)

offered, _ = run.offered_specs(s, SPEC_CHOICES)
pair_choices = [sp for sp in offered if sp != "none"] or offered
c = st.columns(2)
spec = c[0].selectbox(
    "Matching for B' (curved path and layer-wise barriers)", pair_choices,
    pair_choices.index("seed") if "seed" in pair_choices else 0, format_func=style.nice_label,
    key="l_spec", bind="query-params",
    help="How the source is moved inside its symmetry class before the curved path and the "
         "layer-wise barriers are measured, and B' for a slice around B' (or the path, or the "
         "merge) or toward B'. The Hessian is of the anchor alone.")
layers = c[1].text_input("Layers to match (empty = all)", "", key="l_layers",
                         max_chars=MAX_LAYERS_TEXT, bind="query-params")


READY = run.require_pair(s)  # checked once; each section then says nothing more about it


def section_form(name: str, skip: tuple[str, ...] = ()) -> tuple[bool, dict[str, Any]]:
    """A form with the record's parameters (the section's small defaults) and a Run button;
    returns whether Run was pressed and the values."""
    record = measurement(name)
    with st.form(f"l_{name}_form"):
        cols = st.columns(4)
        shown = [p for p in record.parameters() if p.name not in skip]
        values = {p.name: show.param_input(cols[i % 4], p, f"l_{name}_{p.name}",
                                             SMALL.get(name, {}).get(p.name))
                  for i, p in enumerate(shown)}
        submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:",
                                          key=f"l_{name}_run")
    return submitted, values


def wanted(name: str, submitted: bool) -> bool:
    return run.section_wanted(f"land_{name}", submitted)


def run_section(name: str, submitted: bool, body: Callable[[], None]) -> None:
    """The section's body when it is wanted, each in its own guard: one failing section
    says why and leaves the others working."""
    if wanted(name, submitted):
        run.guard(body)


def cfg_of(values: dict, pair: bool = True) -> dict:
    """The measurement's configuration: with the page's matching for a pair measurement,
    without for one of the anchor alone."""
    return app.measure_cfg(s.base(), spec if pair else "none", layers if pair else "",
                           **values)


def table_of(name: str, result: dict) -> None:
    tables, _ = measurement_files(name, result)
    for rows in tables.values():
        with st.expander("Table", icon=":material/table:"):
            show.table(rows)


# ---- 1. a slice around a point ----------------------------------------------------------------

st.header("1. A slice around the anchor, or any point of the pair", anchor="slice")
st.markdown(
    "Two seeded directions through a centre: the anchor **A**, the source **B**, the "
    "matched source **B'**, a point of the matched path, or the merged model (the last "
    "three use the matching chosen above). The directions are random, the sharpest Hessian "
    "eigenvectors, the line toward B' (or B), the symmetry tangents (along which the "
    "function does not change) or gauge-fixed random directions (the tangents removed). "
    "Each is scaled to the weights' own size: filter by filter (Li et al., 2018), or unit "
    "by unit (an FFN neuron's rows and column, a head's Q, K, V rows and O columns), which "
    "does not depend on which member of the symmetry class is sliced. The star is the "
    "centre; a wide, low valley around it is a flat minimum. Turn on the log scale when a "
    "wall hides the basin."
)
slice_run, slice_values = section_form("slice")
log = st.toggle("Log colour scale (log10 of the loss)", False, key="l_log", bind="query-params")
CENTRE_WORDS = {"anchor": "the anchor", "source": "the source B", "matched": "B'",
                "path": "the point of the matched path", "merged": "the merged model"}


def slice_cfg(values: dict) -> dict:
    """The slice's configuration: with the page's matching when the values use the source
    (the record says which: its `source` check), of the anchor alone otherwise."""
    return cfg_of(values, pair=bool(measurement("slice").source(values)))


def slice_body() -> None:
    cfg = slice_cfg(slice_values)
    where = CENTRE_WORDS.get(slice_values["around"], "the centre")
    with show.progress("Slicing", 1, stop="land_slice") as step:
        g = slice_values["grid"]
        step(f"{g} x {g} grid around {where}" if slice_values["dims"] == 2
             else f"{g} points around {where}")
        result = runtime.compute("slice", cfg, step.detail)
    fig = splots.slice_figure(result, log=log, font_size=s.font, acc_range=s.acc_axis())
    show.chart(fig, "land_slice")
    st.caption(f"Centre: {where}, test loss {result['centre_loss']:.4f} nats (accuracy "
               f"{result['centre_acc']:.3f}). Axes are in direction units: 1 moves each "
               "filter (or unit) by its own norm."
               + ("" if result.get("target_loss") is None else
                  f" The target's own loss: {result['target_loss']:.4f} nats.")
               + ("" if result.get("tangent_cosine") is None else
                  f" Largest |cosine| of a direction with a symmetry tangent: "
                  f"{result['tangent_cosine']:.2g}."))
    table_of("slice", result)
    tables, _ = measurement_files("slice", result)
    show.export("slice", {"page": "landscape", **cfg, "log": log}, result, tables,
                  {"slice": fig})


if READY:
    run_section("slice", slice_run, slice_body)

st.subheader("A random plane beside a gauge-fixed plane", anchor="gauge")
st.markdown(
    "The same seeded random plane through the slice's centre (its centre, normalisation, "
    "grid, span and seed above), drawn twice on one colour scale: as drawn, and gauge-fixed, "
    "with every direction along which a symmetry moves the weights (the tangents of the "
    "head rotations and, for gated or ReLU FFNs, the neuron rescalings) projected out.")
with st.form("l_gauge_form"):
    gauge_run = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:",
                                      key="l_gauge_run")


def gauge_body() -> None:
    base = {**slice_values, "dims": 2, "iterations": 100, "toward": "matched"}
    cfgs = {d: slice_cfg({**base, "directions": d}) for d in ("random", "gauge")}
    with show.progress("Random and gauge-fixed planes", 2, stop="land_gauge") as step:
        g = base["grid"]
        step(f"the random plane, {g} x {g}")
        plain = runtime.compute("slice", cfgs["random"], step.detail)
        step(f"the gauge-fixed plane, {g} x {g} (the symmetry tangents first)")
        fixed = runtime.compute("slice", cfgs["gauge"], step.detail)
    fig = splots.slice_panels(
        [plain, fixed], ["random plane", "gauge-fixed plane"], log=log, font_size=s.font,
        title="Test loss on a random plane and on its gauge-fixed twin, one colour scale")
    show.chart(fig, "land_gauge")
    st.caption(
        "Left: the random plane. Right: the same draw with its component along every "
        "symmetry tangent at the centre removed (then rescaled to the same length), so that "
        "every step on it changes the function: the flat directions that only move the "
        "weights inside their symmetry class are gone. Largest |cosine| of a gauge-fixed "
        f"direction with any tangent: {fixed['tangent_cosine']:.2g}. Same seed, grid and "
        "colour scale; what differs between the panels is what the symmetry explains.")
    tables = {f"{k}_plane": measurement_files("slice", r)[0].get("slice", [])
              for k, r in (("random", plain), ("gauge", fixed))}
    show.export("slice_gauge", {"page": "landscape", **cfgs["gauge"], "log": log},
                  {"random": plain, "gauge": fixed}, tables, {"slice_gauge": fig})


if READY:
    run_section("gauge", gauge_run, gauge_body)

# ---- 2. a curved path, its bend on the A/B/B' plane -------------------------------------------

st.header("2. A curved path from A to B'", anchor="bend")
st.markdown(
    "Garipov et al. (2018) found that two minima the straight line separates by a barrier "
    "are often joined by a simple *curve*. Here a quadratic Bezier curve (or a two-segment "
    "chain) from A to the matched source B' gets one movable bend, trained with Adam on the "
    "training split; the curve is then evaluated on the test split beside the straight "
    "line. The bend is drawn on the A/B/B' plane, with its distance from that plane: the "
    "colours under the curve are the plane's loss, not the loss the curve meets when the "
    "bend lies far off the plane."
)
bend_run, bend_values = section_form("bend")


def bend_body() -> None:
    with show.progress("Curved path", 2, stop="land_bend") as step:
        step(f"{style.nice_label(spec)}: matching, then {bend_values['steps']} training steps")
        bend = runtime.compute("bend", cfg_of(bend_values), step.detail,
                              run.stopper())
        step(f"the A/B/B' plane: {PLANE_GRID} x {PLANE_GRID} grid")
        plane = runtime.compute("plane", cfg_of({"grid": PLANE_GRID,
                                                         "seed": s.base()["seed"]}),
                               step.detail)
    fig_loss = cplots.bend_curves(bend, "loss", s.font)
    show.chart(fig_loss, "land_bend_loss")
    better = bend["barrier"] < bend["line_barrier"]
    (st.success if better else st.info)(
        f"Barrier along the {cplots.KIND_NAMES.get(bend['kind'], bend['kind'])}: "
        f"{bend['barrier']:.3f} nats; along the straight line: {bend['line_barrier']:.3f} "
        f"nats. The bend lies {bend['off_plane']:.3f} parameter units off the A/B/B' plane "
        f"({bend['steps']} training steps"
        + ("" if bend["stopped"] == "steps" else f", stopped: {bend['stopped']}") + ").",
        icon=":material/trending_down:" if better else ":material/info:")
    fig_plane = bplots.loss_plane(plane["xs"], plane["ys"], plane["loss"], plane["points"],
                                  s.font)
    cplots.bend_on_plane(fig_plane, bend)
    show.chart(fig_plane, "land_bend_plane")
    st.caption("The dashed line is the curve projected onto the plane, the star its bend. "
               "Far off the plane, the colours under the dashed line are not the loss the "
               "curve meets: read that from the chart above.")
    tables, _ = measurement_files("bend", bend)
    table_of("bend", bend)
    show.export("bend", {"page": "landscape", **cfg_of(bend_values)}, {"bend": bend,
                  "plane": plane}, tables, {"bend_loss": fig_loss, "bend_on_plane": fig_plane})


if READY:
    run_section("bend", bend_run, bend_body)

# ---- 3. layer-wise barriers -------------------------------------------------------------------

st.header("3. Which layers make the barrier", anchor="layerwise")
st.markdown(
    "Adilova et al. (2024): move one block (or one kind of module) from A to B' while the "
    "rest stays at A, and measure the barrier of that path alone. Beside it, the same "
    "without matching, and the cumulative path (block after block), whose last bar is the "
    "full straight line."
)
lw_run, lw_values = section_form("layerwise")


def layerwise_body() -> None:
    with show.progress("Layer-wise barriers", 1, stop="land_layerwise") as step:
        step(f"{style.nice_label(spec)}: matching, then one group at a time")
        result = runtime.compute("layerwise", cfg_of(lw_values), step.detail)
    tables, figs = measurement_files("layerwise", result)
    for key, fig in figs.items():
        fig.update_yaxes(title_text="loss barrier (nats above the end points' line)")
        show.chart(fig, f"land_layerwise_{key}")
    table_of("layerwise", result)
    show.export("layerwise", {"page": "landscape", **cfg_of(lw_values)}, result, tables,
                  figs)


if READY:
    run_section("layerwise", lw_run, layerwise_body)

# ---- 4. the Hessian's top eigenvalues --------------------------------------------------------

st.header("4. How sharp the anchor's minimum is", anchor="hessian")
st.markdown(
    "The largest eigenvalues of the Hessian of the test loss at the anchor (Lanczos on "
    "Hessian-vector products): the curvature along the steepest directions. Larger means a "
    "sharper minimum. Per group splits the parameters by block or by module kind."
)
h_run, h_values = section_form("hessian")


def hessian_body() -> None:
    from rotviz.plots.hessian import density_plot, eigenvalue_bars

    with show.progress("Curvature", 1, stop="land_hessian") as step:
        step(f"top {h_values['top']} eigenvalues, {h_values['iterations']} Lanczos steps at "
             "most")
        result = runtime.compute("hessian", cfg_of(h_values, pair=False),
                                step.detail)
    figs = {"hessian_top": eigenvalue_bars(result, s.font)}
    if result.get("density"):
        figs["hessian_density"] = density_plot(result, s.font)
    # the library's axis label is longer than the chart is tall: the same unit, shorter
    figs["hessian_top"].update_yaxes(title_text="eigenvalue (nats per parameter unit²)")
    for key, fig in figs.items():
        show.chart(fig, f"land_{key}")
    top = ", ".join(f"{v:.4g}" for v in result["eigenvalues"])
    trace, se = result.get("trace"), result.get("trace_se")
    se = "n/a (one probe)" if se is None else f"{se:.2g}"  # one probe: no spread, no error
    st.caption(f"Top eigenvalues, largest first: {top}."
               + (f" Trace {trace:.4g} ± {se} (Hutchinson, standard error)."
                  if isinstance(trace, float) else ""))
    if result.get("converged") is False:  # beside the numbers it qualifies
        st.warning(f"Not converged (residual {result['residual']:.2g}): these are Ritz values "
                   "short of the Hessian's eigenvalues; raise the Lanczos steps.")
    table_of("hessian", result)
    tables, _ = measurement_files("hessian", result)
    show.export("hessian", {"page": "landscape", **cfg_of(h_values, pair=False)}, result,
                  tables, figs)


if READY:
    run_section("hessian", h_run, hessian_body)

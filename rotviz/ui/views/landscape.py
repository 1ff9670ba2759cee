"""Landscape: the loss around and between the two models, beyond the straight line.

Its sections are the records that declare one on this page (rotviz.measures' `Section`:
the slice, the trained bend, layer-wise barriers, the Hessian's top eigenvalues), composed
by rotviz/ui/section.py with the page's matching; the page adds what no record holds: a
random plane beside its gauge-fixed twin, and the bend drawn on the A/B/B' plane. Nothing
computes before its Run is pressed (first paint stays cheap), and the sections' defaults are
small (an 11 x 11 grid, few training steps) so that a first Run answers in seconds on a CPU.
"""

from __future__ import annotations

import streamlit as st

from rotviz import app
from rotviz.app import figures
from rotviz.app.export import measurement_files
from rotviz.measures import Measurement, measurement
from rotviz.measures.registry import matched
from rotviz.plots.figure_style import Style
from rotviz.ui import run, runtime, section, show, sidebar

PLANE_GRID = 11  # the A/B/B' plane under the curved path

s = sidebar.setup()
st.title("The loss landscape around and between the models")
st.markdown(
    "The Barrier page walks the straight line from the anchor **A** to the source. This page "
    "looks around it: the loss on a random plane through A, a *curved* path to the matched "
    "source **B'** whose bend is trained to avoid the barrier, which layers make the "
    "barrier, how sharp the minimum at A is, and how moving A along its symmetry orbit "
    "(*teleporting*) changes that sharpness while the loss stays put. Each section computes "
    "only when you press its **Run**."
)

spec, layers = run.pair_matching(
    s, "l", "Matching for B' (curved path and layer-wise barriers)", "seed",
    "How the source is moved inside its symmetry class before the curved path and the "
    "layer-wise barriers are measured, and B' for a slice around B' (or the path, or the "
    "merge) or toward B'. The Hessian and teleportation are of the anchor alone.")


READY = run.require_pair(s)  # checked once; each section then says nothing more about it


def cfg_of(record: Measurement, values: dict, refs: list[str] | None = None,
           spec_: str | None = None) -> dict:
    """A section's configuration: with the page's matching when the run measures the pair
    (`matched`: a pair record, or a slice whose values use the source), of the anchor alone
    otherwise."""
    pair = matched(record, values)
    return app.measure_cfg(s.base(), spec if pair else "none", layers if pair else "",
                           **values)


def gauge(drawn: section.Drawn) -> None:
    """The slice's random plane beside its gauge-fixed twin (two slice runs, one figure)."""
    st.subheader("A random plane beside a gauge-fixed plane", anchor="gauge")
    st.markdown(
        "The same seeded random plane through the slice's centre (its centre, normalisation, "
        "grid, span and seed above), drawn twice on one colour scale: as drawn, and "
        "gauge-fixed, with every direction along which a symmetry moves the weights (the "
        "tangents of the head rotations and, for gated or ReLU FFNs, the neuron rescalings) "
        "projected out.")
    with st.form("l_gauge_form"):
        pressed = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:",
                                        key="l_gauge_run")
    if READY and run.section_wanted("l_gauge", pressed):
        run.guard(lambda: gauge_body(drawn))


def gauge_body(drawn: section.Drawn) -> None:
    record = measurement("slice")
    base = {**drawn.values, "dims": 2, "iterations": 100, "toward": "matched"}
    cfgs = {d: cfg_of(record, {**base, "directions": d}) for d in ("random", "gauge")}
    with show.progress("Random and gauge-fixed planes", 2, stop="l_gauge") as step:
        g = base["grid"]
        step(f"the random plane, {g} x {g}")
        plain = runtime.compute("slice", cfgs["random"], step.detail)
        step(f"the gauge-fixed plane, {g} x {g} (the symmetry tangents first)")
        fixed = runtime.compute("slice", cfgs["gauge"], step.detail)
    fig = figures.slice_panels(
        [plain, fixed], ["random plane", "gauge-fixed plane"],
        "Test loss on a random plane and on its gauge-fixed twin, one colour scale",
        drawn.style)
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
    show.export("slice_gauge", {"page": "landscape", **cfgs["gauge"], "log": drawn.style.log},
                {"random": plain, "gauge": fixed}, tables, {"slice_gauge": fig})


def bend_plane(record: Measurement, values: dict, bend: dict, style: Style
               ) -> tuple[dict, dict, dict]:
    """Under the bend's curves: how it compares with the straight line, and the curve on
    the A/B/B' plane (the plane record, computed for it)."""
    better = bend["barrier"] < bend["line_barrier"]
    (st.success if better else st.info)(
        f"Barrier along the {figures.curve_name(bend['kind'])}: {bend['barrier']:.3f} nats; "
        f"along the straight line: {bend['line_barrier']:.3f} nats. The bend lies "
        f"{bend['off_plane']:.3f} parameter units off the A/B/B' plane ({bend['steps']} "
        "training steps" + ("" if bend["stopped"] == "steps" else
                            f", stopped: {bend['stopped']}") + ").",
        icon=":material/trending_down:" if better else ":material/info:")
    with show.progress("The A/B/B' plane", 1, stop="l_bend_plane") as step:
        step(f"{PLANE_GRID} x {PLANE_GRID} grid")
        plane = runtime.compute("plane", cfg_of(measurement("plane"), {
            "grid": PLANE_GRID, "seed": s.base()["seed"]}), step.detail)
    fig = figures.bend_on_plane(plane, bend, style)
    show.chart(fig, "land_bend_plane")
    st.caption("The dashed line is the curve projected onto the plane, the star its bend. "
               "Far off the plane, the colours under the dashed line are not the loss the "
               "curve meets: read that from the chart above.")
    return {"plane": plane}, {"bend_on_plane": fig}, {}


section.compose("landscape", s, "l", section.Hooks(
    cfg=cfg_of, extend={"bend": bend_plane}, after={"slice": gauge}, ready=READY))

"""Barrier: loss along the straight path from anchor to matched source, per matching option,
and the 2D loss plane through A, B and B'."""

import streamlit as st

from app_pages import run, runtime, show, sidebar
from rotviz import app
from rotviz.app import summaries
from rotviz.app.specs import DEFAULT_SPECS, SPEC_CHOICES
from rotviz.errors import RotvizError
from rotviz.limits import MAX_LAYERS_TEXT
from rotviz.measures.barrier import BARRIER
from rotviz.measures.plane import PLANE
from rotviz.plots import barrier as bplots
from rotviz.plots import slices, style

s = sidebar.setup()
st.title("Loss barriers between the two models")
st.markdown(
    "Walk in a straight line from the anchor (α = 0) to the source (α = 1) and measure the "
    "test loss on the way. Two unrelated models have a **barrier**: a bump in the middle, "
    "where the average of their weights is a bad model. Matching the source first (moving it "
    "inside its symmetry class, without changing what it computes) often lowers the bump; "
    "below the table, the page says what each matching did on this pair."
)

offered, residual_why = run.offered_specs(s, SPEC_CHOICES)

with st.form("barrier_form"):
    specs = st.multiselect(
        "Matching options to compare", offered,
        [sp for sp in DEFAULT_SPECS if sp in offered],
        format_func=style.nice_label, key="b_specs", bind="query-params",
        help="Drawn by default: no matching, the seed paper's method and weight matching. Add "
             "the seed paper's ablation (FFN only, attention only, both without rescale), "
             "head permutation, the residual stream (weight "
             "matching = seed + heads + residual), and matching from data: activation matching and "
             "learned matching (it trains: opt-in).",
    )
    if residual_why is not None:
        st.caption(f"Residual stream options are not offered for this pair: {residual_why}.")
    c = st.columns(3)
    points = show.param_input(c[0], BARRIER.parameters()[0], "b_points", app.BARRIER_POINTS)
    layers = c[1].text_input("Layers to match (empty = all)", "", key="b_layers",
                             max_chars=MAX_LAYERS_TEXT, bind="query-params")
    steps = int(c[1].number_input(
        "Learned matching: at most this many steps", 5, 3000, app.DEFAULT_LEARN_STEPS,
        step=25, key="b_steps", bind="query-params",
        help=f"Only for learned matching, which trains on the training split of {s.data} and "
             "keeps the last maps unless their validation barrier is higher than weight "
             "matching's."))
    plane = c[2].toggle("Also draw the 2D loss plane (slower)", False, key="b_plane",
                        bind="query-params")
    grid = show.param_input(c[2], PLANE.parameters()[0], "b_grid", 13)
    plane_choices = offered[1:]
    plane_spec = c[2].selectbox("Plane: matching for B'", plane_choices,
                                plane_choices.index("seed"), format_func=style.nice_label,
                                key="b_plane_spec", bind="query-params")
    submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")


@st.fragment
def at_alpha(curves: list[dict]) -> None:
    """A slider over the computed curves: no recomputation."""
    alphas = curves[0]["alphas"]
    i = st.select_slider("Inspect the model at α", options=list(range(len(alphas))),
                         value=len(alphas) // 2, format_func=lambda j: f"{alphas[j]:.2f}",
                         key="b_alpha", bind="query-params")
    cols = st.columns(len(curves))
    for col, c in zip(cols, curves, strict=True):
        col.metric(style.nice_label(c["match"]), f"{c['acc'][i]:.3f}",
                   delta=f"loss {c['loss'][i]:.3f} nats", delta_color="off", delta_arrow="off",
                   help="test accuracy (fraction correct) of the model at this α; below it the "
                        "test loss")
        for k, values in (c.get("scores") or {}).items():
            col.caption(f"{style.metric_label(k)} {values[i]:.3f}", help=style.metric_help(k))


def animated(curves: list[dict]):
    """The path as an animation (the barrier record's `animate`): the loss curve growing as
    α moves, beside the answers on a few fixed test inputs. One matching at a time."""
    st.subheader("The path, animated")
    names = [c["match"] for c in curves]
    pick = st.selectbox("Animate the path of", names, len(names) - 1,
                        format_func=style.nice_label, key="b_anim",
                        help="Press ▶ play under the chart; the slider steps through α.")
    fig = BARRIER.animate(curves[names.index(pick)])
    st.caption(summaries.path_note(curves[names.index(pick)]))
    show.animation(fig, "barrier_anim", f"barrier-path-{pick.replace(',', '-')}")
    return fig


# The summary table's columns: short headers (the table fits the page at 1280 px, sidebar
# open), each explained on hover; the export keeps the long names and the SPEC.
COLUMNS = {
    "matching": st.column_config.TextColumn("matching", help="the matching option"),
    "barrier": st.column_config.NumberColumn(
        "barrier", format="%.4f", help="largest rise of the test loss above the straight line "
                                       "between the end points (nats)"),
    "loss range": st.column_config.NumberColumn(
        "loss range", format="%.4f", help="max − min of the test loss on the path (nats): "
                                          "the seed paper's barrier"),
    "loss at α=0.5": st.column_config.NumberColumn(
        "loss α=½", format="%.4f", help="test loss of the average of the two (α = 0.5)"),
    "accuracy at α=0.5": st.column_config.NumberColumn(
        "acc. α=½", format="%.4f", help="test accuracy of the average of the two (α = 0.5)"),
    "distance before": st.column_config.NumberColumn(
        "dist. before", format="%.2f", help="Euclidean distance source → anchor before matching"),
    "distance after": st.column_config.NumberColumn(
        "dist. after", format="%.2f", help="Euclidean distance source → anchor after matching"),
    "max logit diff": st.column_config.NumberColumn(
        "logit diff", format="%.1e", help="largest logit difference, source vs matched source "
                                          "(the function check)"),
    "function preserved": st.column_config.CheckboxColumn(
        "preserved", help="function preserved: the logit difference is within the tolerance"),
}


def summary_table(rows: list[dict]) -> None:
    """The per-matching summary as a table that fits the page (the SPEC column is left to
    the export)."""
    st.dataframe([{k: v for k, v in r.items() if k != "spec"} for r in rows], hide_index=True,
                 column_config=COLUMNS)


def body() -> None:
    from rotviz.match.pipeline import FUNCTION_TOLERANCE

    if not run.require_pair(s):
        return
    if not specs:
        st.warning("Pick at least one matching option.")
        return
    if not run.should_run("barrier", submitted, s):
        st.info("Press **Run** to compute the curves.")
        return
    base = {**s.base(), "layers": layers.strip()}
    curves = []
    with show.progress("Interpolating", len(specs) + (1 if plane else 0),
                         stop="barrier") as step:
        live, note = st.empty(), st.empty()  # the loss chart, drawn as the curves come in
        try:
            for i, sp in enumerate(specs):
                cfg = app.measure_cfg(s.base(), sp, layers, steps, points=points,
                                      **BARRIER.animate_params)
                fresh = not runtime.is_cached("barrier", cfg)
                step(f"{style.nice_label(sp)}: matching, then {points} points on the path")
                curves.append(runtime.compute("barrier", cfg, step.detail))
                if fresh and i < len(specs) - 1:  # computed now, and more to come: show it
                    with live:
                        show.chart(bplots.barrier_curves(curves, "loss", s.font),
                                     f"barrier_loss_{i}")
                    note.caption(f"{len(curves)} of {len(specs)} matching options so far; "
                                 "the others are being computed.")
        except RotvizError:  # the box above says what failed; no chart of part of a run
            live.empty()
            note.empty()
            raise
        pl = None
        if plane:
            step(f"loss plane: {grid} x {grid} grid")
            pl = runtime.compute("plane", app.measure_cfg(s.base(), plane_spec, layers, steps,
                                                         grid=grid, seed=s.base()["seed"]),
                                step.detail)
    fig_loss = bplots.barrier_curves(curves, "loss", s.font)
    fig_acc = bplots.barrier_curves(curves, "acc", s.font, acc_range=s.acc_axis())
    note.empty()
    with live:
        show.chart(fig_loss, "barrier_loss")
    st.caption(summaries.loss_note(curves[0]) + " Dotted vertical segments mark each "
               "barrier: the largest rise of the loss above the straight line between the two "
               "end points (the generalized-LMC definition). The table also gives the loss "
               "range (max − min on the path), the seed paper's number.")
    rows = [{
        "matching": style.nice_label(c["match"]), "spec": c["match"],
        "barrier": c["barrier"], "loss range": c["loss_range"], "loss at α=0.5": c["mid_loss"],
        "accuracy at α=0.5": c["mid_acc"], "distance before": c["distance_before"],
        "distance after": c["distance_after"], "max logit diff": c["max_output_diff"],
        "function preserved": c["preserved"],
    } for c in curves]
    summary_table(rows)
    verdict = summaries.barrier_verdict(curves)
    if verdict is not None:
        say, icon = {"lowered": (st.success, ":material/trending_down:"),
                      "raised": (st.warning, ":material/trending_up:"),
                      "mixed": (st.info, ":material/info:")}[verdict["kind"]]
        say(verdict["text"] + ("" if verdict["kind"] == "lowered" else
             "\n\nData-free matching of independently trained models often closes distance "
             "more than it closes the barrier; a pair that shares more (for example two "
             "fine-tunes of one base) usually shows a clearer drop."), icon=icon)
    worst = max((c["max_output_diff"] or 0.0) for c in curves)
    show.function_badge(worst, FUNCTION_TOLERANCE, "matched source (every option)")
    show.chart(fig_acc, "barrier_acc")
    at_alpha(curves)
    anim = animated(curves)
    figures = {"barrier_loss": fig_loss, "barrier_accuracy": fig_acc}
    if pl is not None:
        st.subheader("The loss plane")
        st.markdown(
            "A 2D slice of parameter space through the anchor **A**, the source **B** and the "
            "matched source **B'**. B and B' compute the same function (same loss), but B' "
            "lies closer to A, and the midpoint AB' sits lower than AB. Axes are true "
            "Euclidean distances."
        )
        fig_plane = bplots.loss_plane(pl["xs"], pl["ys"], pl["loss"], pl["points"], s.font)
        fig_surface = slices.loss_surface(pl, font_size=s.font)
        flat, deep = st.tabs(["Contour (from above)", "3D surface (drag to turn)"])
        with flat:
            show.chart(fig_plane, "barrier_plane")
        with deep:
            st.caption("The same grid as a surface: height is the test loss. A, B, B' and the "
                       "midpoints sit at their own exact losses.")
            show.chart(fig_surface, "barrier_plane_3d")
        st.dataframe([{"point": k, "loss": pl["point_loss"][k], "accuracy": pl["point_acc"][k]}
                      for k in pl["points"]], hide_index=True)
        figures["loss_plane"] = fig_plane
        figures["loss_plane_3d"] = fig_surface
    tables = {"curves": [{"spec": c["match"], "alpha": a, "loss": lo, "acc": ac}
                         for c in curves
                         for a, lo, ac in zip(c["alphas"], c["loss"], c["acc"], strict=True)],
              "summary": rows}
    show.export("barrier", {"page": "barrier", **base, "specs": specs, "points": points,
                              "plane": plane, "grid": grid, "plane_spec": plane_spec,
                              "learn_steps": steps},
                  {"curves": curves, "plane": pl}, tables, figures, {"barrier_path": anim})


run.guard(body)

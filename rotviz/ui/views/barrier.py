"""Barrier: loss along the straight path from anchor to matched source, per matching option,
and the 2D loss plane through A, B and B'.

Its sections are the records that declare one on this page (rotviz.measures: the barrier,
run once per matching picked, and the plane), composed by rotviz/ui/section.py; the page
adds what no record holds: the matchings, layers and step budget in the barrier's form, the
summary table with its verdict, the model at any α, the animated path, and the plane's
table of the marked points.
"""

import streamlit as st

from rotviz import app
from rotviz.app import figures, summaries
from rotviz.app.specs import DEFAULT_SPECS, SPEC_CHOICES
from rotviz.limits import MAX_LAYERS_TEXT
from rotviz.measures import Measurement
from rotviz.measures.barrier import BARRIER
from rotviz.plots.figure_style import Style
from rotviz.ui import run, section, show, sidebar

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


def barrier_fields() -> dict:
    """The page's own widgets in the barrier's form: the matchings to compare, the layers
    to match and the learned matching's step budget."""
    specs = st.multiselect(
        "Matching options to compare", offered,
        [sp for sp in DEFAULT_SPECS if sp in offered],
        format_func=figures.nice_label, key="b_specs", bind="query-params",
        help="Drawn by default: no matching, the seed paper's method and weight matching. Add "
             "the seed paper's ablation (FFN only, attention only, both without rescale), "
             "head permutation, the residual stream (weight "
             "matching = seed + heads + residual), and matching from data: activation matching "
             "and learned matching (it trains: opt-in).",
    )
    if residual_why is not None:
        st.caption(f"Residual stream options are not offered for this pair: {residual_why}.")
    c = st.columns(2)
    layers = c[0].text_input("Layers to match (empty = all)", "", key="b_layers",
                             max_chars=MAX_LAYERS_TEXT, bind="query-params")
    steps = int(c[1].number_input(
        "Learned matching: at most this many steps", 5, 3000, app.DEFAULT_LEARN_STEPS,
        step=25, key="b_steps", bind="query-params",
        help=f"Only for learned matching, which trains on the training split of {s.data} and "
             "keeps the last maps unless their validation barrier is higher than weight "
             "matching's."))
    return {"matchings": specs, "layers": layers, "learn_steps": steps}


def plane_fields() -> dict:
    """The plane's matching for B' (any but none: B' must differ from B)."""
    choices = offered[1:]
    return {"spec": st.selectbox("Matching for B'", choices, choices.index("seed"),
                                 format_func=figures.nice_label, key="b_plane_spec",
                                 bind="query-params")}


def cfg_of(record: Measurement, values: dict, refs: list[str], spec: str | None) -> dict:
    """A section's configuration: the matching (each of the barrier's, or the plane's), the
    layers and step budget of the barrier's form, and what the path's animation needs."""
    values = dict(values)
    layers, steps = values.pop("layers", ""), values.pop("learn_steps", 0)
    if spec is None:  # the plane: its own matching, the barrier form's layers and steps
        spec = values.pop("spec")
        layers, steps = BARRIER_FORM.get("layers", ""), BARRIER_FORM.get("learn_steps", 0)
        values["seed"] = s.base()["seed"]
    return app.measure_cfg(s.base(), spec, layers, steps, **values)


@st.fragment
def at_alpha(curves: list[dict]) -> None:
    """A slider over the computed curves: no recomputation."""
    alphas = curves[0]["alphas"]
    i = st.select_slider("Inspect the model at α", options=list(range(len(alphas))),
                         value=len(alphas) // 2, format_func=lambda j: f"{alphas[j]:.2f}",
                         key="b_alpha", bind="query-params")
    cols = st.columns(len(curves))
    for col, c in zip(cols, curves, strict=True):
        col.metric(figures.nice_label(c["match"]), f"{c['acc'][i]:.3f}",
                   delta=f"loss {c['loss'][i]:.3f} nats", delta_color="off", delta_arrow="off",
                   help="test accuracy (fraction correct) of the model at this α; below it the "
                        "test loss")
        for k, values in (c.get("scores") or {}).items():
            col.caption(f"{figures.metric_label(k)} {values[i]:.3f}", help=figures.metric_help(k))


def animated(curves: list[dict]):
    """The path as an animation (the barrier record's `animate`): the loss curve growing as
    α moves, beside the answers on a few fixed test inputs. One matching at a time."""
    st.subheader("The path, animated")
    names = [c["match"] for c in curves]
    pick = st.selectbox("Animate the path of", names, len(names) - 1,
                        format_func=figures.nice_label, key="b_anim",
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


def about_curves(record: Measurement, values: dict, result: dict, style: Style
                 ) -> tuple[dict, dict, dict]:
    """Under the barrier's figures: the loss note, the summary table and what it says, the
    model at any α, and the path animated."""
    curves = result["runs"]
    st.caption(summaries.loss_note(curves[0]) + " Dotted vertical segments mark each "
               "barrier: the largest rise of the loss above the straight line between the two "
               "end points (the generalized-LMC definition). The table also gives the loss "
               "range (max − min on the path), the seed paper's number.")
    rows = [{
        "matching": figures.nice_label(c["match"]), "spec": c["match"],
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
    at_alpha(curves)
    animated(curves)
    return {}, {}, {"summary": rows}


def about_plane(record: Measurement, values: dict, pl: dict, style: Style
                ) -> tuple[dict, dict, dict]:
    """The marked points' own losses and accuracies, under the plane."""
    st.dataframe([{"point": k, "loss": pl["point_loss"][k], "accuracy": pl["point_acc"][k]}
                  for k in pl["points"]], hide_index=True)
    return {}, {}, {}


BARRIER_FORM: dict = {}  # the barrier form's values, which the plane's run takes too


def remember(drawn: section.Drawn) -> None:
    BARRIER_FORM.update(drawn.values)


section.compose("barrier", s, "b", section.Hooks(
    cfg=cfg_of, ready=run.require_pair(s),
    fields={"barrier": barrier_fields, "plane": plane_fields},
    extend={"barrier": about_curves, "plane": about_plane},
    after={"barrier": remember}, keys={"barrier": "b"}))

"""Match: choose the symmetries and layers, see how far matching brings the source."""

import streamlit as st

from rotviz import app
from rotviz.app import figures, summaries
from rotviz.app.specs import (
    ABLATION_CHOICES,
    WHY_UNCHANGED,
    offered,
    spec_label,
    uses_residual,
    without_residual,
)
from rotviz.limits import MAX_LAYERS_TEXT
from rotviz.measures.barrier import BARRIER
from rotviz.symmetry.registry import BY_NAME, SYMMETRIES
from rotviz.ui import run, runtime, show, sidebar

s = sidebar.setup()
LEARNED_NAMES = {"residual": "the residual map", "qk": "every head's Q-K rotation",
                 "vo": "every head's V-O rotation"}
# learned matching's steps from the maps of this form (weight matching's, say): the library's
# default (rotviz.limits.DEFAULT_STEPS) is for a start from activation matching, much closer
LEARN_FROM_MAPS = 300
POINTS = 21  # the Barrier page's default: the two pages share these curves in the cache
st.title("Match the source onto the anchor")
st.markdown(
    "Matching searches the source's symmetry class for the copy closest to the anchor "
    "(smallest Euclidean distance between all weights), one layer at a time: the best "
    "permutation of FFN neurons (a linear assignment), the best rotation of every attention "
    "head (an orthogonal Procrustes problem), and the best rescaling of each head. "
    "The matched source computes exactly what the source computes."
)

SOLVERS = {"none": "no: from the weights alone", "act": "activation matching",
           "learned": "learned matching (trains)", "act,learned": "activations, then learned"}
residual_why = runtime.residual_why(s.anchor) if s.anchor else None
data_why = run.unscored_why(s)  # matching from data needs a loss

with st.form("match_form"):
    st.markdown("**Per-layer maps** (the seed paper's three, and head permutation)")
    on: dict[str, bool] = {}  # one toggle per data-free symmetry of the registry
    layer_maps = [m for m in SYMMETRIES if not m.needs_data and m.scope == "layer"]
    stream_maps = [m for m in SYMMETRIES if not m.needs_data and m.scope == "stream"]
    for col, m in zip(st.columns(len(layer_maps)), layer_maps, strict=True):
        needs = ", ".join(BY_NAME[r].label for r in m.requires)
        on[m.name] = col.toggle(m.label[:1].upper() + m.label[1:], m.default, key=f"m_{m.name}",
                                bind="query-params", help=f"Needs {needs}." if needs else None)
        col.caption(m.why)
    st.markdown("**Beyond the seed paper**: the residual stream, and matching from data")
    c = st.columns(3)
    for m in stream_maps:
        on[m.name] = c[0].toggle(
            f"{m.label[:1].upper() + m.label[1:]} of the stream", m.default, key=f"m_{m.name}",
            bind="query-params", disabled=residual_why is not None,
            help="Alternates with the per-layer maps until the distance stops shrinking "
                 "(weight matching = the seed paper's three + this).")
        c[0].caption(m.why if residual_why is None else
                     f"Not available for this pair: {residual_why}.")
    solver = c[1].selectbox("Use data", list(SOLVERS), format_func=SOLVERS.get, key="m_solver",
                            bind="query-params", disabled=data_why is not None,
                            help=f"Trains on the training split of {s.data}. Here learned "
                                 "matching starts from the maps switched on above (the command "
                                 "line's `learned` alone starts from activation matching, which "
                                 "needs far fewer steps).")
    c[1].caption(f"Not available for this pair: {data_why}." if data_why is not None else
                 WHY_UNCHANGED["learned"] + " It tunes the rotations switched on here: "
                 "every head's, and the residual map's when that is on."
                 if "learned" in solver else WHY_UNCHANGED["act"])
    steps = int(c[2].number_input(
        "Learned matching: at most this many steps", 5, 3000, LEARN_FROM_MAPS,
        step=25, key="m_steps", bind="query-params",
        help=f"Adam steps on the maps. From weight matching's maps the default pair needs a "
             f"few hundred (tens of seconds on a laptop CPU); from activation matching "
             f"{app.DEFAULT_LEARN_STEPS} are enough."))
    layers = st.text_input("Layers to match (empty = all; e.g. 0,2-3)", "", key="m_layers",
                           max_chars=MAX_LAYERS_TEXT, bind="query-params")
    replay = st.checkbox(
        "Replay weight matching round by round (an animation: distance and barrier after "
        "each round; it matches once more)", False, key="m_rounds", bind="query-params",
        help="Only for a matching with the residual stream, whose alternation has rounds.")
    with_barrier = st.checkbox("Measure the loss barrier of each option in the ablation "
                               f"({POINTS} points on the path each, shared with the Barrier page)",
                               True, key="m_barrier", bind="query-params")
    submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")


def chosen_spec() -> str:
    """The SPEC of the form, with the residual map left out (and said so) when the pair has
    none."""
    flags = [name for name, chosen in on.items() if chosen]
    if solver != "none" and data_why is not None:  # from the URL: the widget is off
        st.warning(f"Matching from data is not available for this pair: {data_why}. "
                   "Matching from the weights alone instead.", icon=":material/info:")
    elif solver != "none":
        flags += solver.split(",")
    spec = spec_label(",".join(flags) or "none")
    if residual_why is not None and uses_residual(spec):
        spec = without_residual(spec)
        st.warning(f"Residual stream matching is not available for this pair: {residual_why}. "
                   f"Matching with {figures.nice_label(spec)} instead.", icon=":material/info:")
    return spec


def beyond(res: dict) -> tuple[dict, dict]:
    """What the residual map, activation matching and learned matching did, when they ran.
    Returns the figures and tables drawn, for the export."""
    from rotviz.match.alternating import ended_by_cap
    from rotviz.symmetry.residual import GROUP_TEXT

    rep = res["report"]
    figs, tables = {}, {}
    res_info, act, learned = rep.get("residual"), rep.get("act"), rep.get("learned")
    if res_info:
        st.subheader("The residual stream")
        left, right = st.columns([2, 3])
        m = left.columns(2)
        m[0].metric("residual group", res_info["group"], help=GROUP_TEXT.get(res_info["group"]))
        m[1].metric("alternation rounds", res_info["rounds"],
                    help="rounds of (per-layer maps, then the residual map), until a round "
                         "gains little, the time budget runs out or the round cap is reached "
                         "(the caption below says which)")
        d0, d1 = res_info["distance_canonical_before"], res_info["distance_canonical_after"]
        left.metric("distance between canonical forms", f"{d1:.3f}", delta=f"{d1 - d0:+.3f}",
                    delta_color="inverse",
                    help="Both models with their norm gains folded into the readers (and, for "
                         "LayerNorm, their writers centred): the distance the alternation "
                         "minimises.")
        ended = res_info.get("ended")
        if isinstance(ended, str):  # reports before the stopping rule kept a list
            left.caption(f"Stopped ({ended}): {summaries.ENDED.get(ended, ended)}. The first "
                         f"round earned {100 * res_info.get('first_share', 0.0):.1f}% of the "
                         "gain.")
        rounds_rows = summaries.round_rows(res)
        if rounds_rows:
            fig_rounds = figures.round_history(rounds_rows, s.style())
            with right:
                show.chart(fig_rounds, "match_rounds_history")
            figs["round_history"] = fig_rounds
            tables["rounds"] = rounds_rows
        group = GROUP_TEXT.get(res_info["group"]) or res_info["group"]
        st.caption(f"Group: {group}. Each step "
                   "solves one kind of map exactly with the others held fixed, and keeping the "
                   "old map is always one of its choices, so the distance can only go down. "
                   + ("The round cap ended it while rounds still gained a little; more rounds "
                      "lower the distance further, but not always the barrier."
                      if ended_by_cap(res_info) else ""))
        rows = summaries.objective_rows(res)
        fig_obj = figures.objective_history(rows, s.style())
        fig_ang = figures.angle_spectrum({"residual map (weight matching)": res_info["angles"]},
                                         s.style())
        show.chart(fig_obj, "match_objective")
        ok = summaries.never_increases([r["objective"] for r in rows])
        st.caption(("✓ never went up" if ok else "✗ went up at some step (please report)")
                   + f": {rows[0]['objective']:.2f} → {rows[-1]['objective']:.2f} in "
                   f"{len(rows) - 1} steps.")
        show.chart(fig_ang, "match_angles")
        st.caption("How far the residual map turns the stream: the angles of its eigenvalues "
                   "e^(±iθ), which come in pairs. All 0° would be the identity; 180° flips a "
                   "direction.")
        figs.update(objective=fig_obj, residual_angles=fig_ang)
        tables["objective"] = rows
    if act:
        st.subheader("Activation matching")
        st.caption(f"Activations of both models on {act['examples']} {act['split']} examples "
                   f"of {act['data']}.")
        if act.get("ffn_corr_before"):
            fig = figures.ffn_correlation(act["ffn_corr_before"], act["ffn_corr_after"],
                                          rep["options"].get("layers"), s.style())
            show.chart(fig, "match_act_corr")
            figs["act_ffn_correlation"] = fig
        if act.get("residual_angles"):
            fig = figures.angle_spectrum({"residual map (activation matching)":
                                          act["residual_angles"]}, s.style(),
                                        "Residual map from activations: eigen-angle spectrum")
            show.chart(fig, "match_act_angles")
            figs["act_residual_angles"] = fig
    if learned:
        st.subheader("Learned matching")
        m = st.columns(4)
        m[0].metric("validation barrier", f"{learned['val_barrier']:.3f}",
                    delta=f"{learned['val_barrier'] - learned['val_barrier_start']:+.3f}",
                    delta_color="inverse",
                    help="nats above the straight line, on the validation split; the start is "
                         "the data-free matching it began from")
        m[1].metric("steps run", learned["steps"])
        m[2].metric("maps kept from step", learned["best_step"])
        m[3].metric("seconds", f"{learned['seconds']:.1f}")
        names = [LEARNED_NAMES.get(n, n) for n in learned["learned"]] or ["nothing"]
        tuned = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        st.markdown(f"It stopped because {summaries.stop_reason(learned)}. It tuned {tuned}, "
                    "starting from data-free matching, and kept the maps with the lowest "
                    "validation barrier.")
        rows = summaries.learned_rows(res)
        fig = figures.learn_history(rows, learned["best_step"], s.style())
        show.chart(fig, "match_learned")
        figs["learned_history"] = fig
        tables["learned"] = rows
    return figs, tables


def rounds(base: dict, spec: str):
    """Weight matching replayed round by round (the rounds record), animated."""
    from rotviz.measures.rounds import RECORD

    st.subheader("Weight matching, round by round")
    with show.progress("Replaying the rounds", 1) as step:
        step("matching again, measuring each round")
        r = runtime.compute("rounds", app.measure_cfg(base, spec, base.get("layers", ""),
                                                     steps, points=5), step.detail)
    fig = RECORD.animate(r)
    st.caption(f"After each round: the distance to the anchor and the barrier on "
               f"{len(r['alphas'])} points of the path. The last round is the matched source "
               f"above (largest parameter difference {r['last_round_diff']:.1e}).")
    show.animation(fig, "match_rounds_anim", f"rounds-{spec.replace(',', '-')}")
    return fig


def _head_columns() -> dict:
    """Short headers for the per-head table (it fits the page at 1280 px, sidebar open),
    each explained on hover."""
    out = {}
    for kind, name in (("qk", "QK"), ("vo", "VO")):
        out |= {
            f"{kind}_singular_sum": st.column_config.NumberColumn(
                f"{name} σ sum", format="%.3f",
                help=f"sum of the singular values of the {name} cross matrix"),
            f"{kind}_mean_angle_deg": st.column_config.NumberColumn(
                f"{name} angle°", format="%.1f",
                help=f"mean rotation angle of the {name} map (degrees)"),
            f"{kind}_det": st.column_config.NumberColumn(
                f"{name} det", format="%.2f", help=f"determinant of the {name} map: -1 is a "
                                                  "reflection"),
            f"{kind}_scale": st.column_config.NumberColumn(
                f"{name} scale", format="%.3f", help=f"the {name} rescaling of the head"),
        }
    out["ffn_moved"] = st.column_config.NumberColumn(
        "FFN moved", help="FFN neurons of this layer the permutation moved")
    return out


HEAD_COLUMNS = _head_columns()


def body() -> None:
    if not run.require_pair(s, loss=False):  # matching reads the weights: any head
        return
    if not run.should_run("match", submitted, s):
        st.info("Press **Run** to match this pair.")
        return
    scored = run.pair_scored(s)  # else no barrier: matching and distances only
    barriers = with_barrier and scored
    if (with_barrier or replay) and not scored:
        st.caption(":material/info: No loss barriers here: no loss scores this pair (the "
                   "Models page says what each head allows), so the ablation and the replay "
                   "measure distances only.")
    spec = chosen_spec()
    base = {**s.base(), "layers": layers.strip()}
    specs = offered(ABLATION_CHOICES, residual_why)
    if spec not in specs:
        specs.append(spec)
    with show.progress("Matching", 1 + len(specs) * (2 if barriers else 1),
                         stop="match") as step:
        step(f"matching with {figures.nice_label(spec)}")
        res = runtime.compute("match", {**base, **app.spec_cfg(spec, steps)}, step.detail)
        ablation = []
        for sp in specs:
            cfg = {**base, **app.spec_cfg(sp, steps)}
            step(f"ablation: {figures.nice_label(sp)}")
            r = runtime.compute("match", cfg, step.detail)
            row = {"match": sp, "distance": r["after_total"],
                   "max_output_diff": r["max_output_diff"], "preserved": r["preserved"]}
            if barriers:
                step(f"barrier: {figures.nice_label(sp)}")
                cur = runtime.compute("barrier", app.measure_cfg(
                    base, sp, base.get("layers", ""), steps, points=POINTS,
                    **BARRIER.animate_params), step.detail)
                row.update(barrier=cur["barrier"], mid_acc=cur["mid_acc"])
            ablation.append(row)
    st.subheader(f"Result: {figures.nice_label(spec)}")
    show.function_badge(res["max_output_diff"], res["tolerance"])
    rep = res.get("report", {})
    if rep.get("stored_output_diff") is not None:  # a half checkpoint: checked as stored too
        show.function_badge(rep["stored_output_diff"], rep["stored_tolerance"],
                              f"matched source in {rep['stored_dtype']} (the checkpoint's dtype)")
    m = st.columns(3)
    m[0].metric("distance before", f"{res['before_total']:.3f}",
                help=figures.distance_words() + " between source and anchor")
    m[1].metric("distance after", f"{res['after_total']:.3f}",
                delta=f"{res['after_total'] - res['before_total']:+.3f}", delta_color="inverse")
    rel = 1 - res["after_total"] / res["before_total"] if res["before_total"] else 0.0
    m[2].metric("closer by", f"{100 * rel:.1f} %")
    rep = res["report"]
    fig_layer = figures.distance_bars(rep["distance_before"]["per_layer"],
                                      rep["distance_after"]["per_layer"], "layer", s.style())
    fig_kind = figures.distance_bars(rep["distance_before"]["per_kind"],
                                     rep["distance_after"]["per_kind"], "kind", s.style())
    t1, t2 = st.tabs(["per layer", "per module kind"])
    with t1:
        show.chart(fig_layer, "match_layer")
    with t2:
        show.chart(fig_kind, "match_kind")
    figs, tables = beyond(res)
    anims = {}
    data_free = not any(f in spec.split(",") for f in ("act", "learned"))
    if replay and scored and data_free and (rep.get("residual") or {}).get("rounds"):
        anims["rounds"] = rounds(base, spec)
    st.subheader("Ablation: what each option buys")
    st.caption("Each bar matches the source with one option set (all layers chosen above). "
               "Lower is better. The barrier is the loss bump on the straight path between the "
               "anchor and the matched source, above the line between the end points.")
    fig_ab = figures.ablation_bars(ablation, s.style())
    show.chart(fig_ab, "match_ablation")
    for row in ablation:
        if not row["preserved"]:
            st.error(f"{figures.nice_label(row['match'])}: function check failed "
                     f"({row['max_output_diff']:.2e})")
    heads = summaries.head_rows(res)
    with st.expander("Per layer and head: what matching did"):
        if heads:  # the SPEC is the subheader's; the export keeps it in every row
            st.dataframe([{k: v for k, v in h.items() if k != "spec"} for h in heads],
                         hide_index=True, column_config=HEAD_COLUMNS)
        else:
            st.write("No attention matching in this option set.")
    show.export("match", {"page": "match", **base, **app.spec_cfg(spec, steps)},
                  {"match": res, "ablation": ablation},
                  {"distances": summaries.distance_rows(res), "heads": heads, "ablation": ablation,
                   **tables},
                  {"distance_per_layer": fig_layer, "distance_per_kind": fig_kind,
                   "ablation": fig_ab, **figs}, anims)


run.guard(body)

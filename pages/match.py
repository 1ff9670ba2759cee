"""Match: choose the symmetries and layers, see how far matching brings the source."""

import streamlit as st

from pages import common
from rotviz import explore
from rotviz.matchspec import label_of
from rotviz.plots import distances as dplots
from rotviz.plots import style

s = common.setup()
POINTS = 21  # the Barrier page's default: the two pages share these curves in the cache
st.title("Match the source onto the anchor")
st.markdown(
    "Matching searches the source's symmetry class for the copy closest to the anchor "
    "(smallest Euclidean distance between all weights), one layer at a time: the best "
    "permutation of FFN neurons (a linear assignment), the best rotation of every attention "
    "head (an orthogonal Procrustes problem), and the best rescaling of each head. "
    "The matched source computes exactly what the source computes."
)

with st.form("match_form"):
    c = st.columns(3)
    ffn = c[0].toggle("FFN permutation", True, key="m_ffn", bind="query-params")
    c[0].caption(explore.WHY_UNCHANGED["ffn"])
    attn = c[1].toggle("Attention rotation", True, key="m_attn", bind="query-params")
    c[1].caption(explore.WHY_UNCHANGED["attn"])
    rescale = c[2].toggle("Rescale heads", True, key="m_rescale", bind="query-params")
    c[2].caption(explore.WHY_UNCHANGED["rescale"])
    layers = st.text_input("Layers to match (empty = all; e.g. 0,2-3)", "", key="m_layers",
                           bind="query-params")
    with_barrier = st.checkbox("Measure the loss barrier of each option in the ablation "
                               f"({POINTS} points on the path each, shared with the Barrier page)",
                               True, key="m_barrier", bind="query-params")
    submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")


def body() -> None:
    if not common.require_pair(s):
        return
    if not common.should_run("match", submitted, s):
        st.info("Press **Run** to match this pair.")
        return
    from rotviz.matching import MatchOptions

    spec = label_of(MatchOptions(ffn=ffn, attn=attn, rescale=rescale)) if (ffn or attn or rescale) \
        else "none"
    base = {**s.base(), "layers": layers.strip()}
    specs = list(explore.BARRIER_SPECS)
    with common.progress("Matching", 1 + len(specs) * (2 if with_barrier else 1)) as step:
        step(f"matching with {style.nice_label(spec)}")
        res = common.compute("match", {**base, "spec": spec})
        ablation = []
        for sp in specs:
            step(f"ablation: {style.nice_label(sp)}")
            r = common.compute("match", {**base, "spec": sp})
            row = {"match": sp, "distance": r["after_total"],
                   "max_output_diff": r["max_output_diff"], "preserved": r["preserved"]}
            if with_barrier:
                step(f"barrier: {style.nice_label(sp)}")
                cur = common.compute("curve", {**base, "spec": sp, "points": POINTS})
                row.update(barrier=cur["barrier"], mid_acc=cur["mid_acc"])
            ablation.append(row)
    st.subheader(f"Result: {style.nice_label(spec)}")
    common.function_badge(res["max_output_diff"], res["tolerance"])
    m = st.columns(3)
    m[0].metric("distance before", f"{res['before_total']:.3f}",
                help=style.DISTANCE + " between source and anchor")
    m[1].metric("distance after", f"{res['after_total']:.3f}",
                delta=f"{res['after_total'] - res['before_total']:+.3f}", delta_color="inverse")
    rel = 1 - res["after_total"] / res["before_total"] if res["before_total"] else 0.0
    m[2].metric("closer by", f"{100 * rel:.1f} %")
    rep = res["report"]
    fig_layer = dplots.distance_bars(rep["distance_before"]["per_layer"],
                                     rep["distance_after"]["per_layer"], "layer", s.font)
    fig_kind = dplots.distance_bars(rep["distance_before"]["per_kind"],
                                    rep["distance_after"]["per_kind"], "kind", s.font)
    t1, t2 = st.tabs(["per layer", "per module kind"])
    with t1:
        common.chart(fig_layer, "match_layer")
    with t2:
        common.chart(fig_kind, "match_kind")
    st.subheader("Ablation: what each option buys")
    st.caption("Each bar matches the source with one option set (all layers chosen above). "
               "Lower is better. The barrier is the loss bump on the straight path between the "
               "anchor and the matched source, above the line between the end points.")
    fig_ab = dplots.ablation_bars(ablation, s.font)
    common.chart(fig_ab, "match_ablation")
    for row in ablation:
        if not row["preserved"]:
            st.error(f"{style.nice_label(row['match'])}: function check failed "
                     f"({row['max_output_diff']:.2e})")
    heads = explore.head_rows(res)
    with st.expander("Per layer and head: what matching did"):
        if heads:
            st.dataframe(heads, hide_index=True)
        else:
            st.write("No attention matching in this option set.")
    common.export("match", {"page": "match", **base, "spec": spec},
                  {"match": res, "ablation": ablation},
                  {"distances": explore.distance_rows(res), "heads": heads, "ablation": ablation},
                  {"distance_per_layer": fig_layer, "distance_per_kind": fig_kind,
                   "ablation": fig_ab})


common.guard(body)

"""Learn: a guided demo of weight-space symmetry, in short plain-language steps."""

import numpy as np
import streamlit as st

from pages import common
from rotviz import appconfig
from rotviz.plots import learn as lplots

s = common.setup()
st.title("Learn: same function, different weights")
st.markdown(
    "A neural network is a long list of numbers (its *weights*). Surprisingly, many different "
    "lists compute **exactly the same thing**. This demo shows it in four steps on the anchor "
    "model from the sidebar."
)

KINDS = {
    "rotate": "Rotate every attention head",
    "permute": "Shuffle the FFN neurons",
    "all": "Both, plus rescaling",
}

with st.form("learn_form"):
    c = st.columns(4)
    kind = c[0].radio("What to do to the model", list(KINDS), format_func=KINDS.get, key="l_kind",
                      bind="query-params")
    demo_seed = int(c[1].number_input("Random seed of the transformation", 0, 9999, 0,
                                      key="l_seed", bind="query-params"))
    layer = int(c[2].number_input("Layer to look at", 0, 63, 0, key="l_layer",
                                  bind="query-params"))
    head = int(c[3].number_input("Head to look at", 0, 63, 0, key="l_head", bind="query-params"))
    submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")


def body() -> None:
    if not common.require_pair(s):
        return
    if not common.should_run("learn", submitted, s):
        st.info("Press **Run** to start the demo.")
        return
    cfg = {"ref": s.anchor, "data": s.data, "seed": s.seed, "n_eval": s.n_eval, "kind": kind,
           "demo_seed": demo_seed, "layer": layer, "head": head}
    with common.progress("Preparing the demo", 1) as step:
        step("transforming, checking and matching back")
        d = common.compute("learn", cfg)
    w = d["weights"]
    what = (f"the query weights W_Q of head {d['head']} in layer {d['layer']}" if kind != "permute"
            else f"the input weights of the first 24 FFN neurons in layer {d['layer']}")
    name = appconfig.short_name(s.anchor)

    st.header("1 · The original model")
    st.markdown(f"**{name}** gets {100 * d['acc']['original']:.1f} % of its test predictions "
                f"right. Here are {what}, one coloured square per number:")
    fig1 = lplots.weight_heatmaps({"original": w["original"]}, f"Original: {what}", s.font)
    common.chart(fig1, "learn_w1")

    st.header("2 · Scramble it")
    if kind == "rotate":
        st.markdown(
            "Every head turns its queries and keys by the same random rotation R. Attention "
            "compares queries with keys by a dot product, and rotating both sides by R leaves "
            "every dot product the same. Values and outputs get a rotation and its inverse."
        )
    elif kind == "permute":
        st.markdown(
            "The FFN's hidden neurons are put in a random new order. Each neuron's incoming and "
            "outgoing weights move together, and the layer adds all neurons up, so the order "
            "does not matter: like shuffling the terms of a sum."
        )
    else:
        st.markdown(
            "Both at once, in every layer, plus a rescaling: one head's queries are multiplied "
            "by a number a and its keys divided by a (a·b/a = b)."
        )
    fig2 = lplots.weight_heatmaps({"original": w["original"], "scrambled": w["scrambled"]},
                                  f"Before and after: {what}", s.font)
    common.chart(fig2, "learn_w2")
    st.markdown(f"The weights look completely different: all weights together moved by "
                f"**{d['distance_scrambled']:.2f}** (Euclidean distance).")

    st.header("3 · Did anything change? No.")
    fig3 = lplots.logit_scatter(d["logits"]["original"], d["logits"]["scrambled"], s.font,
                                "scrambled model")
    common.chart(fig3, "learn_logits")
    st.markdown(
        f"Each dot is one output score (logit) for one of {len(d['logits']['original'])} test "
        f"examples: all lie on the diagonal. The scrambled model gets "
        f"{100 * d['acc']['scrambled']:.1f} % right, exactly like the original. The only "
        "differences are rounding in the last digits of 32-bit arithmetic."
    )
    common.function_badge(max(d["diff_scrambled"], d["probe_diff_scrambled"]), d["tolerance"],
                          "scrambled model")
    if np.asarray(d["logits"]["original"]).ndim == 2:  # classifiers: one prediction each
        preds = {k: np.asarray(v).argmax(-1)[:12].tolist() for k, v in d["logits"].items()}
        st.markdown("Predicted classes of the first 12 examples: original "
                    f"`{preds['original']}`, scrambled `{preds['scrambled']}`.")

    st.header("4 · Matching undoes it")
    st.markdown(
        "Now give matching the scrambled model and the original. It does not know the random "
        "transformation, but it finds it: for each layer it solves for the permutation (a "
        "linear assignment) or the rotation (orthogonal Procrustes) that brings the weights "
        "closest to the original."
    )
    fig4 = lplots.weight_heatmaps(
        {"original": w["original"], "scrambled": w["scrambled"], "matched back": w["matched"]},
        f"Matching recovers the original: {what}", s.font)
    common.chart(fig4, "learn_w4")
    fig5 = lplots.stage_distances([("original", 0.0), ("scrambled", d["distance_scrambled"]),
                                   ("matched back", d["distance_matched"])], s.font)
    common.chart(fig5, "learn_stages")
    common.function_badge(d["diff_matched"], d["tolerance"], "matched-back model")
    st.success(
        f"Matching brought the distance from {d['distance_scrambled']:.2f} back to "
        f"{d['distance_matched']:.1e}. Two models *trained separately* are scrambled relative "
        "to each other in the same way, plus real differences. Matching removes the scramble "
        "part, which is why averaging matched models works better: see **Barrier** and "
        "**Merge**.", icon=":material/lightbulb:")
    figures = {"original": fig1, "scrambled": fig2, "logits": fig3, "matched": fig4,
               "distances": fig5}
    rows = [{"stage": k, "distance": v, "accuracy": d["acc"][a]} for k, v, a in
            (("original", 0.0, "original"), ("scrambled", d["distance_scrambled"], "scrambled"),
             ("matched back", d["distance_matched"], "matched"))]
    common.export("learn", {"page": "learn", **cfg}, d, {"stages": rows}, figures)


common.guard(body)

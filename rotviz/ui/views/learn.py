"""Learn: a guided demo of weight-space symmetry, in short plain-language steps."""

import numpy as np
import streamlit as st

from rotviz.app import figures
from rotviz.app.roots import short_name
from rotviz.ui import run, runtime, show, sidebar

s = sidebar.setup()
st.title("Learn: same function, different weights")
st.markdown(
    "A neural network is a long list of numbers (its *weights*). Surprisingly, many different "
    "lists compute **exactly the same thing**. This demo shows it in five steps on the anchor "
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


def residual_step(r: dict, name: str) -> dict:
    """Step 5: the residual stream can be rotated too. Returns its figures."""
    st.header("5 · The residual stream can be rotated too")
    st.markdown(
        "Inside the model, every layer reads one shared running total of numbers, the "
        "*residual stream*, and adds its own result back to it. Turn the whole stream by one "
        "rotation, and turn the way every layer reads it and writes to it by the same "
        "rotation: again nothing changes, because the two turns cancel."
    )
    if r.get("unsupported"):
        st.info(f"Not for **{name}**: {r['unsupported']}. The other steps above still hold.",
                icon=":material/block:")
        return {}
    st.markdown(
        "First a tidy-up that changes weights but not outputs: each normalisation layer's "
        "gains are moved into the layers that read from it"
        + (", and every layer's writes are shifted to average zero (so the normalisation "
           "sees the same thing)" if r["group"] == "centred" else "")
        + ". Then the stream is turned by a random element of its symmetry group, for this "
        f"model: {r['group_text']}."
    )
    m = st.columns(4)
    m[0].metric("weights moved by tidying up", f"{r['distance_canonical']:.2f}",
                help="Euclidean distance between the original and the tidied model")
    m[1].metric("weights moved by the rotation", f"{r['distance_rotated']:.2f}",
                help="Euclidean distance between the tidied and the rotated model")
    share = r["numbers_changed"] / max(r["numbers_total"], 1)
    m[2].metric("numbers changed by the rotation", f"{100 * share:.1f} %",
                help=f"{r['numbers_changed']:,} of {r['numbers_total']:,} numbers; "
                     f"{len(r['changed'])} of {len(r['changed']) + len(r['unchanged'])} "
                     "weight tensors")
    worst = max(r["diff_rotated"], r["probe_diff_rotated"], r["diff_canonical"],
                r["probe_diff_canonical"])
    m[3].metric("largest logit change", f"{worst:.1e}",
                help="tidied and rotated model vs the original, on test and probe inputs")
    w = r["weights"]
    what = f"W_Q of head {r['head']} in layer {r['layer']}"
    fig_w = figures.weight_heatmaps(
        {"original": w["original"], "tidied": w["canonical"], "stream rotated": w["rotated"],
         "matched back": w["matched"]}, f"The residual stream turned: {what}", s.style())
    show.chart(fig_w, "learn_res_weights")
    st.markdown(
        f"Every column of these weights changed (the columns are the stream's directions). "
        f"Yet the model gets {100 * r['acc']['rotated']:.1f} % right, like the original's "
        f"{100 * r['acc']['original']:.1f} %."
    )
    show.function_badge(worst, r["tolerance"], "tidied and rotated model")
    with st.expander("Which weights did not change?"):
        st.write("Only those that never touch the stream: biases inside heads and FFN "
                 "neurons, norm gains (all 1 after tidying up) and the output bias:")
        st.code("\n".join(r["unchanged"]) or "(none)")
    fig_d = figures.stage_distances(
        [("original", 0.0), ("tidied", r["distance_canonical"]),
         ("stream rotated", r["distance_rotated_original"]),
         ("matched back", r["distance_matched"])], s.style(),
        "The residual stream: how far the weights moved from the original")
    show.chart(fig_d, "learn_res_stages")
    show.function_badge(max(r["diff_matched"], r["probe_diff_matched"]), r["tolerance"],
                          "matched-back model")
    st.success(
        f"Matching with the residual map alone (one Procrustes problem) found the rotation: "
        f"the distance went from {r['distance_rotated_original']:.2f} back to "
        f"{r['distance_matched']:.1e}. Between two separately trained models, this map is "
        "what **weight matching** adds to the seed paper's: see **Match** and **Barrier**.",
        icon=":material/lightbulb:")
    return {"residual_weights": fig_w, "residual_distances": fig_d}


def body() -> None:
    if not run.require_pair(s):
        return
    if not run.should_run("learn", submitted, s):
        st.info("Press **Run** to start the demo.")
        return
    cfg = {"ref": s.anchor, "data": s.data, "seed": s.seed, "n_eval": s.n_eval, "kind": kind,
           "demo_seed": demo_seed, "layer": layer, "head": head}
    with show.progress("Preparing the demo", 2) as step:
        step("transforming, checking and matching back")
        d = runtime.compute("learn", cfg)
        step("rotating the residual stream")
        r = runtime.compute("learn", {**cfg, "kind": "residual"})
    w = d["weights"]
    what = (f"the query weights W_Q of head {d['head']} in layer {d['layer']}" if kind != "permute"
            else f"the input weights of the first 24 FFN neurons in layer {d['layer']}")
    name = short_name(s.anchor)

    st.header("1 · The original model")
    st.markdown(f"**{name}** gets {100 * d['acc']['original']:.1f} % of its test predictions "
                f"right. Here are {what}, one coloured square per number:")
    fig1 = figures.weight_heatmaps({"original": w["original"]}, f"Original: {what}", s.style())
    show.chart(fig1, "learn_w1")

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
    fig2 = figures.weight_heatmaps({"original": w["original"], "scrambled": w["scrambled"]},
                                   f"Before and after: {what}", s.style())
    show.chart(fig2, "learn_w2")
    st.markdown(f"The weights look completely different: all weights together moved by "
                f"**{d['distance_scrambled']:.2f}** (Euclidean distance).")

    st.header("3 · Did anything change? No.")
    fig3 = figures.logit_scatter(d["logits"]["original"], d["logits"]["scrambled"], s.style(),
                                "scrambled model")
    show.chart(fig3, "learn_logits")
    st.markdown(
        f"Each dot is one output score (logit) for one of {len(d['logits']['original'])} test "
        f"examples: all lie on the diagonal. The scrambled model gets "
        f"{100 * d['acc']['scrambled']:.1f} % right, exactly like the original. The only "
        "differences are rounding in the last digits of 32-bit arithmetic."
    )
    show.function_badge(max(d["diff_scrambled"], d["probe_diff_scrambled"]), d["tolerance"],
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
    fig4 = figures.weight_heatmaps(
        {"original": w["original"], "scrambled": w["scrambled"], "matched back": w["matched"]},
        f"Matching recovers the original: {what}", s.style())
    show.chart(fig4, "learn_w4")
    fig5 = figures.stage_distances([("original", 0.0), ("scrambled", d["distance_scrambled"]),
                                    ("matched back", d["distance_matched"])], s.style())
    show.chart(fig5, "learn_stages")
    show.function_badge(d["diff_matched"], d["tolerance"], "matched-back model")
    st.success(
        f"Matching brought the distance from {d['distance_scrambled']:.2f} back to "
        f"{d['distance_matched']:.1e}. Two models *trained separately* are scrambled relative "
        "to each other in the same way, plus real differences. Matching removes the scramble "
        "part, which is why averaging matched models works better: see **Barrier** and "
        "**Merge**.", icon=":material/lightbulb:")
    figs = {"original": fig1, "scrambled": fig2, "logits": fig3, "matched": fig4,
            "distances": fig5, **residual_step(r, name)}
    rows = [{"stage": k, "distance": v, "accuracy": d["acc"][a]} for k, v, a in
            (("original", 0.0, "original"), ("scrambled", d["distance_scrambled"], "scrambled"),
             ("matched back", d["distance_matched"], "matched"))]
    show.export("learn", {"page": "learn", **cfg}, {"demo": d, "residual": r},
                  {"stages": rows}, figs)


run.guard(body)

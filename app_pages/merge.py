"""Merge: fuse the two models with each method, with and without matching first."""

import streamlit as st

from app_pages import common
from rotviz import app
from rotviz.app.specs import MERGE_SPECS, learns, spec_label
from rotviz.merging.registry import all_params
from rotviz.merging.registry import methods as merge_methods
from rotviz.plots import merge as mplots
from rotviz.plots import style

s = common.setup()
st.title("Merge the two models")
st.markdown(
    "Fusing two models into one only works when their neurons and heads line up. Each method "
    "below is run on the raw pair and after matching; the dashed lines are the two original "
    "models. Statistics (Fisher information, Gram matrices) come from the training split, "
    "computed on the matched models."
)
METHODS = {m.name: m for m in merge_methods()}
st.markdown("\n".join(f"- **{m.name}** ({m.label}): {m.help}"
                       + (" (needs a base model)." if m.needs_base else ".")
                       for m in METHODS.values()))

offered, residual_why = common.offered_specs(s, MERGE_SPECS)

with st.form("merge_form"):
    c = st.columns(2)
    methods = c[0].multiselect("Fusion methods", list(METHODS),
                               [n for n, m in METHODS.items() if not m.needs_base],
                               format_func=lambda m: METHODS[m].label, key="g_methods",
                               bind="query-params")
    specs = c[1].multiselect("Matching before fusion", offered, ["none", "seed"],
                             format_func=style.nice_label, key="g_specs", bind="query-params",
                             help="The seed paper's options, head permutation, the residual "
                                  "stream (weight = seed + heads + residual), and matching "
                                  "from data (activation, learned: it trains on the training "
                                  "split).")
    if residual_why is not None:
        c[1].caption(f"Residual stream options are not offered for this pair: {residual_why}.")
    base_ref = st.text_input(
        "Base model of the methods that need one (zoo:NAME or a model folder; empty: none)",
        "", key="g_base", bind="query-params",
        help="The model both were fine-tuned from: task vectors are taken from it. It is never "
             "matched (only the source is), so it must share the anchor's basis.")
    c = st.columns(4)
    weight = c[0].slider("Weight of the source (0 = anchor only, 1 = source only)", 0.0, 1.0,
                         0.5, 0.05, key="g_weight", bind="query-params")
    # every merge method's own parameters, from its record (the seed is the sidebar's)
    shown = [p for p in all_params() if p.name != "seed"]
    params = {p.name: common.param_input(c[1 + i % 2], p, f"g_{p.name}")
              for i, p in enumerate(shown)}
    steps = int(c[3].number_input(
        "Learned matching: at most this many steps", 5, 3000, app.DEFAULT_LEARN_STEPS,
        step=25, key="g_steps", bind="query-params",
        help="Only for learned matching; it keeps the maps with the lowest validation barrier."))
    submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")


def body() -> None:
    if not common.require_pair(s):
        return
    if not specs or not methods:
        st.warning("Pick at least one fusion method and one matching option.")
        return
    based = [METHODS[m].label for m in methods if METHODS[m].needs_base]
    if based and not base_ref.strip():
        st.warning(f"{', '.join(based)} need a base model: give one above, or drop them.")
        return
    if not common.should_run("merge", submitted, s):
        st.info("Press **Run** to fuse the models.")
        return
    labels = [spec_label(sp) for sp in specs]
    cfg = {**s.base(), "methods": methods, "specs": labels, "weight": weight,
           "params": {**params, "seed": s.base()["seed"]}}
    if based:
        cfg["base"] = base_ref.strip()
    if any(learns(sp) for sp in labels):
        cfg["learn_steps"] = steps
    with common.progress("Fusing", 1, stop="merge") as step:
        step(f"{len(methods)} methods x {len(labels)} matching options")
        t = common.compute("fusion", cfg, step.detail)
    scored = t.get("scores") or {}
    rows = [{"method": METHODS[m].label, "matching": sp, "acc": t["acc"][m][sp],
             "loss": t["loss"][m][sp], **(scored.get(m, {}).get(sp) or {}),
             "distance": t["distance"][sp]}
            for m in t["methods"] for sp in t["specs"]]
    refs = {f"anchor ({t['anchor_acc']:.3f})": t["anchor_acc"],
            f"source ({t['source_acc']:.3f})": t["source_acc"]}
    fig = mplots.fusion_chart(rows, "acc", s.font, refs)
    common.chart(fig, "merge_chart")
    f1 = next((k for k in ("entity_f1", "macro_f1") if k in (t.get("anchor_scores") or {})),
              None)
    figs = {"fusion": fig}
    if f1 is not None:  # the seed paper's Table 1 scores merges by F1
        a_f1, s_f1 = t["anchor_scores"][f1], t["source_scores"][f1]
        figs["fusion_f1"] = mplots.fusion_chart(
            rows, f1, s.font, {f"anchor ({a_f1:.3f})": a_f1, f"source ({s_f1:.3f})": s_f1})
        common.chart(figs["fusion_f1"], "merge_chart_f1")
        st.caption(f"{style.metric_label(f1)}: {style.metric_help(f1)}.")
    best = max(rows, key=lambda r: r["acc"])
    st.markdown(f"Best: **{best['method']}** after **{style.nice_label(best['matching'])}**, "
                f"accuracy {best['acc']:.3f} (anchor {t['anchor_acc']:.3f}, source "
                f"{t['source_acc']:.3f}).")
    st.dataframe([{**r, "matching": style.nice_label(r["matching"])} for r in rows],
                 hide_index=True, column_config={
                     k: st.column_config.NumberColumn(format="%.4f")
                     for k in ("acc", "loss", "distance", *style.METRIC_NAMES)})
    st.caption(f"Evaluated on {t['split']} ({s.data}); statistics from the {t['stats_split']} "
               f"split, {t['batches']} x {t['batch_size']} examples; {t['seconds']:.1f} s on "
               f"{t['device']}.")
    checks = [common.compute("match", {**s.base(), "layers": "", **app.spec_cfg(sp, steps)})
              for sp in t["specs"] if sp != "none"]
    if checks:
        worst = max(c["max_output_diff"] for c in checks)
        common.function_badge(worst, checks[0]["tolerance"], "matched source (every option)")
    common.export("merge", {"page": "merge", **cfg}, t, {"fusion": rows}, figs)


common.guard(body)

"""Merge: fuse the two models with each method, with and without matching first; then many
models at once (the registered measurement `many`: N models aligned onto their barycentre,
the merged accuracy against N)."""

import streamlit as st

from app_pages import run, runtime, show, sidebar
from rotviz import app, zoo_registry
from rotviz.app import roots as app_roots
from rotviz.app.export import measurement_files
from rotviz.app.specs import MERGE_SPECS, learns, spec_label
from rotviz.measures import measurement
from rotviz.merging.registry import all_params, sweepable
from rotviz.merging.registry import methods as merge_methods
from rotviz.plots import many as manyplots
from rotviz.plots import merge as mplots
from rotviz.plots import style

s = sidebar.setup()
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

offered, residual_why = run.offered_specs(s, MERGE_SPECS)

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
        "Base model of the methods that need one (zoo:NAME, a model folder or a cached "
        "ORG/NAME[@REVISION]; empty: none)",
        "", key="g_base", bind="query-params",
        help="The model both were fine-tuned from: task vectors are taken from it. It is never "
             "matched (only the source is), so it must share the anchor's basis.")
    c = st.columns(4)
    weight = c[0].slider("Weight of the source (0 = anchor only, 1 = source only)", 0.0, 1.0,
                         0.5, 0.05, key="g_weight", bind="query-params")
    # every merge method's own parameters, from its record (the seed is the sidebar's)
    shown = [p for p in all_params() if p.name != "seed"]
    params = {p.name: show.param_input(c[1 + i % 2], p, f"g_{p.name}")
              for i, p in enumerate(shown)}
    steps = int(c[3].number_input(
        "Learned matching: at most this many steps", 5, 3000, app.DEFAULT_LEARN_STEPS,
        step=25, key="g_steps", bind="query-params",
        help="Only for learned matching; it keeps the last maps unless their validation "
             "barrier is higher than weight matching's."))
    submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:")


def body() -> None:
    if not run.require_pair(s):
        return
    if not specs or not methods:
        st.warning("Pick at least one fusion method and one matching option.")
        return
    based = [METHODS[m].label for m in methods if METHODS[m].needs_base]
    if based and not base_ref.strip():
        st.warning(f"{', '.join(based)} need a base model: give one above, or drop them.")
        return
    if not run.should_run("merge", submitted, s):
        st.info("Press **Run** to fuse the models.")
        return
    labels = [spec_label(sp) for sp in specs]
    cfg = {**s.base(), "methods": methods, "specs": labels, "weight": weight,
           "params": {**params, "seed": s.base()["seed"]}}
    if based:
        cfg["base"] = app_roots.resolve_choice(base_ref)  # as every later read means it
    if any(learns(sp) for sp in labels):
        cfg["learn_steps"] = steps
    with show.progress("Fusing", 1, stop="merge") as step:
        step(f"{len(methods)} methods x {len(labels)} matching options")
        t = runtime.compute("fusion", cfg, step.detail)
    for m, why in (t.get("off") or {}).items():  # a pair read block by block
        st.info(f"**{METHODS[m].label}** is off for this pair: {why}.", icon=":material/memory:")
    scored = t.get("scores") or {}
    rows = [{"method": METHODS[m].label, "matching": sp, "acc": t["acc"][m][sp],
             "loss": t["loss"][m][sp], **(scored.get(m, {}).get(sp) or {}),
             "distance": t["distance"][sp]}
            for m in t["methods"] for sp in t["specs"]]
    refs = {f"anchor ({t['anchor_acc']:.3f})": t["anchor_acc"],
            f"source ({t['source_acc']:.3f})": t["source_acc"]}
    f1 = next((k for k in ("entity_f1", "macro_f1") if k in (t.get("anchor_scores") or {})),
              None)
    f1_refs = {} if f1 is None else {
        f"anchor ({t['anchor_scores'][f1]:.3f})": t["anchor_scores"][f1],
        f"source ({t['source_scores'][f1]:.3f})": t["source_scores"][f1]}
    # accuracy and F1 are read side by side: one scale over both
    shared = mplots.bar_range([r[k] for r in rows for k in ("acc", f1) if k in r]
                              + [*refs.values(), *f1_refs.values()], s.acc_fixed)
    fig = mplots.fusion_chart(rows, "acc", s.font, refs, shared)
    show.chart(fig, "merge_chart")
    figs = {"fusion": fig}
    if f1 is not None:  # the seed paper's Table 1 scores merges by F1
        figs["fusion_f1"] = mplots.fusion_chart(rows, f1, s.font, f1_refs, shared)
        show.chart(figs["fusion_f1"], "merge_chart_f1")
        st.caption(f"{style.metric_label(f1)}: {style.metric_help(f1)}.")
    best = max(rows, key=lambda r: r["acc"])
    st.markdown(f"Best: **{best['method']}** after **{style.nice_label(best['matching'])}**, "
                f"accuracy {best['acc']:.3f} (anchor {t['anchor_acc']:.3f}, source "
                f"{t['source_acc']:.3f}).")
    # the export keeps the keys; on screen each column says what it holds and in what unit
    heads = {"acc": ("accuracy", "test accuracy of the merged model (fraction correct)"),
             "loss": ("loss (nats)", "test loss of the merged model"),
             "distance": ("distance", "Euclidean distance of the (matched) source to the "
                                      "anchor, parameter units")}
    st.dataframe([{**r, "matching": style.nice_label(r["matching"])} for r in rows],
                 hide_index=True, column_config={
                     **{k: st.column_config.NumberColumn(label, format="%.4f", help=why)
                        for k, (label, why) in heads.items()},
                     **{k: st.column_config.NumberColumn(style.metric_label(k), format="%.4f",
                                                         help=style.metric_help(k))
                        for k in style.METRIC_NAMES}})
    st.caption(f"Evaluated on {t['split']} ({s.data}); statistics from the {t['stats_split']} "
               f"split, {t['batches']} x {t['batch_size']} examples; {t['seconds']:.1f} s on "
               f"{t['device']}.")
    checks = t.get("checks") if "checks" in t else [  # at size, each merge's own check
        runtime.compute("match", {**s.base(), "layers": "", **app.spec_cfg(sp, steps)})
        for sp in t["specs"] if sp != "none"]
    if checks:
        worst = max(c["max_output_diff"] for c in checks)
        show.function_badge(worst, checks[0]["tolerance"], "matched source (every option)")
    show.export("merge", {"page": "merge", **cfg}, t, {"fusion": rows}, figs)


run.guard(body)

# ---- one number swept --------------------------------------------------------------------------

st.header("Sweep one number")
st.markdown(
    "How the merged model's accuracy changes as one number of the merge is turned: the "
    "weight of the source, task arithmetic's λ (scale), the density TIES and DARE keep, or "
    "RegMean's α. Every other parameter keeps its value above; one line per matching option."
)
SWEEPABLE = {n: sweepable(m) for n, m in METHODS.items()}
with st.form("merge_sweep_form"):
    c = st.columns(5)
    sw_method = c[0].selectbox("Method", list(METHODS), 0, format_func=lambda m: METHODS[m].label,
                               key="w_method", bind="query-params")
    sw_param = c[1].selectbox("Swept number", list(dict.fromkeys(
        n for v in SWEEPABLE.values() for n in v)), 0, key="w_param", bind="query-params",
        help="Each method sweeps the weight and its own real parameters.")
    sw_start = c[2].number_input("From", -10.0, 10.0, 0.0, 0.05, key="w_start",
                                 bind="query-params")
    sw_stop = c[3].number_input("To", -10.0, 10.0, 1.0, 0.05, key="w_stop", bind="query-params")
    sw_points = int(c[4].number_input("Values", 2, 21, 6, 1, key="w_points",
                                      bind="query-params"))
    swept = st.form_submit_button("Run the sweep", type="primary", icon=":material/play_arrow:")


def sweep() -> None:
    if not run.require_pair(s) or not specs:
        return
    if sw_param not in SWEEPABLE[sw_method]:
        st.warning(f"{METHODS[sw_method].label} sweeps {', '.join(SWEEPABLE[sw_method])}; "
                   f"pick one of those, or another method.")
        return
    if METHODS[sw_method].needs_base and not base_ref.strip():
        st.warning(f"{METHODS[sw_method].label} needs a base model: give one above.")
        return
    if not run.section_wanted("merge_sweep", swept):
        return
    own = {p.name: params[p.name] for p in METHODS[sw_method].params if p.name in params}
    values = {**own, "method": sw_method, "param": sw_param, "start": sw_start,
              "stop": sw_stop, "points": sw_points, "weight": weight,
              "base": app_roots.resolve_choice(base_ref) if METHODS[sw_method].needs_base
              else ""}
    runs = []
    with show.progress("Sweeping", len(specs), stop="merge_sweep") as step:
        for sp in specs:
            step(f"{style.nice_label(sp)}: {sw_points} merges")
            runs.append(runtime.compute("merge_sweep", app.measure_cfg(
                s.base(), sp, "", steps, **values), step.detail))
    fig = mplots.sweep_chart(runs, "acc", s.font, s.acc_axis())
    show.chart(fig, "merge_sweep_chart")
    rows = [{"matching": style.nice_label(r["match"]), sw_param: x, "acc": a, "loss": lo}
            for r in runs for x, a, lo in zip(r["values"], r["acc"], r["loss"], strict=True)]
    st.dataframe(rows, hide_index=True, column_config={
        k: st.column_config.NumberColumn(format="%.4f") for k in ("acc", "loss")})
    show.function_badge(max(r["max_output_diff"] or 0.0 for r in runs),
                          runs[0]["tolerance"], "matched source (every option)")
    show.export("merge_sweep", {"page": "merge", "sweep": values, "specs": specs}, runs,
                  {"sweep": rows}, {"sweep": fig})


run.guard(sweep)

# ---- many models at once -----------------------------------------------------------------------

st.header("Many models at once", anchor="many")
st.markdown(
    "Three or more models of one architecture, aligned into one basis, then averaged: onto the "
    "first model (the anchor), or onto their **barycentre**, the mean refined round by round "
    "(every model matched onto the current mean, the aligned models averaged into the next). "
    "Each aligned model is its original moved by a symmetry, so it computes the same function. "
    "Left: the distance between every two models as given; right: aligned (one colour scale). "
    "Below: the equal-weight mean of the first *k* models, aligned and not, against *k*."
)
MANY = measurement("many")
with st.form("many_form"):
    c = st.columns([2, 1])
    refs_text = c[0].text_area("Models, one per line (the first is the anchor)",
                               "\n".join(f"zoo:{n}" for n in zoo_registry.SEEDS),
                               key="n_refs", bind="query-params")
    many_spec = c[1].selectbox("Matching", ["seed", "weight", "seed,heads"],
                               format_func=style.nice_label, key="n_spec", bind="query-params",
                               help="Data-free matching: the barycentre is a mean of weights, "
                                    "not a model that can be run on data.")
    c = st.columns(3)
    many_values = {p.name: show.param_input(c[i % 3], p, f"n_{p.name}")
                   for i, p in enumerate(MANY.parameters())}
    many_run = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:",
                                     key="n_run")


def many_body() -> None:
    from rotviz.match.pipeline import FUNCTION_TOLERANCE

    refs = [r.strip() for r in refs_text.splitlines() if r.strip()]
    cfg = app.inputs_cfg(s.base(), refs, [many_spec], **many_values)
    with show.progress("Aligning many models", 1, stop="merge_many") as step:
        step(f"{len(refs)} models, matching {style.nice_label(many_spec)}")
        r = runtime.compute("many", cfg, step.detail)
    figs = {"many": manyplots.distance_matrices(r, s.font),
            "many_merged": manyplots.merged_by_count(r, s.font, s.acc_axis())}
    show.chart(figs["many"], "many_matrices")
    show.chart(figs["many_merged"], "many_merged")
    ended = "one pass" if r["to"] == "anchor" else f"{r['rounds']} round(s), {r['ended']}"
    st.caption(f"Mean pairwise distance {r['spread'][0]:.3f} as given, {r['spread'][-1]:.3f} "
               f"aligned ({ended}); on {r['n']} {r['split']} samples, {r['seconds']:.1f} s.")
    show.function_badge(r["max_output_diff"], FUNCTION_TOLERANCE,
                          "every aligned model")
    tables, _ = measurement_files("many", r)
    st.dataframe(tables["many"], hide_index=True)
    show.export("many", {"page": "merge", **cfg}, r, tables, figs)


if run.section_wanted("merge_many", many_run):
    run.guard(many_body)

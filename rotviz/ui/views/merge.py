"""Merge: fuse the two models with each method, with and without matching first (the
fusion table, a record's section: rotviz.measures.fusion), one number of a merge swept,
then many models at once (the registered measurement `many`: N models aligned onto their
barycentre, the merged accuracy against N), and the task vectors of fine-tunes of one base
(`taskvectors`: their cosines flattened and per layer; its references from REFS)."""

import streamlit as st

from rotviz import app, zoo_registry
from rotviz.app import figures
from rotviz.app import roots as app_roots
from rotviz.app.specs import MERGE_SPECS, learns, spec_label
from rotviz.errors import RotvizError
from rotviz.measures import Measurement
from rotviz.measures.merge_sweep import axis_label
from rotviz.merging.registry import methods as merge_methods
from rotviz.merging.registry import sweepable, table_methods
from rotviz.ui import run, section, show, sidebar

# the references each section of inputs opens on (Hooks.refs): task vectors on the zoo's
# fine-tune lineage, a base and the two models fine-tuned from it (a comma list)
REFS = {"taskvectors": {"base": ("Base model", "zoo:vit-digits-base"),
                        "finetuned": ("Fine-tuned models (a comma list)",
                                      "zoo:vit-digits-ft-a, zoo:vit-digits-ft-b")}}

s = sidebar.setup()
st.title("Merge the two models")
METHODS = {m.name: m for m in merge_methods()}
BASE_WORDS = {(True, False): " (needs a base model)", (False, True): " (a base model optional)"}
st.markdown("\n".join(f"- **{m.name}** ({m.label}): {m.help}"
                       + BASE_WORDS.get((m.needs_base, m.base_optional), "")
                       + ("" if m.weighted else "; the weight does not change it") + "."
                       for m in METHODS.values()))

offered, residual_why = run.offered_specs(s, MERGE_SPECS)

c = st.columns(2)
# every method is offered; those picked at first are the library's default table
# (rotviz.merging.registry.table_methods), so that the page opens in seconds
FIRST = table_methods(False)
methods = c[0].multiselect("Fusion methods", list(METHODS), FIRST,
                           format_func=lambda m: METHODS[m].label, key="g_methods",
                           bind="query-params")
specs = c[1].multiselect("Matching before fusion", offered, ["none", "seed"],
                         format_func=figures.nice_label, key="g_specs", bind="query-params",
                         help="The seed paper's options, head permutation, the residual "
                              "stream (weight = seed + heads + residual), and matching "
                              "from data (activation, learned: it trains on the training "
                              "split).")
if residual_why is not None:
    c[1].caption(f"Residual stream options are not offered for this pair: {residual_why}.")
c = st.columns([3, 1])
base_ref = c[0].text_input(
    "Base model of the methods that take one (zoo:NAME, a model folder or a cached "
    "ORG/NAME[@REVISION]; empty: none)",
    "", key="g_base", bind="query-params",
    help="The model both were fine-tuned from: task vectors are taken from it. Needed by "
         + ", ".join(m.label for m in METHODS.values() if m.needs_base) + "; optional for "
         + ", ".join(m.label for m in METHODS.values() if m.base_optional) + " (they merge "
         "about it where one is given). It is never matched (only the source is), so it "
         "must share the anchor's basis.")
steps = int(c[1].number_input(
    "Learned matching: at most this many steps", 5, 3000, app.DEFAULT_LEARN_STEPS,
    step=25, key="g_steps", bind="query-params",
    help="Only for learned matching; it keeps the last maps unless their validation "
         "barrier is higher than weight matching's."))
labels = [spec_label(sp) for sp in specs]


def cfg_of(record: Measurement, values: dict, refs: list[str], spec: str | None) -> dict:
    """A section's configuration under one matching: the page's methods (the fusion table)
    and base (where a chosen method needs one, resolved as every later read means it), the
    learned matching's step budget, the sidebar's seed; many models: the models and their
    one matching from the section's own fields."""
    if record.name in REFS:  # references from the section's own fields, no matching
        listed = [r.strip() for ref in refs for r in ref.split(",") if r.strip()]
        return app.inputs_cfg(s.base(), listed, [], **values)
    if record.inputs is not None:
        values = dict(values)
        models, many_spec = values.pop("models"), values.pop("spec")
        return app.inputs_cfg(s.base(), models, [many_spec], **values)
    # the table runs every method picked that can run: without a base, those that need one
    # are left out (listed under the table), not an error
    runnable = [n for n in methods if base_ref.strip() or not METHODS[n].needs_base]
    mine = {"methods": ",".join(runnable)} if record.name == "fusion" else {}
    if mine and not runnable:
        raise RotvizError("pick at least one fusion method above" if not methods else
                          "every method picked needs a base model: give one above, or pick "
                          "a method that needs none")
    if record.name == "merge_sweep" and not values["param"]:
        raise RotvizError(f"{METHODS[values['method']].label} has no number a sweep can turn "
                          "(no weight, no parameter of its own): pick another method")
    chosen = [METHODS[m] for m in runnable] if mine else [METHODS[values["method"]]]
    if any(m.needs_base for m in chosen) and not base_ref.strip():
        who = ", ".join(m.label for m in chosen if m.needs_base)
        raise RotvizError(f"{who} need(s) a base model: give one above, or drop them")
    takes = any(m.needs_base or m.base_optional for m in chosen)  # optional: where given
    base = app_roots.resolve_choice(base_ref) if takes and base_ref.strip() else ""
    return app.measure_cfg(s.base(), spec, "", steps if learns(spec) else 0,
                           **{**values, **mine, "base": base, "seed": s.base()["seed"]})


def many_fields() -> dict:
    """The many-models section's own inputs: the models, one per line, and the matching."""
    c = st.columns([2, 1])
    text = c[0].text_area("Models, one per line (the first is the anchor)",
                          "\n".join(f"zoo:{n}" for n in zoo_registry.SEEDS),
                          key="n_refs", bind="query-params")
    spec = c[1].selectbox("Matching", ["seed", "weight", "seed,heads"],
                          format_func=figures.nice_label, key="n_spec", bind="query-params",
                          help="Data-free matching: the barycentre is a mean of weights, "
                               "not a model that can be run on data.")
    return {"models": [r.strip() for r in text.splitlines() if r.strip()], "spec": spec}


def grid_rows(result: dict) -> tuple[list[dict], dict[str, list[str]]]:
    """The seed paper's Table 1 over every registered method: a row for each method run, its
    merged accuracy and loss under each matching side by side (before matching: `none`);
    and the methods not run, by why (no base model given, not picked, off at size)."""
    off = result.get("off") or {}
    rows, skipped = [], {}
    for name, m in METHODS.items():
        if name not in result["methods"]:
            why = off.get(name) or ("need a base model: give one above"
                                    if m.needs_base and not base_ref.strip()
                                    else "not picked above")
            skipped.setdefault(why, []).append(m.label)
            continue
        row: dict = {"method": m.label}
        for what, key in (("accuracy", "acc"), ("loss", "loss")):
            for sp in result["specs"]:
                row[f"{what}, {figures.nice_label(sp)}"] = result[key][name].get(sp)
        rows.append(row)
    return rows, skipped


def grid(record: Measurement, values: dict, result: dict, look) -> tuple[dict, dict, dict]:
    """Under the fusion chart: Table 1, every method's row (drawn here; exported too), and
    the methods left out, with why."""
    rows, skipped = grid_rows(result)
    st.subheader("Every method, before and after matching")
    st.caption("Merged test accuracy (fraction correct, 0-1, higher is better) and loss "
               "(cross-entropy, nats, lower is better) of each method under each matching "
               "picked above; *no matching* is the raw pair. Anchor "
               f"{result['anchor_acc']:.3f}, source {result['source_acc']:.3f}.")
    # one table per number, so that every matching's column fits the page's width
    for what in ("accuracy", "loss"):
        st.markdown(f"**{what.capitalize()}**")
        show.table([{"method": r["method"], **{k.split(", ", 1)[1]: v for k, v in r.items()
                                               if k.startswith(what + ", ")}} for r in rows])
    if skipped:
        st.caption("Not run: " + "; ".join(f"{', '.join(who)} ({why})"
                                           for why, who in skipped.items()) + ".")
    return {}, {}, {"fusion_grid": rows}


def sweep_leads() -> dict:
    """The sweep's method and the number it turns, above its form so the second follows the
    first at once: only numbers the method has, the weight only where it changes the merge
    (`sweepable`; a weightless method's weight would draw a flat line)."""
    c = st.columns(2)
    name = c[0].selectbox("Method to sweep", list(METHODS), format_func=lambda m: METHODS[m].label,
                          key="g_merge_sweep_method", bind="query-params",
                          help="The merge method whose number is turned; every other of its "
                               "parameters keeps the value under More options.")
    choices = sweepable(METHODS[name])
    # a method the weight does not change shows no weight widget either
    held = {} if METHODS[name].weighted else {"weight": 0.5}
    if not choices:
        c[1].caption(f"{METHODS[name].label} has no number to sweep: it takes no weight and "
                     "no parameter of its own.")
        return {"method": name, "param": "", **held}
    param = c[1].selectbox("Swept parameter", list(choices),
                           format_func=lambda p: axis_label(name, p),
                           key=f"g_merge_sweep_param_{name}", bind="query-params",
                           help="Only the numbers this method has; the source's weight only "
                                "where it changes the merge.")
    return {"method": name, "param": param, **held}


section.compose("merge", s, "g", section.Hooks(
    cfg=cfg_of, ready=run.require_pair(s), matchings=tuple(labels), refs=REFS,
    fields={"many": many_fields}, keys={"many": "n"}, before={"merge_sweep": sweep_leads},
    extend={"fusion": grid}))


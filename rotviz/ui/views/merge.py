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
from rotviz.merging.registry import methods as merge_methods
from rotviz.ui import run, section, sidebar

# the references each section of inputs opens on (Hooks.refs): task vectors on the zoo's
# fine-tune lineage, a base and the two models fine-tuned from it (a comma list)
REFS = {"taskvectors": {"base": ("Base model", "zoo:vit-digits-base"),
                        "finetuned": ("Fine-tuned models (a comma list)",
                                      "zoo:vit-digits-ft-a, zoo:vit-digits-ft-b")}}

s = sidebar.setup()
st.title("Merge the two models")
METHODS = {m.name: m for m in merge_methods()}
st.markdown("\n".join(f"- **{m.name}** ({m.label}): {m.help}"
                       + (" (needs a base model)." if m.needs_base else ".")
                       for m in METHODS.values()))

offered, residual_why = run.offered_specs(s, MERGE_SPECS)

c = st.columns(2)
methods = c[0].multiselect("Fusion methods", list(METHODS),
                           [n for n, m in METHODS.items() if not m.needs_base],
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
    "Base model of the methods that need one (zoo:NAME, a model folder or a cached "
    "ORG/NAME[@REVISION]; empty: none)",
    "", key="g_base", bind="query-params",
    help="The model both were fine-tuned from: task vectors are taken from it. It is never "
         "matched (only the source is), so it must share the anchor's basis.")
steps = int(c[1].number_input(
    "Learned matching: at most this many steps", 5, 3000, app.DEFAULT_LEARN_STEPS,
    step=25, key="g_steps", bind="query-params",
    help="Only for learned matching; it keeps the last maps unless their validation "
         "barrier is higher than weight matching's."))
labels = [spec_label(sp) for sp in specs]
based = [METHODS[m].label for m in methods if METHODS[m].needs_base]


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
    mine = {"methods": ",".join(methods)} if record.name == "fusion" else {}
    if mine and not methods:
        raise RotvizError("pick at least one fusion method above")
    needs = bool(based) if mine else METHODS[values["method"]].needs_base
    if needs and not base_ref.strip():
        who = ", ".join(based) if mine else METHODS[values["method"]].label
        raise RotvizError(f"{who} need(s) a base model: give one above, or drop them")
    base = app_roots.resolve_choice(base_ref) if needs else ""
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


section.compose("merge", s, "g", section.Hooks(
    cfg=cfg_of, ready=run.require_pair(s), matchings=tuple(labels), refs=REFS,
    fields={"many": many_fields}, keys={"many": "n"}))


"""Models: the pair, what each model is, how good it is, and its functional check."""

import streamlit as st

from app_pages import common
from rotviz.app.roots import card_of, short_name
from rotviz.plots import style

s = common.setup()
st.title("rotviz: the symmetries of transformers")
st.markdown(
    "Two transformers trained apart compute nearly the same function with very different "
    "weights. rotviz moves one of them (the **source**) inside its *symmetry class* "
    "(permuting FFN neurons, rotating and rescaling attention heads: changes that leave every "
    "output the same) until it sits next to the other (the **anchor**). Then averaging the two "
    "works much better. Pick a pair in the sidebar, then visit **Match**, **Barrier**, "
    "**Spectra** and **Merge**; **Learn** is a five-minute guided demo."
)


def body() -> None:
    from rotviz.match.pipeline import FUNCTION_TOLERANCE

    if not common.require_pair(s):
        return
    if s.sized[0]:  # a card evaluates each model whole
        st.info("The model cards evaluate each model whole, so they are off for a pair read "
                "block by block. The Barrier page, the Landscape page's slices and the Merge "
                "page's elementwise methods run on it.", icon=":material/memory:")
        return
    cards = {}
    with common.progress("Checking both models", 2) as step:
        for role, ref in (("anchor", s.anchor), ("source", s.source)):
            step(f"evaluating the {role}")
            cards[role] = common.compute("card", {"ref": ref, "data": s.data, "seed": s.seed,
                                                  "n_eval": s.n_eval})
    st.success("The two models share one architecture: they can be matched, interpolated "
               "and merged.", icon=":material/check:")
    cols = st.columns(2)
    for col, (role, card) in zip(cols, cards.items(), strict=True):
        with col, st.container(border=True):
            st.subheader(f"{role.capitalize()}: {short_name(card['ref'])}")
            scores = card.get("scores") or {}
            m = st.columns(2 + max(1, len(scores)))  # the size moves below when F1 is shown
            acc = card["acc"]
            m[0].metric("test accuracy", "n/a" if acc != acc else f"{acc:.3f}",
                        help=f"fraction of {card['n_eval']} test examples of {s.data} "
                             "predicted right (per token for language models and token "
                             "classifiers, per label for multi-label ones)")
            m[1].metric("test loss", f"{card['loss']:.3f}",
                        help="the head's own loss (cross-entropy in nats; squared error for "
                             "regression)")
            for j, (k, v) in enumerate(scores.items()):
                m[2 + j].metric(f"test {style.metric_label(k)}", f"{v:.3f}",
                                help=style.metric_help(k))
            if not scores:
                m[-1].metric("parameters", f"{card['params']:,}")
            st.caption(f"Task: **{card.get('name', card.get('task', ''))}** (from the "
                       f"model's head) · metrics: {', '.join(card.get('metrics', []))}")
            st.markdown(
                f"**{card['family']}** · {card['n_layers']} layers · width {card['d_model']} · "
                f"{card['n_heads']} heads of size {card['d_head']} · FFN {card['d_ffn']} "
                f"({card['activation']})" + (f" · {card['params']:,} parameters" if scores else "")
            )
            zoo_card = card_of(card["ref"])
            if zoo_card:
                recipe = zoo_card.get("recipe") or {}
                st.caption(
                    f"{zoo_card.get('description', '')}. {recipe.get('description', '')}; "
                    f"seed {zoo_card.get('seed')}, trained in "
                    f"{zoo_card.get('train_seconds', float('nan')):.0f} s "
                    f"(zoo card; rebuild with `rotviz zoo build {zoo_card.get('name')}`)."
                )
            chk = card["check"]
            st.caption("Functional check: a random symmetry (every FFN permuted, every head "
                       f"rotated and rescaled) moved the weights by {chk['distance']:.1f} "
                       "(Euclidean distance), and the outputs by:")
            common.function_badge(chk["max_output_diff"], FUNCTION_TOLERANCE,
                                  "randomly transformed model")
    rows = [{"role": r, **{k: v for k, v in c.items() if k != "check"},
             "check_max_output_diff": c["check"]["max_output_diff"],
             "check_passed": c["check"]["passed"]} for r, c in cards.items()]
    common.export("models", {"page": "models", **s.base()}, cards, {"models": rows})
    common.warm_up(s)  # the pair's full models, for the page the user opens next


common.guard(body)

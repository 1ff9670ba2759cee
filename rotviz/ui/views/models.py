"""Models: the pair, what each model is, how good it is, and its functional check."""

import streamlit as st

from rotviz.app import summaries
from rotviz.app.roots import card_of, recorded_card, short_name
from rotviz.ui import boot, run, runtime, show, sidebar

s = sidebar.setup()
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
    # the zoo cards' recorded numbers first, where they apply: checking the pair and the
    # functional check need torch, which may still be loading (rotviz/ui/boot.py)
    cfgs = {role: {"ref": ref, "data": s.data, "seed": s.seed, "n_eval": s.n_eval}
            for role, ref in (("anchor", s.anchor), ("source", s.source))}
    early = recorded(cfgs) if s.anchor and s.source and not s.error else None
    top, slot = st.container(), st.empty()  # the progress box, then the cards
    if early:
        with slot.container():
            draw_recorded(early)
    boot.ready()  # torch: the start-up thread's imports (rotviz/ui/boot.py)
    if not run.require_pair(s, loss=False):  # a card of a head no loss scores has none
        slot.empty()
        return
    if s.sized[0]:  # a card evaluates each model whole
        slot.empty()
        st.info("The model cards evaluate each model whole, so they are off for a pair read "
                "block by block. The Barrier page, the Landscape page's slices and the Merge "
                "page's elementwise methods run on it.", icon=":material/memory:")
        return
    from rotviz.match.pipeline import FUNCTION_TOLERANCE

    cards = {}
    try:
        with top, show.progress("Checking both models", 2) as step:
            for role, cfg in cfgs.items():
                step(f"evaluating the {role}")
                cards[role] = runtime.compute("card", cfg)
    except BaseException:  # an error, or a stop: the recorded numbers go with the cards
        slot.empty()
        raise
    with slot.container():
        draw_cards(cards, FUNCTION_TOLERANCE)
    show.export("models", {"page": "models", **s.base()}, cards,
                  {"models": summaries.card_rows(cards)})
    run.warm_up(s)  # the pair's full models, for the page the user opens next


def recorded(cfgs: dict[str, dict]) -> dict[str, dict] | None:
    """Both zoo cards' recorded test numbers, when the cards (`cfgs`: each role's card
    configuration) are not computed yet and the recorded ones are for these settings
    (rotviz.app.roots.recorded_card); else None."""
    if all(runtime.is_cached("card", c) for c in cfgs.values()):
        return None
    out = {role: recorded_card(**c) for role, c in cfgs.items()}
    return out if all(out.values()) else None


def draw_recorded(early: dict[str, dict]) -> None:
    """What the zoo cards recorded, shown until the models are evaluated here."""
    st.info("While the models load: the test accuracy and loss **recorded on each model's zoo "
            "card** when it was built, on this same test split. The models are evaluated here "
            "now, with their functional check; these numbers are then replaced by this "
            "machine's.", icon=":material/history:")
    for col, (role, card) in zip(st.columns(2), early.items(), strict=True):
        with col, st.container(border=True):
            st.subheader(f"{role.capitalize()}: {short_name(card['ref'])}")
            m = st.columns(2)
            m[0].metric("test accuracy (recorded)", f"{card['acc']:.3f}",
                        help=f"fraction of {card['n']} test examples of {s.data} predicted "
                             f"right, from the zoo card (built {card['built']})")
            m[1].metric("test loss (recorded)", f"{card['loss']:.3f}",
                        help="cross-entropy in nats, from the zoo card")


def draw_cards(cards: dict[str, dict], tolerance: float) -> None:
    """Both models' cards, as evaluated here, with their heads and functional checks."""
    note = summaries.pair_note(cards, run.pair_scored(s))
    if note["kind"] == "all":
        st.success(note["text"], icon=":material/check:")
    else:
        st.info(note["text"], icon=":material/info:")
    cols = st.columns(2)
    for col, (role, card) in zip(cols, cards.items(), strict=True):
        with col, st.container(border=True):
            st.subheader(f"{role.capitalize()}: {short_name(card['ref'])}")
            if card["head"]["scored"]:
                metrics(card)
            else:
                st.metric("parameters", f"{card['params']:,}")
            head(card["head"])
            st.markdown(
                f"**{card['family']}** · {card['n_layers']} layers · width {card['d_model']} · "
                f"{card['n_heads']} heads of size {card['d_head']} · FFN {card['d_ffn']} "
                f"({card['activation']})" + (f" · {card['params']:,} parameters"
                                             if card["scores"] else "")
            )
            zoo_card = card_of(card["ref"])
            if zoo_card:
                recipe = zoo_card.get("recipe") or {}
                st.caption(
                    f"{zoo_card.get('description', '')}. {recipe.get('description', '')}; "
                    f"seed {zoo_card.get('seed')}, trained in "
                    f"{zoo_card.get('train_seconds', float('nan')):.0f} s "
                    f"(zoo card; train it again with "
                    f"`rotviz zoo build {zoo_card.get('name')} --out DIR`)."
                )
            chk = card["check"]
            st.caption("Functional check: a random symmetry (every FFN permuted, every head "
                       f"rotated and rescaled) moved the weights by {chk['distance']:.1f} "
                       "(Euclidean distance), and the outputs by:")
            show.function_badge(chk["max_output_diff"], tolerance,
                                  "randomly transformed model (every output it has)")


def metrics(card: dict) -> None:
    """A scored model's test numbers: accuracy, loss, its task's scores (else its size)."""
    from rotviz.app import figures  # plotly: after the start-up thread's imports (boot.py)

    scores = card.get("scores") or {}
    m = st.columns(2 + max(1, len(scores)))  # the size moves below when F1 is shown
    acc = card["acc"]
    m[0].metric("test accuracy", "n/a" if acc != acc else f"{acc:.3f}",
                help=f"fraction of {card['n_eval']} test examples of {s.data} predicted right "
                     "(per token for language models and token classifiers, per label for "
                     "multi-label ones)")
    m[1].metric("test loss", f"{card['loss']:.3f}",
                help="the head's own loss (cross-entropy in nats; squared error for "
                     "regression)")
    for j, (k, v) in enumerate(scores.items()):
        m[2 + j].metric(f"test {figures.metric_label(k)}", f"{v:.3f}", help=figures.metric_help(k))
    if not scores:
        m[-1].metric("parameters", f"{card['params']:,}")
    st.caption(f"Task: **{card.get('name') or card.get('task') or ''}** (from the model's "
               f"head) · metrics: {', '.join(card.get('metrics') or [])}")


def head(h: dict) -> None:
    """The model's head class, what it is and what it allows: a note, not an error, where no
    loss scores it (its card then has no test numbers)."""
    name = f"`{h['class']}`" if h["class"] else "no head class in config.json"
    text = f"**Head**: {name}, {h['head']}. **Works on** {h['pages']}."
    if h["scored"]:
        st.caption(text, help=f"What rotviz can do with this model: {h['allows']}.")
    else:
        st.info(text, icon=":material/info:", title="No loss on this head")


run.guard(body)

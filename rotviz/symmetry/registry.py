"""Every symmetry rotviz knows, as one record each, in the order they are offered.

`MatchOptions`, matching strings and their labels, the CLI's `--x/--no-x` flags, the app's
toggles and captions, report options and random group elements all iterate over `SYMMETRIES`;
adding a symmetry is a record here plus its action, solver and tests.

Heads, Q-K/V-O (`attn`) and rescale share one batched SVD per layer, so their solvers live
together in rotviz.match.layers. `act` and `learned` are not groups of their own: they are
other ways to solve for the maps above, from data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Symmetry:
    """One symmetry (or data solver) and everything the rest of rotviz says about it."""

    name: str  # option, matching-string token and CLI flag (--name/--no-name)
    label: str  # plain words for legends and toggles
    why: str  # one line: why the function does not change
    help: str  # one line for the CLI's --help
    default: bool  # on in MatchOptions() (the seed paper's matching)
    scope: str  # "layer" (one map per block) or "stream" (one map for the residual stream)
    requires: tuple[str, ...] = ()  # other records that must be on with it
    needs_data: bool = False  # a solver that learns from data (act, learned)
    action: str = ""  # what applies an element: a function of rotviz.symmetry
    solver: str = ""  # what finds the element: a function of rotviz.match
    draw: str = ""  # the keyword of rotviz.symmetry.actions.random_transform that draws one
    # `why` in one sentence, where `why` takes more (the symmetry ladder's rung captions,
    # rotviz.measures.ladder); empty: `why` is one sentence already
    reason: str = ""

    def one_sentence(self) -> str:
        """Why the function does not change, in one sentence."""
        return self.reason or self.why


SYMMETRIES: tuple[Symmetry, ...] = (
    Symmetry(
        "ffn", "FFN permutation",
        "Hidden units of an FFN are summed in any order: permuting W_in's rows together with "
        "W_out's columns relabels neurons without changing the sum.",
        "match FFN neurons by permutation", True, "layer",
        action="actions.permute_ffn", solver="layer_solvers.ffn_permutation", draw="ffn"),
    Symmetry(
        "attn", "attention rotation",
        "Attention scores use q·k = (x W_Qᵀ)(x W_Kᵀ)ᵀ: rotating queries and keys by the same R "
        "cancels (R Rᵀ = I); values rotated by R are rotated back by W_O.",
        "match attention heads by Q-K and V-O rotations", True, "layer",
        action="actions.transform_qk, actions.transform_vo", solver="groups.procrustes",
        draw="attn"),
    Symmetry(
        "rescale", "rescale",
        "Multiplying a head's queries by a and dividing its keys by a leaves every q·k "
        "the same (likewise values by b, W_O by 1/b).",
        "rescale Q-K and V-O per head", True, "layer",
        action="actions.transform_qk, actions.transform_vo", solver="groups.best_scale",
        draw="rescale"),
    Symmetry(
        "heads", "head permutation",
        "A layer adds up its heads' outputs in any order: moving a head's W_Q, W_K, W_V "
        "rows together with its W_O columns relabels heads without changing the sum.",
        "permute heads by linear assignment before rotating them (beyond the seed paper)",
        False, "layer", requires=("attn",),
        action="actions.permute_heads", solver="layer_solvers.head_permutation", draw="heads"),
    Symmetry(
        "residual", "residual rotation",
        "Layers talk through the residual stream: writers add to it, readers see it "
        "through a norm. Turning the stream by an orthogonal Q and every reader by the "
        "same Q cancels, x Q (W Q)ᵀ = x Wᵀ. LayerNorm allows it once its gains are "
        "folded into the readers and Q keeps the all-ones direction (Q 1 = 1).",
        "also map the residual stream (rotation, centred rotation or permutation, as the "
        "architecture allows), alternated with the others", False, "stream",
        action="residual.apply_residual", solver="residual.solve", draw="residual.random_map",
        reason="Turning the residual stream by an orthogonal Q and every reader by the same Q "
               "cancels, x Q (W Q)ᵀ = x Wᵀ, because layers talk only through the stream (under "
               "LayerNorm once its gains are folded into the readers and Q 1 = 1)."),
    Symmetry(
        "act", "activation matching",
        "Activation matching picks the FFN permutations and the residual map from the two "
        "models' activations on training data instead of their weights. The maps are still "
        "symmetries, so the function cannot change.",
        "FFN and residual maps from activations on --data (training split)", False, "stream",
        needs_data=True, solver="datamatch.match_activations",
        reason="Activation matching only picks the FFN permutations and the residual map from "
               "the two models' activations instead of their weights, so the maps are the same "
               "symmetries and the function cannot change."),
    Symmetry(
        "learned", "learned matching",
        "Learned matching starts from activation matching (or from the maps named with it) "
        "and tunes the residual rotation and the per-head Q-K and V-O maps by gradient descent "
        "so that the models between the two have a low training loss. Still symmetries: the "
        "function is kept.",
        "then tune the rotations on --data so the path has no barrier", False, "stream",
        needs_data=True, solver="learned.learn",
        reason="Learned matching only tunes rotations that are symmetries (the residual map "
               "and per-head Q-K and V-O maps) to lower the loss half-way, so the function is "
               "kept whatever it learns."),
)

# The symmetry ladder (rotviz.measures.ladder): matching SPECs as the group grows, then the
# data solvers; and its two rungs that add no symmetry, each with its one sentence: the pair
# as it is, and a model matched onto itself.
LADDER: tuple[str, ...] = ("none", "ffn", "ffn,attn", "seed", "seed,heads", "weight", "act",
                           "learned")
NONE_REASON = ("No map is applied: the source is compared with the anchor as it was trained, "
               "so its function is its own.")
SELF_REASON = ("Matched onto itself, a model is already at distance 0, which no map can beat, "
               "so matching keeps the identity and the path between the two ends is one "
               "model.")

BY_NAME: dict[str, Symmetry] = {s.name: s for s in SYMMETRIES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
MAPS: tuple[str, ...] = tuple(s.name for s in SYMMETRIES if not s.needs_data)  # groups
DATA_SOLVERS: tuple[str, ...] = tuple(s.name for s in SYMMETRIES if s.needs_data)
# Shorthands of the matching string: the seed paper's matching, and every data-free map.
SHORTHANDS: dict[str, tuple[str, ...]] = {
    "seed": tuple(s.name for s in SYMMETRIES if s.default),
    "weight": MAPS,
}
SHORTHAND_LABELS = {"seed": "FFN + attention + rescale (seed paper)",
                    "weight": "weight matching (every data-free map)"}


def label(name: str) -> str:
    """Plain words for a symmetry, a shorthand or `none`."""
    if name in BY_NAME:
        return BY_NAME[name].label
    return SHORTHAND_LABELS.get(name, "no matching" if name == "none" else name)

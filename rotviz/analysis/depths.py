"""Two models of one family and width but different depths, brought to one depth to be merged.

The anchor A has fewer blocks than the source B. First A's blocks are paired with B's:

- `similarity`: linear CKA of the block outputs (rotviz.analysis.representations, on the
  train split) between every block of A and every block of B, and the strictly increasing
  map i -> p(i) that maximises the summed CKA (dynamic programming, as in the segment-wise
  layer alignment of training-free heterogeneous model merging, Xu et al. 2025): A's block i
  and B's block p(i) write alike representations;
- `position`: p(i) spread evenly, A's last block with B's last.

Block i's *group* is B's blocks after p(i - 1) up to p(i) (the first group starts at B's first
block, the last one ends at B's last): consecutive blocks of B doing the work of one block of
A. Then one of two routes makes one depth:

- `groups` (A's depth): each group collapsed into one block, the average of its blocks
  weighted by the size of their residual writes (the norm of their attention and FFN output
  projections, weights and biases). A block that writes nothing into the stream (an identity
  block) adds nothing to the function, so it gets no weight; blocks that all write
  get weights in proportion. The collapsed B is then matched to A and merged block for block.
- `expand` (B's depth; "Is Depth Heterogeneity a Barrier to Model Merging?", ICLR 2026): A is
  expanded with identity blocks: A's block i goes to the slot of its group's block that writes
  most, every other slot of the group gets an identity block (every linear weight and bias
  zero, norms at gain 1 and bias 0: in a pre-norm block the attention and the FFN then write
  exactly zero, so the expanded A computes A's function). Being all zero, an identity block
  adds nothing to matching's objective, so the alignment of B to the expanded A is decided by
  A's real blocks. The pair then has B's depth and is matched and merged block for block.

Both routes give a pair of one architecture: any merge method that takes no base model merges
it. What the pairing found is kept in `Depths` for the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rotviz.errors import RotvizError
from rotviz.sources.stacking import block_prefixes, block_state, depth, stacked

if TYPE_CHECKING:
    import torch

    from rotviz.data.split import Split
    from rotviz.sources.loading import Loaded

    Tensor = torch.Tensor

PAIRINGS = ("similarity", "position")
ROUTES = ("groups", "expand")


@dataclass(frozen=True)
class Depths:
    """How a pair of different depths was brought to one: the blocks of each, which block of
    B each of A's pairs with (`paired`), B's blocks in each group, and per route the weights
    each group's blocks were collapsed with (`groups`) or the slot of B each of A's blocks
    went to (`expand`); `similarity` the CKA of A's block outputs (rows) with B's (columns)
    where the pairing measured it."""

    route: str
    pairing: str
    blocks: tuple[int, int]  # (the anchor's, the source's)
    paired: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    weights: tuple[tuple[float, ...], ...] = ()
    slots: tuple[int, ...] = ()
    similarity: tuple[tuple[float, ...], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"route": self.route, "pairing": self.pairing, "blocks": list(self.blocks),
                "paired": list(self.paired), "groups": [list(g) for g in self.groups],
                "weights": [list(w) for w in self.weights], "slots": list(self.slots),
                "similarity": [list(r) for r in self.similarity]}


@dataclass(frozen=True)
class OneDepth:
    """A pair of different depths brought to one: what was done, and the two models as they
    were (the shallower and the deeper), which the report evaluates beside the merge."""

    depths: Depths
    shallow: Loaded
    deep: Loaded


def differs_in_depth(a: Loaded, b: Loaded) -> bool:
    """True for two models of one family whose numbers of blocks differ (a model whose
    blocks cannot be read is left to the usual checks: False)."""
    if a.spec.family != b.spec.family:
        return False
    try:
        return depth(a) != depth(b)
    except (RotvizError, AttributeError, KeyError):
        return False


def depth_refusal(a: Loaded, b: Loaded, why: str) -> str:
    """One line: the two depths, and `why` this use of them is refused (with the fix)."""
    return f"different depths: '{a.ref}' has {depth(a)} blocks and '{b.ref}' {depth(b)}: {why}"


def check_depths(a: Loaded, b: Loaded) -> None:
    """The anchor is the shallower one, and both share family, width, heads and the shapes
    of each block and of everything outside the blocks (one line otherwise)."""
    from rotviz.arch.spec import config_value
    from rotviz.sources.stacking import outside_blocks

    if a.spec.family != b.spec.family:
        raise RotvizError(f"different architectures: '{a.ref}' is {a.spec.family}, '{b.ref}' is "
                          f"{b.spec.family}; models of different depths merge within one family")
    na, nb = depth(a), depth(b)
    if na >= nb:
        raise RotvizError(f"the anchor '{a.ref}' has {na} blocks and the source '{b.ref}' {nb}: "
                          "give the shallower model first (ANCHOR), the deeper second")
    for keys in (a.spec.d_model_key, a.spec.n_heads_key, a.spec.activation_key):
        va, vb = config_value(a.config, keys), config_value(b.config, keys)
        if va != vb:
            raise RotvizError(f"models of different depths must share every other size: "
                              f"{keys[0]} {va} vs {vb}; merge models of one width")
    ba = {k: tuple(v.shape) for k, v in block_state(a, 0).items()}
    for j in range(nb):
        bb = {k: tuple(v.shape) for k, v in block_state(b, j).items()}
        if bb != ba:
            diff = sorted(k for k in set(ba) | set(bb) if ba.get(k) != bb.get(k))[:2]
            raise RotvizError(f"block {j} of '{b.ref}' differs from the blocks of '{a.ref}' "
                              f"({', '.join(diff)}): models of different depths must share "
                              "the shape of every block")
    oa, ob = outside_blocks(a), outside_blocks(b)
    bad = sorted(k for k in set(oa) | set(ob)
                 if k not in oa or k not in ob or oa[k].shape != ob[k].shape)
    if bad:
        raise RotvizError(f"the tensors outside the blocks differ ({', '.join(bad[:2])}): "
                          "models of different depths must share embeddings and head")


def block_similarity(a: Loaded, b: Loaded, split: Split, device: Any = "cpu",
                     tokens: str = "mean") -> list[list[float]]:
    """Linear CKA of each of A's block outputs (rows) with each of B's (columns), on `split`."""
    from rotviz.analysis.representations import hidden_states
    from rotviz.analysis.shape_metrics import linear_cka
    from rotviz.evaluation import Evaluator

    ha = hidden_states(Evaluator(a, split, device), a.state, tokens)[1:]
    hb = hidden_states(Evaluator(b, split, device), b.state, tokens)[1:]
    return [[linear_cka(x, y) for y in hb] for x in ha]


def pair_by_similarity(sim: Sequence[Sequence[float]]) -> tuple[int, ...]:
    """The strictly increasing p (A's block i -> B's block p(i)) maximising sum sim[i][p(i)]:
    dynamic programming over (i, j), ties going to the earlier block of B."""
    na, nb = len(sim), len(sim[0]) if sim else 0
    if not 0 < na <= nb:
        raise RotvizError(f"pairing needs the shallower model first: {na} blocks vs {nb}")
    neg = float("-inf")
    best = [[neg] * nb for _ in range(na)]  # best[i][j]: blocks 0..i paired, i with j
    came = [[-1] * nb for _ in range(na)]
    for j in range(nb):
        best[0][j] = float(sim[0][j])
    for i in range(1, na):
        top, arg = neg, -1
        for j in range(i, nb):
            if best[i - 1][j - 1] > top:  # strict: the earliest of equal predecessors
                top, arg = best[i - 1][j - 1], j - 1
            best[i][j] = top + float(sim[i][j])
            came[i][j] = arg
    last = max(range(na - 1, nb), key=lambda j: (best[na - 1][j], -j))
    out = [last]
    for i in range(na - 1, 0, -1):
        out.append(came[i][out[-1]])
    return tuple(reversed(out))


def pair_by_position(na: int, nb: int) -> tuple[int, ...]:
    """A's block i with B's block round((i + 1) nb / na) - 1: evenly spread, last with last."""
    return tuple(max(i, round((i + 1) * nb / na) - 1) for i in range(na))


def groups_of(paired: Sequence[int], nb: int) -> tuple[tuple[int, ...], ...]:
    """B's blocks in each of A's groups: after p(i - 1) up to p(i); the last up to B's last."""
    ends = [*paired[:-1], nb - 1]
    starts = [0, *(p + 1 for p in paired[:-1])]
    return tuple(tuple(range(s, e + 1)) for s, e in zip(starts, ends, strict=True))


def writes(model: Loaded) -> list[float]:
    """Each block's residual write: the norm of its attention and FFN output projections
    (weights and biases). Zero exactly for an identity block."""
    from rotviz.symmetry.view import resolve_layout

    layout = resolve_layout(model.spec, model.state)
    outs = (layout.roles["o"], layout.roles["ffn_out"])
    sizes = []
    for i in range(len(layout.blocks)):
        block = block_state(model, i)
        total = sum(float(v.double().square().sum()) for k, v in block.items()
                    if k.rsplit(".", 1)[0] in outs)
        sizes.append(total ** 0.5)
    return sizes


def identity_block(model: Loaded) -> dict[str, Tensor]:
    """A block of `model`'s shapes that computes the identity in a pre-norm family: every
    linear weight and bias zero, every norm at gain 1 and bias 0 (the attention and the FFN
    then write exactly zero into the stream)."""
    import torch

    from rotviz.symmetry.view import resolve_layout

    if model.spec.placement != "pre":
        raise RotvizError(f"a {model.spec.family} model puts its norms on the stream "
                          "(post-norm), where no block is the identity; use --depth-route "
                          "groups")
    norms = set(resolve_layout(model.spec, model.state).norms.values())
    out = {}
    for k, v in block_state(model, 0).items():
        t = torch.zeros_like(v)
        owner, _, leaf = k.rpartition(".")
        if owner in norms and leaf == "weight":
            t += 1.0 - model.spec.norm_offset
        out[k] = t
    return out


def silent_copy(model: Loaded, i: int) -> dict[str, Tensor]:
    """Block i of `model` with its attention and FFN output projections (weights and biases)
    zeroed: in a pre-norm family it computes the identity, and unlike `identity_block` it
    still learns (its hidden units are alive, so the zeroed projections get gradients): how
    a model is grown deeper before training on (the zoo's vit-digits-deep)."""
    import torch

    from rotviz.symmetry.view import resolve_layout

    identity_block(model)  # a post-norm family is refused
    layout = resolve_layout(model.spec, model.state)
    outs = (layout.roles["o"], layout.roles["ffn_out"])
    return {k: torch.zeros_like(v) if k.rsplit(".", 1)[0] in outs else v.clone()
            for k, v in block_state(model, i).items()}


def grown(model: Loaded, slots: Sequence[int], ref: str) -> Loaded:
    """`model` grown to `slots[-1] + 1` blocks: its block i at `slots[i]` (increasing, the
    first at 0), each other slot a `silent_copy` of the block before it. Same function."""
    if list(slots) != sorted(set(slots)) or not slots or slots[0] != 0 or \
            len(slots) != depth(model):
        raise RotvizError(f"growing a model of {depth(model)} blocks needs that many "
                          f"increasing slots from 0, got {list(slots)}")
    blocks: list[Mapping[str, Tensor]] = []
    origins: list[int] = []
    for i, slot in enumerate(slots):
        nxt = slots[i + 1] if i + 1 < len(slots) else slot + 1
        blocks.append(block_state(model, i))
        blocks += [silent_copy(model, i) for _ in range(slot + 1, nxt)]
        origins += [i] * (nxt - slot)
    return stacked(model, blocks, ref, origins=origins)


def collapse(b: Loaded, groups: Sequence[Sequence[int]]
             ) -> tuple[Loaded, tuple[tuple[float, ...], ...]]:
    """B with each group averaged into one block, weighted by its blocks' residual writes
    (equal weights where none of a group's blocks writes), and those weights."""
    sizes = writes(b)
    blocks, weights = [], []
    for g in groups:
        total = sum(sizes[j] for j in g)
        w = [sizes[j] / total for j in g] if total > 0 else [1.0 / len(g)] * len(g)
        states = [block_state(b, j) for j in g]
        blocks.append({k: _weighted([s[k] for s in states], w) for k in states[0]})
        weights.append(tuple(w))
    # each collapsed block keeps the per-layer settings of its group's block that writes most
    origins = [max(g, key=lambda j: (sizes[j], -j)) for g in groups]
    return stacked(b, blocks, f"{b.ref} (groups collapsed to {len(groups)} blocks)",
                   origins=origins), tuple(weights)


def _weighted(tensors: Sequence[Tensor], w: Sequence[float]) -> Tensor:
    """sum_j w_j t_j in float64, in the first tensor's dtype (a weight of 1 returns that
    tensor's values exactly)."""
    if len(tensors) == 1 or max(w) == 1.0:
        return tensors[max(range(len(w)), key=w.__getitem__)].clone()
    acc = sum(x * t.double() for x, t in zip(w, tensors, strict=True))
    return acc.to(tensors[0].dtype)


def expand(a: Loaded, b: Loaded, groups: Sequence[Sequence[int]]
           ) -> tuple[Loaded, tuple[int, ...]]:
    """A with B's depth: A's block i in the slot of group i's block that writes most, identity
    blocks in the others; and those slots."""
    sizes = writes(b)
    ident = identity_block(a)
    blocks: list[Mapping[str, Tensor]] = []
    slots = []
    for i, g in enumerate(groups):
        slot = max(g, key=lambda j: (sizes[j], -j))
        slots.append(slot)
        blocks += [block_state(a, i) if j == slot else ident for j in g]
    # every slot of group i has the per-layer settings of A's block i (identities write zero)
    origins = [i for i, g in enumerate(groups) for _ in g]
    return stacked(a, blocks, f"{a.ref} (expanded to {len(blocks)} blocks)",
                   origins=origins), tuple(slots)


def pairing_of(a: Loaded, b: Loaded, pairing: str, split: Split | None, device: Any = "cpu"
               ) -> tuple[tuple[int, ...], tuple[tuple[float, ...], ...]]:
    """(p, the CKA matrix or empty) by `pairing`: similarity reads the representations on
    `split` (callers give the train split: the pairing is fitted, never read off the test)."""
    if pairing not in PAIRINGS:
        raise RotvizError(f"unknown --depth-pairing '{pairing}': use one of "
                          f"{', '.join(PAIRINGS)}")
    na, nb = depth(a), depth(b)
    if pairing == "position":
        return pair_by_position(na, nb), ()
    if split is None:
        raise RotvizError("--depth-pairing similarity compares the models' representations: "
                          "give data, or use --depth-pairing position")
    sim = block_similarity(a, b, split, device)
    return pair_by_similarity(sim), tuple(tuple(r) for r in sim)


def same_depth(a: Loaded, b: Loaded, pairing: str = "similarity", route: str = "groups",
               split: Split | None = None, device: Any = "cpu"
               ) -> tuple[Loaded, Loaded, Depths]:
    """same_depth(shallow, deep, "similarity", "groups", split) -> (anchor, source, Depths)

    The pair brought to one depth: (A, B collapsed) by `groups`, (A expanded, B) by
    `expand`; new models, neither input changed. `split`: the data the similarity pairing
    reads (the train split). Checked first (one line each)."""
    if route not in ROUTES:
        raise RotvizError(f"unknown --depth-route '{route}': use one of {', '.join(ROUTES)}")
    check_depths(a, b)
    if route == "expand":
        identity_block(a)  # a post-norm family is refused before any data is read
    paired, sim = pairing_of(a, b, pairing, split, device)
    groups = groups_of(paired, depth(b))
    blocks = (len(block_prefixes(a)), len(block_prefixes(b)))
    if route == "groups":
        collapsed, weights = collapse(b, groups)
        return a, collapsed, Depths(route, pairing, blocks, paired, groups, weights=weights,
                                    similarity=sim)
    expanded, slots = expand(a, b, groups)
    return expanded, b, Depths(route, pairing, blocks, paired, groups, slots=slots,
                               similarity=sim)

"""Groups of a model's tensors that move together: each block (then "rest": embeddings,
final norm and head) or each module kind (q, k, v, o, ffn, norms, embeddings, head, other),
and S_g, the anchor with group g's tensors taken from a target (`GroupStates`).

Building S_g once per group and interpolating A -> S_g keeps every tensor outside g bit for
bit A's (lerp(a, a, alpha) = a), and a fused Q/K/V projection is split through the canonical
view (rotviz.symmetry.view) so that Q, K and V can move one at a time. The layer-wise
barriers (rotviz.measures.layerwise) walk these paths, in memory and at size; empty kinds
are left out. `series` walks them: each group's path and the cumulative steps, every
distinct point evaluated once, however a point is built (in memory or at size).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np
import torch

from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.evaluation import barrier_of
from rotviz.sources.loading import Loaded
from rotviz.symmetry.kinds import kind_of
from rotviz.symmetry.view import Block, Layout, ModelView, read_view, write_state

Tensor = torch.Tensor

BY = ("block", "kind")
KIND_GROUPS = ("q", "k", "v", "o", "ffn", "norms", "embeddings", "head", "other")
REST = "rest"  # the tensors of no block: embeddings, final norm, head

# which fields of the canonical view each block-level kind owns
_ATTN_FIELDS = {"q": ("wq", "bq", "wpq", "bpq"), "k": ("wk", "bk", "wpk", "bpk"),
                "v": ("wv", "bv"), "o": ("wo", "bo")}
_OTHER_KIND = {"embeddings": "embeddings", "norms": "norms", "head": "head", "other": "other"}


def _aliases(view: ModelView) -> dict[str, str]:
    """Tied aliases that hold in this model -> their owners (GPT-2's head is its embedding)."""
    ties = view.spec.tied if view.tied is None else view.tied
    return dict(ties)


def _kind_of_other(name: str, view: ModelView) -> str:
    """The kind group of a tensor outside the blocks (KIND_GROUPS); a tied alias goes with
    its owner, so that it is one tensor, moved once."""
    return kind_outside(name, view.layout, _aliases(view))


def kind_outside(name: str, layout: Layout, aliases: Mapping[str, str]) -> str:
    """The kind group of the tensor `name` outside the blocks of `layout`, a tied alias (a
    key of `aliases`) counted as its owner."""
    return _OTHER_KIND.get(kind_of(aliases.get(name, name), layout), "other")


def block_groups(anchor: Loaded) -> list[str]:
    """The block-wise groups: '0', '1', ..., then 'rest' (everything outside the blocks)."""
    view = read_view(anchor.spec, anchor.config, anchor.state)
    return [str(i) for i in range(len(view.blocks))] + [REST]


def kind_groups(anchor: Loaded) -> list[str]:
    """The kinds this model has tensors of, in KIND_GROUPS order."""
    view = read_view(anchor.spec, anchor.config, anchor.state)
    aliases = _aliases(view)
    other = [n for n, t in view.other.items() if t.is_floating_point() and n not in aliases]
    return kinds_of(view.blocks, other, lambda n: _kind_of_other(n, view))


def kinds_of(blocks: Sequence[Block], other: Sequence[str],
             kind_of_other: Callable[[str], str]) -> list[str]:
    """The kinds that `blocks` (canonical blocks; meta tensors do) and the floating, untied
    tensors outside them (`other`, whose kind `kind_of_other` says) hold, in KIND_GROUPS
    order."""
    have = set()
    for blk in blocks:
        a = blk.attn
        for kind, names in _ATTN_FIELDS.items():
            if any(getattr(a, n) is not None for n in names):
                have.add(kind)
        have.add("ffn")
        if blk.norms or a.gq is not None or a.gk is not None:
            have.add("norms")
    have.update(kind_of_other(n) for n in other)
    return [k for k in KIND_GROUPS if k in have]


def block_mixed(a: Block, b: Block, kinds: set[str]) -> Block:
    """Block `a` with the fields of `kinds` taken from `b`."""
    attn = a.attn
    for kind, names in _ATTN_FIELDS.items():
        if kind in kinds:
            attn = replace(attn, **{n: getattr(b.attn, n) for n in names})
    if "norms" in kinds:
        attn = replace(attn, gq=b.attn.gq, gk=b.attn.gk)
    ffn = b.ffn if "ffn" in kinds else a.ffn
    norms = b.norms if "norms" in kinds else a.norms
    return Block(attn, ffn, norms)


class GroupStates:
    """S_g for any set of groups: the anchor with those groups' tensors from the target.

    By block the tensors are picked by name (each block's prefix; 'rest' is every name under
    no block prefix) and shared with the inputs, never copied or modified. By kind the two
    canonical views are mixed field by field and written back (rotviz.symmetry.view), which
    splits a fused Q/K/V projection into its parts."""

    def __init__(self, anchor: Loaded, a: Mapping[str, Tensor], b: Mapping[str, Tensor],
                 by: str):
        if by not in BY:
            raise RotvizError(f"unknown --by '{by}': use one of {', '.join(BY)}")
        self.by = by
        self.a, self.b = a, b
        self.spec, self.config = anchor.spec, anchor.config
        self.va = read_view(anchor.spec, anchor.config, a)
        self.prefixes = list(self.va.layout.blocks)
        if by == "kind":
            self.vb = read_view(anchor.spec, anchor.config, b)
            self.groups = kind_groups(anchor)
        else:
            self.groups = [str(i) for i in range(len(self.prefixes))] + [REST]

    def block_of(self, name: str) -> str:
        """The block group a tensor name belongs to ('rest' outside every block)."""
        for i, p in enumerate(self.prefixes):
            if name.startswith(p):
                return str(i)
        return REST

    def state(self, groups: Sequence[str]) -> dict[str, Tensor]:
        """The anchor with the tensors of `groups` taken from the target."""
        unknown = [g for g in groups if g not in self.groups]
        if unknown:
            raise RotvizError(f"no group {unknown[0]!r}; use {', '.join(self.groups)}")
        chosen = set(groups)
        if self.by == "block":
            return {k: (self.b[k] if self.block_of(k) in chosen else v)
                    for k, v in self.a.items()}
        va, vb = self.va, self.vb
        blocks = tuple(block_mixed(x, y, chosen) for x, y in zip(va.blocks, vb.blocks,
                                                                     strict=True))
        other = {k: (vb.other[k] if v.is_floating_point()
                     and _kind_of_other(k, va) in chosen else v)
                 for k, v in va.other.items()}
        return write_state(replace(va, blocks=blocks, other=other))


def rise_of(alphas: Sequence[float], loss: Sequence[float], end: float) -> float:
    """How far a group's path rises above the straight line between the two whole models'
    losses, max over alpha of L_g(alpha) - ((1 - alpha) L(A) + alpha L(B')); >= 0 (alpha = 0
    is the anchor on both). Unlike the barrier it counts a group whose far end, the anchor
    with only that group from the source, is itself a bad model."""
    a, lo = np.asarray(alphas, dtype=float), np.asarray(loss, dtype=float)
    return float(np.max(lo - ((1 - a) * lo[0] + a * end)))


def _step_name(groups: Sequence[str], i: int) -> str:
    return groups[0] if i == 0 else f"{groups[0]}-{groups[i]}"


Point = Callable[[float], tuple[float, float]]  # alpha -> (loss, accuracy) on one path


def series(groups: Sequence[str], targets: int, alphas: Sequence[float],
           anchor: Callable[[], tuple[float, float]],
           path: Callable[[int, tuple[str, ...]], Point],
           same: Callable[[str], bool] | None = None, group: Group | None = None,
           tick: Callable[[int, int, str], None] | None = None,
           many: Callable[[list[tuple[int, tuple[str, ...], float]], Callable[[int], None]],
                          list[tuple[float, float]]] | None = None) -> list[dict] | None:
    """Loss, accuracy and barrier of each group's path and of each cumulative step, toward
    each of `targets` parameter sets (the matched source, then the source unmatched).

    `anchor()` evaluates the anchor; `path(t, groups)` gives the evaluation of the points of
    lerp(A, S, alpha), S the anchor with `groups` taken from target t. Every distinct point
    is evaluated once: the anchor, alpha = 0 of every path toward every target, once; the
    first cumulative step is the first group's own path; a path toward a later target whose
    groups are all `same` (the group's tensors bit for bit equal in both targets: a part
    that matching left alone) is target 0's path. The points are dealt among torchrun's
    processes (`group`); rank 0 returns one dict per target, the others None. `many(points,
    done)`, when given, evaluates this process's points (target, groups, alpha) at once
    instead of `path` (several a pass: rotviz.evaluation.Evaluator.evaluate_each), `done(k)`
    after the first k."""

    keys: list[tuple[int, tuple[str, ...]]] = []
    for t in range(targets):
        keys += [(t, (g,)) for g in groups]
        keys += [(t, tuple(groups[:i + 1])) for i in range(1, len(groups))]
    alike = {g: targets > 1 and same is not None and same(g) for g in groups}
    canon = {(t, gs): (0, gs) if t > 0 and all(alike[g] for g in gs) else (t, gs)
             for t, gs in keys}
    tasks: list = [None]  # the anchor, then every distinct path's points beyond alpha = 0
    tasks += [(k, j) for k in dict.fromkeys(canon.values()) for j in range(1, len(alphas))]
    group = group or SINGLE
    mine = group.mine(list(range(len(tasks))))
    found: dict[int, tuple[float, float]] = {}
    current: tuple = (None, None)
    if many is not None:  # the anchor first, then the paths' points together
        points = [i for i in mine if tasks[i] is not None]
        if len(points) < len(mine):
            found[0] = anchor()
        first = len(mine) - len(points)

        def done(k: int) -> None:
            if tick:
                k_task = tasks[points[k - 1]]
                tick(first + k, len(mine), _step_name(k_task[0][1], len(k_task[0][1]) - 1))

        got = many([(*tasks[i][0], float(alphas[tasks[i][1]])) for i in points], done)
        found.update(zip(points, got, strict=True))
        mine = []
    for count, i in enumerate(mine):
        if tasks[i] is None:
            found[i] = anchor()
            what = "anchor"
        else:
            k, j = tasks[i]
            if current[0] != k:
                current = (k, path(*k))
            found[i] = current[1](float(alphas[j]))
            what = _step_name(k[1], len(k[1]) - 1)
        if tick:
            tick(count + 1, len(mine), what)
    parts = group.gather(found)
    if parts is None:
        return None
    for part in parts:
        found.update(part)
    index = {task: i for i, task in enumerate(tasks)}

    def curve(key: tuple[int, tuple[str, ...]]) -> tuple[list[float], list[float]]:
        k = canon[key]
        pts = [found[0]] + [found[index[(k, j)]] for j in range(1, len(alphas))]
        return [p[0] for p in pts], [p[1] for p in pts]

    out = []
    for t in range(targets):
        single = [curve((t, (g,))) for g in groups]
        cum = [single[0]] + [curve((t, tuple(groups[:i + 1]))) for i in range(1, len(groups))]
        full_end = cum[-1][0][-1]  # the target's own loss: the last step moves every tensor
        out.append(dict(
            groups=list(groups), loss=[s[0] for s in single], acc=[s[1] for s in single],
            barrier=[barrier_of(alphas, s[0]) for s in single],
            rise=[rise_of(alphas, s[0], full_end) for s in single],
            cumulative=[_step_name(groups, i) for i in range(len(groups))],
            cum_loss=[c[0] for c in cum], cum_barrier=[barrier_of(alphas, c[0]) for c in cum]))
    return out

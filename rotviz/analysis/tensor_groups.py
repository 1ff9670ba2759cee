"""Groups of a model's tensors that move together: each block (then "rest": embeddings,
final norm and head) or each module kind (q, k, v, o, ffn, norms, embeddings, head, other),
and S_g, the anchor with group g's tensors taken from a target (`GroupStates`).

Building S_g once per group and interpolating A -> S_g keeps every tensor outside g bit for
bit A's (lerp(a, a, alpha) = a), and a fused Q/K/V projection is split through the canonical
view (rotviz.symmetry.view) so that Q, K and V can move one at a time. The layer-wise
barriers (rotviz.measures.layerwise) walk these paths, in memory and at size; empty kinds
are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import torch

from rotviz.errors import RotvizError
from rotviz.models import Loaded
from rotviz.symmetry.view import Block, Layout, ModelView, _kind_of, read_view, write_state

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
    return _OTHER_KIND.get(_kind_of(aliases.get(name, name), layout), "other")


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

"""Parameter kinds, for distances: every tensor of a view named by its block (None outside
the blocks) and its kind (q, k, v, o, FFN in and out, norms, embeddings, head, other), so
that distances read per kind and per layer (rotviz.match.distances), in memory and at size.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rotviz.symmetry.view import Layout, ModelView

Tensor = torch.Tensor


KINDS = ("q", "k", "v", "o", "ffn_in", "ffn_out", "norms", "embeddings", "head", "other")


def groups(view: ModelView) -> Iterator[tuple[int | None, str, Tensor]]:
    """Every floating tensor of the view as (layer or None, module kind, tensor)."""
    for i, blk in enumerate(view.blocks):
        a, f = blk.attn, blk.ffn
        for kind, ts in (
            ("q", (a.wq, a.bq, a.wpq, a.bpq)),
            ("k", (a.wk, a.bk, a.wpk, a.bpk)),
            ("v", (a.wv, a.bv)),
            ("o", (a.wo, a.bo)),
            ("ffn_in", (f.w_in, f.b_in, f.w_gate, f.b_gate)),  # a gated FFN's gate reads too
            ("ffn_out", (f.w_out, f.b_out)),
            ("norms", tuple(t for n in blk.norms.values() for t in (n.weight, n.bias))
             + (a.gq, a.gk)),
        ):
            for t in ts:
                if t is not None:
                    yield i, kind, t
    lay = view.layout
    ties = view.spec.tied if view.tied is None else view.tied
    tied_aliases = {alias for alias, _ in ties}
    for name, t in view.other.items():
        if not t.is_floating_point() or name in tied_aliases:
            continue
        yield None, kind_of(name, lay), t


def kind_of(name: str, lay: Layout) -> str:
    module = name.rsplit(".", 1)[0]
    if name in lay.writers:
        return "embeddings"
    if module in lay.stream_norms or module == lay.final_norm:
        return "norms"
    if module in lay.readers:
        return "head"
    if any(name.startswith(p) for p in lay.blocks):
        return "other"
    return "head"

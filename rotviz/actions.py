"""Symmetry actions on the canonical view. Each returns new tensors; inputs are never touched.

Conventions (row vectors, `y = x W^T + b`, REFERENCE.md):
- FFN permutation `perm`: new unit k is old unit perm[k].
- Q-K map A (per head, invertible): W_Q -> A^T W_Q, b_Q -> b_Q A, W_K -> A^-1 W_K, b_K -> b_K A^-T.
  Scores q k^T are unchanged because A A^-1 = I.
- V-O map B (per head, invertible): W_V -> B^T W_V, b_V -> b_V B, W_O[:, h] -> W_O[:, h] B^-T.
- Head permutation `heads`: new head k is old head heads[k] (its Q, K, V rows, their biases and
  its W_O columns move together); applied before the Q-K and V-O maps, which act on new heads.
The seed paper's group uses A = a R and B = b R with R orthogonal and a, b non-zero scalars.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from rotviz.view import FFN, Attention, Dims, ModelView

Tensor = torch.Tensor


@dataclass(frozen=True)
class LayerTransform:
    """One group element acting on one block. None means identity."""

    perm: Tensor | None = None  # (m,) long
    qk: Tensor | None = None  # (H, d_h, d_h)
    vo: Tensor | None = None  # (H, d_h, d_h)
    heads: Tensor | None = None  # (H,) long, applied before qk and vo

    def then(self, other: LayerTransform) -> LayerTransform:
        """The element that applies `self` first, then `other`.

        `other`'s head permutation p2 carries `self`'s per-head maps along: new head k gets
        old head p1[p2[k]] and the map A1[p2[k]] A2[k]."""
        perm = _compose_opt(self.perm, other.perm, lambda p1, p2: p1[p2])
        p2 = other.heads
        qk1 = self.qk if self.qk is None or p2 is None else self.qk[p2.to(self.qk.device)]
        vo1 = self.vo if self.vo is None or p2 is None else self.vo[p2.to(self.vo.device)]
        qk = _compose_opt(qk1, other.qk, lambda a1, a2: a1 @ a2.to(a1.dtype))
        vo = _compose_opt(vo1, other.vo, lambda b1, b2: b1 @ b2.to(b1.dtype))
        heads = _compose_opt(self.heads, other.heads, lambda h1, h2: h1[h2])
        return LayerTransform(perm, qk, vo, heads)


def _compose_opt(x, y, fn):
    if x is None:
        return y
    if y is None:
        return x
    return fn(x, y)


def _row_times(b: Tensor | None, m: Tensor) -> Tensor | None:
    """Per-head row vector times matrix: (H, d_h) x (H, d_h, d_h)."""
    return None if b is None else (b.unsqueeze(1) @ m).squeeze(1)


def permute_ffn(ffn: FFN, perm: Tensor) -> FFN:
    perm = perm.to(ffn.w_in.device)
    return replace(
        ffn,
        w_in=ffn.w_in[perm],
        b_in=None if ffn.b_in is None else ffn.b_in[perm],
        w_out=ffn.w_out[:, perm],
    )


def permute_heads(attn: Attention, heads: Tensor) -> Attention:
    """New head k is old head heads[k]: Q, K, V rows, their biases and W_O columns together."""
    heads = heads.to(attn.wq.device)

    def pick(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[heads]

    return replace(attn, wq=pick(attn.wq), wk=pick(attn.wk), wv=pick(attn.wv), wo=pick(attn.wo),
                   bq=pick(attn.bq), bk=pick(attn.bk), bv=pick(attn.bv))


def transform_qk(attn: Attention, a: Tensor) -> Attention:
    a = a.to(attn.wq)
    a_inv = torch.linalg.inv(a)
    return replace(
        attn,
        wq=a.transpose(-1, -2) @ attn.wq,
        bq=_row_times(attn.bq, a),
        wk=a_inv @ attn.wk,
        bk=_row_times(attn.bk, a_inv.transpose(-1, -2)),
    )


def transform_vo(attn: Attention, b: Tensor) -> Attention:
    b = b.to(attn.wv)
    b_inv_t = torch.linalg.inv(b).transpose(-1, -2)
    return replace(
        attn,
        wv=b.transpose(-1, -2) @ attn.wv,
        bv=_row_times(attn.bv, b),
        wo=attn.wo @ b_inv_t,
    )


def apply_layer(view: ModelView, i: int, t: LayerTransform) -> ModelView:
    blk = view.blocks[i]
    attn, ffn = blk.attn, blk.ffn
    if t.heads is not None:
        attn = permute_heads(attn, t.heads)
    if t.qk is not None:
        attn = transform_qk(attn, t.qk)
    if t.vo is not None:
        attn = transform_vo(attn, t.vo)
    if t.perm is not None:
        ffn = permute_ffn(ffn, t.perm)
    return view.with_block(i, replace(blk, attn=attn, ffn=ffn))


def apply(view: ModelView, transforms: Mapping[int, LayerTransform]) -> ModelView:
    """Apply one group element per block; blocks not named stay the same tensors."""
    for i, t in transforms.items():
        view = apply_layer(view, i, t)
    return view


# ---- random group elements, for tests, demos and the Learn page ----------------------------


def random_orthogonal(n_heads: int, d: int, gen: torch.Generator, dtype=torch.float64) -> Tensor:
    """Haar-random orthogonal matrices (H, d, d): QR of a Gaussian with the sign fix."""
    g = torch.randn(n_heads, d, d, generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return q.to(dtype)


def random_transform(
    dims: Dims,
    seed: int,
    ffn: bool = True,
    attn: bool = True,
    rescale: bool = True,
    scale_range: tuple[float, float] = (0.5, 2.0),
    heads: bool = False,
) -> LayerTransform:
    """A random element of the seed paper's group for one block (seeded, reproducible).

    `heads` adds a random head permutation, drawn last so the other parts stay the same."""
    gen = torch.Generator().manual_seed(seed)
    h, dh = dims.n_heads, dims.d_head
    perm = torch.randperm(dims.d_ffn, generator=gen) if ffn else None
    qk = vo = None
    if attn or rescale:
        eye = torch.eye(dh, dtype=torch.float64).expand(h, dh, dh)
        qk = random_orthogonal(h, dh, gen) if attn else eye.clone()
        vo = random_orthogonal(h, dh, gen) if attn else eye.clone()
        if rescale:
            lo, hi = scale_range
            a = lo + (hi - lo) * torch.rand(h, 1, 1, generator=gen, dtype=torch.float64)
            b = lo + (hi - lo) * torch.rand(h, 1, 1, generator=gen, dtype=torch.float64)
            qk, vo = qk * a, vo * b
    head_perm = torch.randperm(h, generator=gen) if heads else None
    return LayerTransform(perm, qk, vo, head_perm)


def random_element(dims: Dims, seed: int, **kinds) -> dict[int, LayerTransform]:
    """A random group element for the whole model: one independent draw per block."""
    return {i: random_transform(dims, seed * 1000 + i, **kinds) for i in range(dims.n_layers)}

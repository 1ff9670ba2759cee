"""Symmetry actions on the canonical view. Each returns new tensors; inputs are never touched.

Conventions (row vectors, `y = x W^T + b`, REFERENCE.md):
- FFN permutation `perm`: new unit k is old unit perm[k].
- Q-K map A (per head, invertible): W_Q -> A^T W_Q, b_Q -> b_Q A, W_K -> A^-1 W_K, b_K -> b_K A^-T.
  Scores q k^T are unchanged because A A^-1 = I.
- V-O map B (per head, invertible): W_V -> B^T W_V, b_V -> b_V B, W_O[:, h] -> W_O[:, h] B^-T.
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

    def then(self, other: LayerTransform) -> LayerTransform:
        """The element that applies `self` first, then `other`."""
        perm = _compose_opt(self.perm, other.perm, lambda p1, p2: p1[p2])
        qk = _compose_opt(self.qk, other.qk, lambda a1, a2: a1 @ a2.to(a1.dtype))
        vo = _compose_opt(self.vo, other.vo, lambda b1, b2: b1 @ b2.to(b1.dtype))
        return LayerTransform(perm, qk, vo)


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
) -> LayerTransform:
    """A random element of the seed paper's group for one block (seeded, reproducible)."""
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
    return LayerTransform(perm, qk, vo)


def random_element(dims: Dims, seed: int, **kinds) -> dict[int, LayerTransform]:
    """A random group element for the whole model: one independent draw per block."""
    return {i: random_transform(dims, seed * 1000 + i, **kinds) for i in range(dims.n_layers)}

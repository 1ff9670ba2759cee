"""The conserved quantities of gradient flow that each continuous symmetry of a transformer
block implies (Zhao, Ganev, Walters, Yu and Dehmamy, ICLR 2023), in rotviz's conventions
(rotviz.symmetry.actions; the group's algebra as rotviz.analysis.tangents lists it). The
`conserved` record (rotviz.measures.conserved) measures them over a series of checkpoints;
docs/landscape.md ("conserved") gives the derivation.

Write a head's query rows with their bias as one d_h x (d + 1) matrix Qt = [W_Q | b_Q^T]
(DeBERTa's position projections, which move as W_Q does, appended), likewise Kt, Vt. Along
A = I + eps X the Q-K map moves Qt by X^T Qt and Kt by -X Kt, so L's invariance gives, for
every X of the algebra, <X, S> = 0 with S = sum_h Qt_h G_Qh^T - G_K Kt^T (G: the gradients).
Under gradient flow (dtheta/dt = -G) the Grams move as d(Qt Qt^T)/dt = -(Qt G^T + G Qt^T), so

    M_qk = sum over the group's query heads of Qt_h Qt_h^T - Kt Kt^T      (d_h x d_h, symmetric)

has dM/dt = -(S + S^T), and <X, M> is conserved for every X of the algebra with X + X^T in
it: for the full GL(d_h), all of M. A rotation X (antisymmetric) pairs to zero with the
symmetric M: rotations conserve nothing. Under rotary embeddings the algebra is, per
frequency pair (i, j), a scale E_ii + E_jj and a rotation, and all of gl on the free dims:
the conserved components are the per-pair traces M_ii + M_jj and M's free block. Under q/k
norms (Qwen3) only rotations remain: nothing is conserved. The V-O map (Vt -> B^T Vt,
W_O[:, h] -> W_O[:, h] B^-T) gives M_vo = Vt Vt^T - sum_h W_O[:, h]^T W_O[:, h]. An FFN
unit's scale (ReLU, or the up row of a gated FFN) gives |w_in_k|^2 + b_in_k^2 -
|w_out[:, k]|^2. With weight decay (dtheta/dt = -G - lambda theta) each gains -2 lambda Q:
Q(t) = Q(0) exp(-2 lambda t).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rotviz.groups import rope_free, rope_pairs
from rotviz.symmetry.view import Attention, Dims, ModelView

Tensor = torch.Tensor
KINDS = ("qk", "vo", "ffn")
NAMES = {"qk": "Q-K map (per KV group)", "vo": "V-O map (per KV group)",
         "ffn": "FFN unit scale (per unit)"}


@dataclass(frozen=True)
class Quantities:
    """One checkpoint's conserved quantities, per block: for qk and vo one flat vector of
    components per KV group, with its scale (the Frobenius norms of the two Gram terms
    summed); for ffn one value per unit, with its scale (the two squared norms summed).
    A kind the model's symmetry lacks holds empty lists."""

    qk: list[list[Tensor]]
    qk_scale: list[list[float]]
    vo: list[list[Tensor]]
    vo_scale: list[list[float]]
    ffn: list[Tensor]
    ffn_scale: list[Tensor]


def which(dims: Dims, has_ffn_scales: bool) -> dict[str, str]:
    """Why each kind conserves something in this architecture, or why it does not (a
    sentence each; the record's JSON holds them)."""
    if dims.qk_norm:
        qk = ("none: per-head q/k norms leave only rotations of the Q-K map, and a rotation "
              "conserves nothing")
    elif dims.rope:
        qk = ("per rotary pair (i, j) the trace M_ii + M_jj (the pair's scale), then M's "
              "block on the dims rotary embeddings leave alone, row-major")
    else:
        qk = "M = sum_h Qt_h Qt_h^T - Kt Kt^T, d_h x d_h, row-major"
    vo = "M = Vt Vt^T - sum_h W_O[:, h]^T W_O[:, h], d_h x d_h, row-major"
    if has_ffn_scales:
        ffn = "per unit k: |w_in_k|^2 + b_in_k^2 - |w_out[:, k]|^2"
    else:
        ffn = (f"none: the FFN's activation ({dims.activation}) is not positively "
               "homogeneous, so no unit scale is a symmetry")
    return {"qk": qk, "vo": vo, "ffn": ffn}


def conserves(dims: Dims, has_ffn_scales: bool) -> dict[str, bool]:
    """Whether each kind conserves anything in this architecture."""
    return {"qk": not dims.qk_norm, "vo": True, "ffn": has_ffn_scales}


def _rows(w: Tensor, b: Tensor | None, *more: Tensor | None) -> Tensor:
    """[W | b^T | further projections...]: the rows a map moves together (d_h x ...)."""
    parts = [w]
    for t in (b, *more):
        if t is not None:
            parts.append(t if t.dim() == 2 else t[:, None])
    return torch.cat(parts, dim=1)


def _gram(x: Tensor) -> Tensor:
    return x @ x.T


def _qk_rows(a: Attention, h: int, g: int) -> tuple[Tensor, Tensor]:
    """Query head h's and KV head g's rows (weights, biases, position projections)."""
    q = _rows(a.wq[h], a.bq[h] if a.bq is not None else None,
              a.wpq[h] if a.wpq is not None else None,
              a.bpq[h] if a.bpq is not None else None)
    k = _rows(a.wk[g], a.bk[g] if a.bk is not None else None,
              a.wpk[g] if a.wpk is not None else None,
              a.bpk[g] if a.bpk is not None else None)
    return q, k


def _components(m: Tensor, rope: str | None) -> Tensor:
    """The conserved components of a symmetric Q-K matrix M (see `which`)."""
    if rope is None:
        return m.reshape(-1)
    dh = m.shape[0]
    first, second = rope_pairs(dh, rope)
    free = rope_free(dh, rope)
    traces = m[first, first] + m[second, second]
    return torch.cat([traces, m[free[:, None], free].reshape(-1)])


def attention_quantities(a: Attention, dims: Dims, kind: str) -> tuple[list[Tensor],
                                                                        list[float]]:
    """Per KV group: the conserved components of M (kind qk or vo) and its scale."""
    gs = dims.group_size
    values, scales = [], []
    for g in range(a.n_kv_heads):
        heads = range(g * gs, (g + 1) * gs)
        if kind == "qk":
            gq = sum(_gram(_qk_rows(a, h, g)[0]) for h in heads)
            gk = _gram(_qk_rows(a, heads[0], g)[1])
            m = gq - gk
            values.append(_components(m, dims.rope))
        else:
            gq = _gram(_rows(a.wv[g], a.bv[g] if a.bv is not None else None))
            gk = sum(a.wo[h].T @ a.wo[h] for h in heads)
            values.append((gq - gk).reshape(-1))
        scales.append(float(torch.linalg.norm(gq) + torch.linalg.norm(gk)))
    return values, scales


def ffn_quantities(w_in: Tensor, b_in: Tensor | None, w_out: Tensor) -> tuple[Tensor, Tensor]:
    """Per unit k: |w_in_k|^2 + b_in_k^2 - |w_out[:, k]|^2, and the two terms summed."""
    up = (w_in ** 2).sum(1) + (b_in ** 2 if b_in is not None else 0.0)
    down = (w_out ** 2).sum(0)
    return up - down, up + down


def quantities(view: ModelView, has_ffn_scales: bool) -> Quantities:
    """Every conserved quantity of one checkpoint's view (float64 advised)."""
    dims = view.dims
    on = conserves(dims, has_ffn_scales)
    out = Quantities([], [], [], [], [], [])
    for blk in view.blocks:
        if on["qk"]:
            v, s = attention_quantities(blk.attn, dims, "qk")
            out.qk.append(v)
            out.qk_scale.append(s)
        v, s = attention_quantities(blk.attn, dims, "vo")
        out.vo.append(v)
        out.vo_scale.append(s)
        if on["ffn"]:
            q, s = ffn_quantities(blk.ffn.w_in, blk.ffn.b_in, blk.ffn.w_out)
            out.ffn.append(q)
            out.ffn_scale.append(s)
    return out


def relative(change: Tensor, scale: Tensor | float) -> Tensor:
    """|change| / scale, where a zero scale (a head or unit whose weights are all zero at
    the start) divides by 1 instead: its drift is then the change itself."""
    s = torch.as_tensor(scale, dtype=change.dtype)
    return change / torch.where(s > 0, s, torch.ones_like(s))

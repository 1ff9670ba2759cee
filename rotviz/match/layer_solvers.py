"""The per-layer solvers of the seed paper's matching (rotviz.match.layers runs them layer by
layer): the FFN's linear assignment and its up/down scales, the cross matrices and Procrustes
gains of Q-K and V-O, the head permutation's scores and assignment, and the Q-K and V-O
rescaling that follows a rotation.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from rotviz.groups import (
    assign,
    best_scale,
    rope_free,
    rope_pairs,
    rope_procrustes,
)
from rotviz.symmetry.actions import (
    qk_fixed_pairs,
)
from rotviz.symmetry.view import Attention, ModelView

Tensor = torch.Tensor


def ffn_cost(anchor: ModelView, source: ModelView, i: int) -> np.ndarray:
    """Eq. 7's matrix <source unit j, anchor unit k> over [W_in, b_in, W_out^T] (and a gated
    FFN's [W_gate, b_gate], which moves with the units), on the CPU."""
    fa, fs = anchor.blocks[i].ffn, source.blocks[i].ffn
    dtype = torch.promote_types(fs.w_in.dtype, torch.float32)

    def c(t: Tensor) -> Tensor:
        return t.detach().to(device=fs.w_in.device, dtype=dtype)

    # C = W_in1 W_in2^T + b_in1^T b_in2 + W_out1^T W_out2 (+ W_gate1 W_gate2^T + b_gate1^T
    # b_gate2), without concatenating copies
    cost = c(fs.w_in) @ c(fa.w_in).t()
    cost.addmm_(c(fs.w_out).t(), c(fa.w_out))
    if fs.b_in is not None and fa.b_in is not None:
        cost.addr_(c(fs.b_in), c(fa.b_in))
    if fs.w_gate is not None and fa.w_gate is not None:
        cost.addmm_(c(fs.w_gate), c(fa.w_gate).t())
        if fs.b_gate is not None and fa.b_gate is not None:
            cost.addr_(c(fs.b_gate), c(fa.b_gate))
    return cost.cpu().numpy()


def ffn_scales(anchor_ffn, source_ffn) -> Tensor:
    """Per unit of a gated FFN (the source already permuted), the scale s minimising
    ||s up_1 - up_2||^2 + ||down_1 / s - down_2||^2 (up rows with their biases, down columns):
    the quartic of Eq. 11-12 with A = ||up_1||^2, B = <up_1, up_2>, C = ||down_1||^2,
    D = <down_1, down_2>. Returns (m,) float64."""
    dtype = torch.promote_types(source_ffn.w_in.dtype, torch.float32)

    def c(t: Tensor) -> Tensor:
        return t.detach().to(device=source_ffn.w_in.device, dtype=dtype)

    up1, up2 = c(source_ffn.w_in), c(anchor_ffn.w_in)
    down1, down2 = c(source_ffn.w_out), c(anchor_ffn.w_out)
    a = (up1 * up1).sum(-1, dtype=torch.float64)
    b = (up1 * up2).sum(-1, dtype=torch.float64)
    if source_ffn.b_in is not None and anchor_ffn.b_in is not None:
        b1, b2 = c(source_ffn.b_in).double(), c(anchor_ffn.b_in).double()
        a, b = a + b1 * b1, b + b1 * b2
    cc = (down1 * down1).sum(0, dtype=torch.float64)
    d = (down1 * down2).sum(0, dtype=torch.float64)
    return best_scale(a, b, cc, d)


def ffn_permutation(anchor: ModelView, source: ModelView, i: int) -> Tensor:
    """Eq. 7: the permutation of source units that best matches the anchor's units."""
    return assign(ffn_cost(anchor, source, i))


def _cross(x: Tensor, y: Tensor, bx: Tensor | None = None, by: Tensor | None = None) -> Tensor:
    """Per head x y^T (+ bx^T by), multiplied in the weights' precision (at least float32)
    and returned in float64: converting whole weight matrices to float64 first would cost
    more than the products."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    m = x.detach().to(dtype) @ y.detach().to(device=x.device, dtype=dtype).transpose(-1, -2)
    if bx is not None and by is not None:
        m = m + bx.detach().to(dtype).unsqueeze(-1) * by.detach().to(m).unsqueeze(-2)
    return m.to(torch.float64)


def group_sum(x: Tensor, n_kv: int) -> Tensor:
    """Per-query-head values (H, ...) summed over each KV group's query heads (H_kv, ...)."""
    return x if x.shape[0] == n_kv else x.reshape(n_kv, -1, *x.shape[1:]).sum(dim=1)


def qk_parts(src: Attention, anc: Attention) -> tuple[Tensor, Tensor]:
    """The Q and K terms of the Q-K cross matrix, per KV group (H_kv, d_h, d_h), float64: the
    Q term sums the group's query heads."""
    mq = group_sum(_cross(src.wq, anc.wq, src.bq, anc.bq), src.n_kv_heads)
    mk = _cross(src.wk, anc.wk, src.bk, anc.bk)
    if src.wpq is not None:  # projections that move as W_Q (DeBERTa's position queries)
        mq = mq + group_sum(_cross(src.wpq, anc.wpq, src.bpq, anc.bpq), src.n_kv_heads)
    if src.wpk is not None:
        mk = mk + _cross(src.wpk, anc.wpk, src.bpk, anc.bpk)
    return mq, mk


def vo_parts(src: Attention, anc: Attention) -> tuple[Tensor, Tensor]:
    """The V and O terms of the V-O cross matrix, per KV group (H_kv, d_h, d_h), float64: the
    O term sums the group's query heads."""
    wo_s, wo_a = src.wo.transpose(-1, -2), anc.wo.transpose(-1, -2)  # (H, d_h, d)
    return _cross(src.wv, anc.wv, src.bv, anc.bv), group_sum(_cross(wo_s, wo_a), src.n_kv_heads)


def cross_qk(src: Attention, anc: Attention) -> Tensor:
    """M = W_Q1 W_Q2^T + W_K1 W_K2^T + b_Q1^T b_Q2 + b_K1^T b_K2, per head (per KV group, Q
    summed over its query heads), in float64."""
    mq, mk = qk_parts(src, anc)
    return mq + mk


def cross_vo(src: Attention, anc: Attention) -> Tensor:
    """M = W_V1 W_V2^T + b_V1^T b_V2 + W_O1[:, h]^T W_O2[:, h], per head (per KV group, O
    summed over its query heads), in float64."""
    mv, mo = vo_parts(src, anc)
    return mv + mo


def qk_gain(m: Tensor, rope: str | None = None, fixed: Tensor | None = None) -> Tensor:
    """max tr(R^T M) over the Q-K rotations allowed: the nuclear norm of M, or under rotary
    embeddings the sum of the per-pair gains (see `rope_procrustes`; `fixed`: pairs that
    may only turn by 0 or pi). For a batch (...)."""
    if rope is None:
        return torch.linalg.svdvals(m).sum(dim=-1)
    return rope_procrustes(m, rope, fixed)[1].sum(dim=-1)


def _cross_all(x: Tensor, y: Tensor, bx: Tensor | None = None,
               by: Tensor | None = None) -> Tensor:
    """x_i y_j^T (+ bx_i^T by_j) for every pair of heads (H, H, d_h, d_h), in float64: one
    (H d_h) x (H d_h) product, cut into blocks."""
    h, dh = x.shape[:2]
    dtype = torch.promote_types(x.dtype, torch.float32)
    xf = x.detach().to(dtype).reshape(h * dh, -1)
    yf = y.detach().to(device=x.device, dtype=dtype).reshape(h * dh, -1)
    m = xf @ yf.t()
    if bx is not None and by is not None:
        m = m + bx.detach().to(dtype).reshape(-1, 1) * by.detach().to(m).reshape(1, -1)
    return m.reshape(h, dh, h, dh).permute(0, 2, 1, 3).to(torch.float64)


def pair_parts(src: Attention, anc: Attention) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The Q, K, V and O terms of the cross matrices of every (source head i, anchor head j)
    pair, each (H, H, d_h, d_h) float64 (K and V: (H_kv, H_kv, d_h, d_h), pairs of KV heads);
    `[i, i]` is what qk_parts/vo_parts give for head i without grouped-query attention."""
    wo_s, wo_a = src.wo.transpose(-1, -2), anc.wo.transpose(-1, -2)  # (H, d_h, d)
    mq = _cross_all(src.wq, anc.wq, src.bq, anc.bq)
    mk = _cross_all(src.wk, anc.wk, src.bk, anc.bk)
    if src.wpq is not None:  # projections that move as W_Q / W_K (DeBERTa's positions)
        mq = mq + _cross_all(src.wpq, anc.wpq, src.bpq, anc.bpq)
    if src.wpk is not None:
        mk = mk + _cross_all(src.wpk, anc.wpk, src.bpk, anc.bpk)
    return mq, mk, _cross_all(src.wv, anc.wv, src.bv, anc.bv), _cross_all(wo_s, wo_a)


# Under grouped-query attention, the query heads of each (source group, anchor group) pair
# are assigned by trying every order when there are at most this many (r! for r query heads
# per group, so up to r = 4: exact), else by a linear assignment on per-head gains.
EXACT_INNER = 24


def _pair_gain(qk: Tensor, vo: Tensor, rope: str | None, solve,
               fixed: Tensor | None = None) -> Tensor:
    """Per pair of heads or groups: max tr(R^T M_QK) + max tr(R^T M_VO), float64."""
    if rope is None:
        sv = torch.linalg.svdvals(torch.stack([qk, vo]).to(solve))
        return sv.double().sum(dim=-1).sum(dim=0)
    return (qk_gain(qk, rope, fixed).double()
            + torch.linalg.svdvals(vo.to(solve)).double().sum(dim=-1))


def gain_dots(src: Attention, anc: Attention) -> tuple[Tensor, Tensor] | None:
    """Under q/k norms over the whole projection (OLMo-2), whose gain rows move with their
    heads: the inner products of every (source, anchor) pair of query heads' q gains (H, H)
    and of key heads' k gains (H_kv, H_kv), float64, which a head assignment adds to its gain
    (the gains' distance is their norms less twice these). None for other models."""
    if src.gq is None or src.gq.dim() != 2:
        return None
    return tuple(x.detach().double().cpu() @ y.detach().double().cpu().t()
                 for x, y in ((src.gq, anc.gq), (src.gk, anc.gk)))


def _group_pairs(parts: tuple[Tensor, Tensor, Tensor, Tensor], rope: str | None, solve,
                 fixed: Tensor | None = None, dots: tuple[Tensor, Tensor] | None = None):
    """For every (source group g, anchor group g'): the assignment of g's query heads to those
    of g' that maximises the pair's gain, and that gain.

    Returns (gain (H_kv, H_kv), inner (H_kv, H_kv, r) long: anchor head k of g' gets source
    head g r + inner[g, g', k], and the four cross terms summed under that assignment, each
    (H_kv, H_kv, d_h, d_h)). Without grouped-query attention (r = 1) the gain is what
    `head_gain` always gave: ||M_QK[i, j]||_* + ||M_VO[i, j]||_*. With r! <= EXACT_INNER
    every order is tried (exact); beyond, the order comes from a linear assignment on the
    gains of single query-head pairs (their Q and O terms), a heuristic. `dots`
    (`gain_dots`): the q/k norm gains that move with the heads, added to each pair's gain."""
    mq, mk, mv, mo = parts
    h, h_kv = mq.shape[0], mk.shape[0]
    r = h // h_kv
    g_idx = torch.arange(h_kv)
    anc_heads = (g_idx[None, :, None] * r + torch.arange(r)).expand(h_kv, h_kv, r)

    def moved_gains(inner: Tensor) -> Tensor | float:
        if dots is None:
            return 0.0
        src_heads = g_idx[:, None, None] * r + inner
        return dots[0][src_heads, anc_heads].sum(dim=2) + dots[1]

    def summed(inner: Tensor) -> tuple[Tensor, Tensor]:
        src_heads = g_idx[:, None, None] * r + inner  # (H_kv, H_kv, r)
        return mq[src_heads, anc_heads].sum(dim=2), mo[src_heads, anc_heads].sum(dim=2)

    if r == 1:
        inner = torch.zeros(h, h, 1, dtype=torch.long)
        sq, so = mq, mo
    elif math.factorial(r) <= EXACT_INNER:
        orders = torch.tensor(list(itertools.permutations(range(r))), dtype=torch.long)
        best = torch.full((h_kv, h_kv), -math.inf, dtype=torch.float64)
        pick = torch.zeros(h_kv, h_kv, dtype=torch.long)
        for n, order in enumerate(orders):
            sq, so = summed(order.expand(h_kv, h_kv, r))
            gain = (_pair_gain(sq + mk, so + mv, rope, solve, fixed)
                    + moved_gains(order.expand(h_kv, h_kv, r)))
            better = gain > best
            best, pick = torch.where(better, gain, best), torch.where(better, n, pick)
        inner = orders[pick]
        sq, so = summed(inner)
    else:
        # per query-head pair: the Q-K and O gains it brings (an upper bound on what it adds)
        q_score = (qk_gain(mq.to(solve), rope, fixed)
                   + torch.linalg.svdvals(mo.to(solve)).sum(-1))
        if dots is not None:
            q_score = q_score.double() + dots[0]
        blocks = q_score.double().reshape(h_kv, r, h_kv, r).permute(0, 2, 1, 3).numpy()
        inner = torch.stack([torch.stack([assign(blocks[g, g2]) for g2 in range(h_kv)])
                             for g in range(h_kv)])
        sq, so = summed(inner)
    gain = _pair_gain(sq + mk, so + mv, rope, solve, fixed) + moved_gains(inner)
    return gain, inner, (sq, mk, mv, so)


def head_gain(src: Attention, anc: Attention,
              parts: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
              rope: str | None = None) -> Tensor:
    """G[i, j]: the Procrustes gain of rotating source head i onto anchor head j, i.e.
    ||M_QK[i, j]||_* + ||M_VO[i, j]||_* (sums of singular values), (H, H) float64.

    Maximising tr(R^T M) over orthogonal R gives the nuclear norm, and the distance after
    rotation is the head norms (fixed) minus twice it, so the best head assignment maximises
    the summed gain. All H x H pairs of both kinds go through one batched SVD, float32
    unless the weights are float64 (as for the rotations). Under rotary embeddings the Q-K
    term is the gain of the per-pair rotations instead; under grouped-query attention G is
    over KV groups (H_kv, H_kv), each with its query heads assigned inside first."""
    parts = tuple(p.cpu() for p in (parts if parts is not None else pair_parts(src, anc)))
    solve = torch.float64 if src.wq.dtype == torch.float64 else torch.float32
    return _group_pairs(parts, rope, solve, qk_fixed_pairs(src, rope), gain_dots(src, anc))[0]


def _assign_heads(parts, rope: str | None, solve, fixed: Tensor | None = None,
                  dots: tuple[Tensor, Tensor] | None = None
                  ) -> tuple[Tensor, tuple[Tensor, ...]]:
    """The head permutation (new head k = source head perm[k]) maximising the summed gain,
    keeping KV groups whole, and the Q, K, V, O cross terms of each new group vs the anchor's
    group (H_kv, d_h, d_h) each."""
    gain, inner, (sq, mk, mv, so) = _group_pairs(parts, rope, solve, fixed, dots)
    groups = assign(gain.numpy())  # new group g' = source group groups[g']
    h_kv, r = inner.shape[0], inner.shape[-1]
    idx = torch.arange(h_kv)
    heads = (groups[:, None] * r + inner[groups, idx]).reshape(-1)
    return heads, (sq[groups, idx], mk[groups, idx], mv[groups, idx], so[groups, idx])


def head_permutation(src: Attention, anc: Attention, rope: str | None = None) -> Tensor:
    """The head permutation (new head k = source head perm[k]) maximising the summed gain;
    under grouped-query attention it moves whole KV groups."""
    solve = torch.float64 if src.wq.dtype == torch.float64 else torch.float32
    parts = tuple(p.cpu() for p in pair_parts(src, anc))
    return _assign_heads(parts, rope, solve, qk_fixed_pairs(src, rope), gain_dots(src, anc))[0]


def _head_sq(w: Tensor, b: Tensor | None = None) -> Tensor:
    """Per head ||W_h||^2 + ||b_h||^2, summed in float64."""
    out = (w * w).sum(dim=tuple(range(1, w.dim())), dtype=torch.float64)
    if b is not None:
        out = out + (b * b).sum(dim=-1, dtype=torch.float64)
    return out


def _q_sq(a: Attention) -> Tensor:
    """Per query head, ||W_Q||^2 + ||b_Q||^2 and the same of what moves as W_Q."""
    out = _head_sq(a.wq, a.bq)
    return out if a.wpq is None else out + _head_sq(a.wpq, a.bpq)


def _k_sq(a: Attention) -> Tensor:
    """Per key/value head, ||W_K||^2 + ||b_K||^2 and the same of what moves as W_K."""
    out = _head_sq(a.wk, a.bk)
    return out if a.wpk is None else out + _head_sq(a.wpk, a.bpk)


def _trace(r: Tensor, m: Tensor) -> Tensor:
    """Per head tr(R^T M)."""
    return (r * m).sum(dim=(-2, -1))


def scales_after(
    src: Attention, r_qk: Tensor, r_vo: Tensor, parts_qk, parts_vo
) -> tuple[Tensor, Tensor]:
    """Eq. 11-12 for the source rotated by (r_qk, r_vo), without forming the rotated weights;
    one scale per head (per KV group: its query heads' Q and O terms summed).

    Rotations keep norms, and <R^T W_1, W_2> = tr(R^T W_1 W_2^T), so every coefficient
    comes from the per-kind cross matrices already computed for the Procrustes step."""
    (mq, mk), (mv, mo) = parts_qk, parts_vo
    n_kv = src.n_kv_heads
    a = best_scale(group_sum(_q_sq(src), n_kv), _trace(r_qk, mq), _k_sq(src), _trace(r_qk, mk))
    b = best_scale(_head_sq(src.wv, src.bv), _trace(r_vo, mv),
                   group_sum(_head_sq(src.wo), n_kv), _trace(r_vo, mo))
    return a, b


def _row_sq(w: Tensor, b: Tensor | None = None) -> Tensor:
    """Per head and row ||W_h[i]||^2 + b_h[i]^2, (H, d_h) float64."""
    out = (w * w).sum(dim=-1, dtype=torch.float64)
    if b is not None:
        out = out + (b * b).double()
    return out


def rope_scales_after(src: Attention, r_qk: Tensor, parts_qk, rope: str) -> Tensor:
    """Eq. 11-12 per frequency pair for the source's Q-K rotated by the per-pair rotations
    r_qk (H_kv, d_h, d_h): scaling a pair's rows of W_Q by s and of W_K by 1/s commutes with
    the position rotations. Returns (H_kv, d_h / 2) float64."""
    mq, mk = parts_qk
    i, j = rope_pairs(mq.shape[-1], rope)
    n_kv = src.n_kv_heads

    def pair_sum(x: Tensor) -> Tensor:  # (..., d_h) -> (..., d_h / 2)
        return x[..., i] + x[..., j]

    def pair_trace(m: Tensor) -> Tensor:  # tr(R_p^T M_p) per pair
        p = r_qk * m
        return p[..., i, i] + p[..., i, j] + p[..., j, i] + p[..., j, j]

    big_a = pair_sum(group_sum(_row_sq(src.wq, src.bq), n_kv).cpu())
    big_c = pair_sum(_row_sq(src.wk, src.bk).cpu())
    s = best_scale(big_a.reshape(-1), pair_trace(mq).reshape(-1), big_c.reshape(-1),
                   pair_trace(mk).reshape(-1))
    return s.reshape(big_a.shape)


def free_scales_after(src: Attention, r_qk: Tensor, parts_qk, rope: str) -> Tensor | None:
    """Eq. 11-12 for the block of dims rotary embeddings leave alone (partial rotary), one
    scale per head (per KV group) for the whole block, as the seed paper scales a head;
    None when rotary embeddings turn every dim."""
    mq, mk = parts_qk
    k = rope_free(mq.shape[-1], rope)
    if not len(k):
        return None
    n_kv = src.n_kv_heads

    def block(x: Tensor) -> Tensor:  # (..., d_h, d_h) -> its free block
        return x[..., k[:, None], k]

    big_a = group_sum(_row_sq(src.wq, src.bq), n_kv).cpu()[..., k].sum(dim=-1)
    big_c = _row_sq(src.wk, src.bk).cpu()[..., k].sum(dim=-1)
    r = block(r_qk)
    return best_scale(big_a, _trace(r, block(mq)), big_c, _trace(r, block(mk)))


def rescale_qk(src: Attention, anc: Attention) -> Tensor:
    """The Q-K scale per head (per KV group) for the source as it is (no rotation)."""
    mq, mk = qk_parts(src, anc)
    eye = torch.eye(mq.shape[-1], dtype=mq.dtype, device=mq.device)
    return best_scale(group_sum(_q_sq(src), src.n_kv_heads), _trace(eye, mq), _k_sq(src),
                      _trace(eye, mk))


def rescale_vo(src: Attention, anc: Attention) -> Tensor:
    """The V-O scale per head (per KV group) for the source as it is (no rotation)."""
    mv, mo = vo_parts(src, anc)
    eye = torch.eye(mv.shape[-1], dtype=mv.dtype, device=mv.device)
    return best_scale(_head_sq(src.wv, src.bv), _trace(eye, mv),
                      group_sum(_head_sq(src.wo), src.n_kv_heads), _trace(eye, mo))

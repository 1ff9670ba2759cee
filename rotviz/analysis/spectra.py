"""Per-layer, per-head spectra: what a rotation can align, and what no symmetry can change.

With (out, in) weights and row vectors (docs/conventions.md), head h computes scores
x W_Q[h]^T W_K[h] x'^T and writes x W_V[h]^T W_O[:, h]^T. In the view's per-head tensors,
`wq[h]`, `wk[h]`, `wv[h]` are (d_h, d) and `wo[h]` is (d, d_h), so the two circuits are

- Q-K circuit: wq[h]^T @ wk[h] (d x d, rank <= d_h). The Q-K map A sends wq -> A^T wq and
  wk -> A^-1 wk, so wq^T A A^-1 wk = wq^T wk: invariant for every invertible A.
- V-O circuit: wv[h]^T @ wo[h]^T (d x d, rank <= d_h). The V-O map B sends wv -> B^T wv and
  wo -> wo B^-T, so wv^T B (wo B^-T)^T = wv^T B B^-1 wo^T = wv^T wo^T: invariant.

Only their d_h non-zero singular values carry information. They are computed exactly from the
d_h x d_h product R_1 R_2^T of the QR factors (X^T = Q_1 R_1, Y^T = Q_2 R_2 give
X^T Y = Q_1 (R_1 R_2^T) Q_2^T with orthonormal Q_1, Q_2), never from the d x d matrix.

The cross matrices M_QK and M_VO (source vs anchor, rotation/Procrustes inputs) have singular
values that bound how far a rotation can align the head: the alignment <source, anchor> of
the head is tr(M) before and at most the sum of the singular values after rotation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from rotviz.groups import procrustes, rotation_angles
from rotviz.match.layer_solvers import cross_qk, cross_vo
from rotviz.match.pipeline import view_of
from rotviz.symmetry.view import Attention, ModelView

Tensor = torch.Tensor


def circuit_singular_values(x: Tensor, y: Tensor) -> Tensor:
    """Non-zero singular values (d_h of them, descending) of x[h]^T @ y[h] for (H, d_h, d) x, y."""
    x, y = x.detach().double(), y.detach().double()
    _, r1 = torch.linalg.qr(x.transpose(-1, -2))  # (H, d_h, d_h)
    _, r2 = torch.linalg.qr(y.transpose(-1, -2))
    return torch.linalg.svdvals(r1 @ r2.transpose(-1, -2))


def _per_query_head(kv: Tensor, n_heads: int) -> Tensor:
    """K or V of each query head: under grouped-query attention a group's query heads share
    one K/V head."""
    return kv.repeat_interleave(n_heads // kv.shape[0], dim=0)


def qk_circuit(attn: Attention) -> Tensor:
    """(H, d_h) singular values of W_Q[h]^T W_K[h], invariant under the Q-K maps."""
    return circuit_singular_values(attn.wq, _per_query_head(attn.wk, attn.wq.shape[0]))


def vo_circuit(attn: Attention) -> Tensor:
    """(H, d_h) singular values of W_V[h]^T W_O[:, h]^T, invariant under the V-O maps."""
    return circuit_singular_values(_per_query_head(attn.wv, attn.wo.shape[0]),
                                   attn.wo.transpose(-1, -2))


@dataclass
class LayerSpectra:
    """One layer; every list is per head (H entries), inner lists have d_h values."""

    layer: int
    qk_cross: list[list[float]]  # singular values of M_QK (source vs anchor), descending
    vo_cross: list[list[float]]
    qk_trace: list[float]  # tr(M_QK): the head's Q-K alignment before rotating
    vo_trace: list[float]
    qk_angles: list[list[float]]  # eigen-angles (degrees) of the optimal rotation R = U V^T
    vo_angles: list[list[float]]
    qk_det: list[float]  # +1 rotation, -1 reflection
    vo_det: list[float]
    anchor_qk: list[list[float]]  # invariant circuit spectra of each model
    source_qk: list[list[float]]
    anchor_vo: list[list[float]]
    source_vo: list[list[float]]
    matched_qk: list[list[float]] = field(default_factory=list)
    matched_vo: list[list[float]] = field(default_factory=list)


@dataclass
class Spectra:
    layers: list[LayerSpectra]
    n_heads: int
    d_head: int
    # largest relative change of any circuit singular value, source -> matched (None: no matched)
    max_circuit_change: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _as_view(model) -> ModelView:
    if isinstance(model, ModelView):
        return model

    return view_of(model)


def head_set_change(before: Tensor, after: Tensor) -> float:
    """The largest change of any circuit singular value from `before` to `after` (H, k),
    relative to the largest: with heads paired as closely as they can be (a head permutation
    moves whole heads, so matched head k is some source head; the pairing is the assignment
    of least total change, exact for a set of heads merely reordered)."""
    from scipy.optimize import linear_sum_assignment

    scale = before.abs().max().clamp_min(1e-30)
    cost = (after[:, None, :] - before[None, :, :]).abs().amax(-1)
    rows, cols = linear_sum_assignment(cost.double().cpu().numpy())
    return float(cost[rows, cols].max() / scale)


def spectra(anchor_view, source_view, matched_view=None, layers=None) -> Spectra:
    """spectra(anchor_view, source_view, matched_view=None, layers=None) -> Spectra

    Cross-matrix singular values, optimal-rotation angles and invariant circuit spectra per
    layer and head. Views (or Loaded models) of one architecture; `layers` limits the layers.
    """
    anchor, source = _as_view(anchor_view), _as_view(source_view)
    matched = None if matched_view is None else _as_view(matched_view)
    idx = range(anchor.dims.n_layers) if layers is None else layers
    out: list[LayerSpectra] = []
    change = 0.0
    for i in idx:
        a, s = anchor.blocks[i].attn, source.blocks[i].attn
        m = torch.stack([cross_qk(s, a), cross_vo(s, a)])  # (2, H, d_h, d_h), float64
        r, sv = procrustes(m)
        ang, det = rotation_angles(r)
        tr = torch.diagonal(m, dim1=-2, dim2=-1).sum(-1)
        src_qk, src_vo = qk_circuit(s), vo_circuit(s)
        ls = LayerSpectra(
            layer=i, qk_cross=sv[0].tolist(), vo_cross=sv[1].tolist(),
            qk_trace=tr[0].tolist(), vo_trace=tr[1].tolist(),
            qk_angles=ang[0].tolist(), vo_angles=ang[1].tolist(),
            qk_det=det[0].tolist(), vo_det=det[1].tolist(),
            anchor_qk=qk_circuit(a).tolist(), source_qk=src_qk.tolist(),
            anchor_vo=vo_circuit(a).tolist(), source_vo=src_vo.tolist(),
        )
        if matched is not None:
            mt = matched.blocks[i].attn
            m_qk, m_vo = qk_circuit(mt), vo_circuit(mt)
            ls.matched_qk, ls.matched_vo = m_qk.tolist(), m_vo.tolist()
            for before, after in ((src_qk, m_qk), (src_vo, m_vo)):
                change = max(change, head_set_change(before, after))
        out.append(ls)
    return Spectra(out, anchor.dims.n_heads, anchor.dims.d_head,
                   None if matched is None else change)

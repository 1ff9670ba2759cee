"""The seed paper's matching (Algorithm 1): move the source next to the anchor in its class.

- FFN (Eq. 7): linear assignment on [W_in, b_in, W_out^T].
- Attention (Theorem 4.1): per-head orthogonal Procrustes for Q-K and V-O, biases included,
  all heads of a layer in one batched SVD.
- Rescaling (Eq. 11-12): per head, the real root of A a^4 - B a^3 + D a - C = 0 that minimises
  f(a) = A a^2 - 2 B a + C / a^2 - 2 D / a.
The anchor is never changed; the source's view is replaced, not modified.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from rotviz.actions import LayerTransform, apply_layer
from rotviz.distances import Distances, distances
from rotviz.errors import RotvizError
from rotviz.view import Attention, ModelView

Tensor = torch.Tensor
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class MatchOptions:
    ffn: bool = True
    attn: bool = True
    rescale: bool = True
    layers: tuple[int, ...] | None = None  # None = every layer

    @property
    def label(self) -> str:
        parts = [p for p, on in (("ffn", self.ffn), ("attn", self.attn), ("rescale", self.rescale)) if on]
        return ",".join(parts) or "none"


@dataclass
class HeadReport:
    """Per layer, per head: what matching saw and did."""

    layer: int
    qk_singular: list[list[float]] = field(default_factory=list)  # (H, d_h)
    vo_singular: list[list[float]] = field(default_factory=list)
    qk_angles: list[list[float]] = field(default_factory=list)  # degrees, (H, d_h)
    vo_angles: list[list[float]] = field(default_factory=list)
    qk_det: list[float] = field(default_factory=list)
    vo_det: list[float] = field(default_factory=list)
    qk_scale: list[float] = field(default_factory=list)
    vo_scale: list[float] = field(default_factory=list)
    ffn_moved: int = 0  # FFN units that changed position


@dataclass
class MatchReport:
    options: MatchOptions
    before: Distances
    after: Distances
    layers: list[HeadReport]
    seconds: float = 0.0
    max_output_diff: float | None = None  # filled by the function check

    def to_dict(self) -> dict:
        o = self.options
        return {
            "options": {"ffn": o.ffn, "attn": o.attn, "rescale": o.rescale,
                        "layers": list(o.layers) if o.layers is not None else None},
            "distance_before": self.before.to_dict(),
            "distance_after": self.after.to_dict(),
            "heads": [vars(h) for h in self.layers],
            "max_output_diff": self.max_output_diff,
            "seconds": self.seconds,
        }


@dataclass
class MatchResult:
    view: ModelView
    transforms: dict[int, LayerTransform]
    report: MatchReport


# ---- solvers --------------------------------------------------------------------------------


def ffn_permutation(anchor: ModelView, source: ModelView, i: int) -> Tensor:
    """Eq. 7: the permutation of source units that best matches the anchor's units."""
    fa, fs = anchor.blocks[i].ffn, source.blocks[i].ffn
    dtype = torch.promote_types(fs.w_in.dtype, torch.float32)
    feats = []
    for f in (fs, fa):
        cols = [f.w_in.to(dtype), f.w_out.t().to(dtype)]
        if f.b_in is not None:
            cols.append(f.b_in.to(dtype).unsqueeze(1))
        feats.append(torch.cat(cols, dim=1))
    cost = (feats[0] @ feats[1].to(feats[0].device).t()).cpu().numpy()  # (source unit, anchor unit)
    rows, cols = linear_sum_assignment(cost, maximize=True)
    perm = np.empty_like(rows)
    perm[cols] = rows
    return torch.as_tensor(perm, dtype=torch.long)


def _pair(x: Tensor | None, y: Tensor | None) -> Tensor | None:
    """Per-head cross term x^T y for bias rows: (H, d_h) -> (H, d_h, d_h)."""
    if x is None or y is None:
        return None
    return x.unsqueeze(-1) * y.unsqueeze(-2)


def cross_qk(src: Attention, anc: Attention) -> Tensor:
    """M = W_Q1 W_Q2^T + W_K1 W_K2^T + b_Q1^T b_Q2 + b_K1^T b_K2, per head, in float64."""
    s, a = _f64(src), _f64(anc)
    m = s.wq @ a.wq.transpose(-1, -2) + s.wk @ a.wk.transpose(-1, -2)
    for t in (_pair(s.bq, a.bq), _pair(s.bk, a.bk)):
        if t is not None:
            m = m + t
    return m


def cross_vo(src: Attention, anc: Attention) -> Tensor:
    """M = W_V1 W_V2^T + b_V1^T b_V2 + W_O1[:, h]^T W_O2[:, h], per head, in float64."""
    s, a = _f64(src), _f64(anc)
    m = s.wv @ a.wv.transpose(-1, -2) + s.wo.transpose(-1, -2) @ a.wo
    t = _pair(s.bv, a.bv)
    return m if t is None else m + t


def _f64(a: Attention) -> Attention:
    def c(t):
        return None if t is None else t.detach().to(torch.float64)

    return Attention(*(c(getattr(a, f)) for f in Attention.__dataclass_fields__))


def procrustes(m: Tensor) -> tuple[Tensor, Tensor]:
    """argmax_R tr(R^T M) over orthogonal R, for a batch of M: R = U V^T. Returns (R, S)."""
    u, s, vh = torch.linalg.svd(m)
    return u @ vh, s


def _sq(*ts: Tensor | None) -> Tensor:
    return sum(torch.sum(t * t, dim=tuple(range(1, t.dim()))) for t in ts if t is not None)


def _dot(pairs) -> Tensor:
    return sum(
        torch.sum(x * y, dim=tuple(range(1, x.dim()))) for x, y in pairs if x is not None and y is not None
    )


def best_scale(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> Tensor:
    """Per head, the real non-zero root of A s^4 - B s^3 + D s - C minimising the objective."""
    coeffs = torch.stack([a, -b, torch.zeros_like(a), d, -c], dim=-1).cpu().numpy()
    out = np.ones(len(coeffs))
    for h, co in enumerate(coeffs):  # H quartics of degree 4: negligible next to the SVD
        if co[0] <= 0 or co[4] >= 0:
            continue  # a zero block: any scale is optimal, keep 1
        roots = np.roots(co)
        real = roots[np.abs(roots.imag) <= 1e-9 * np.maximum(1.0, np.abs(roots))].real
        real = real[real != 0]
        if len(real) == 0:
            continue
        f = co[0] * real**2 + 2 * co[1] * real + (-co[4]) / real**2 - 2 * co[3] / real
        out[h] = real[np.argmin(f)]
    return torch.as_tensor(out, dtype=torch.float64)


def rescale_qk(src: Attention, anc: Attention) -> Tensor:
    s, a = _f64(src), _f64(anc)
    return best_scale(
        _sq(s.wq, s.bq), _dot([(s.wq, a.wq), (s.bq, a.bq)]),
        _sq(s.wk, s.bk), _dot([(s.wk, a.wk), (s.bk, a.bk)]),
    )


def rescale_vo(src: Attention, anc: Attention) -> Tensor:
    s, a = _f64(src), _f64(anc)
    return best_scale(
        _sq(s.wv, s.bv), _dot([(s.wv, a.wv), (s.bv, a.bv)]),
        _sq(s.wo), _dot([(s.wo, a.wo)]),
    )


def rotation_angles(r: Tensor) -> tuple[Tensor, Tensor]:
    """Eigen-angles of each orthogonal map in degrees (sorted, largest first), and det(R)."""
    ang = torch.rad2deg(torch.angle(torch.linalg.eigvals(r)).abs())
    return torch.sort(ang, dim=-1, descending=True).values, torch.linalg.det(r)


# ---- the algorithm --------------------------------------------------------------------------


def parse_layers(spec: str | Sequence[int] | None, n_layers: int) -> tuple[int, ...] | None:
    """'0,2-5' -> (0, 2, 3, 4, 5); checked against the model's layer count."""
    if spec is None or spec == "all":
        return None
    if isinstance(spec, str):
        if not spec.strip():
            raise RotvizError("malformed --layers '': give indices or ranges like 0,2-5, or leave it out")
        out: list[int] = []
        for part in spec.split(","):
            part = part.strip()
            try:
                if "-" in part:
                    lo, hi = (int(x) for x in part.split("-", 1))
                    if hi < lo:
                        raise ValueError
                    out.extend(range(lo, hi + 1))
                else:
                    out.append(int(part))
            except ValueError:
                raise RotvizError(
                    f"malformed --layers '{spec}': use comma-separated indices or ranges like 0,2-5"
                ) from None
    else:
        out = [int(x) for x in spec]
    bad = [i for i in out if not 0 <= i < n_layers]
    if bad:
        raise RotvizError(
            f"--layers {bad} out of range: the model has {n_layers} layers (0-{n_layers - 1})"
        )
    return tuple(sorted(set(out)))


def match(
    anchor: ModelView,
    source: ModelView,
    options: MatchOptions = MatchOptions(),
    progress: Progress | None = None,
) -> MatchResult:
    """Match `source` onto `anchor`. Returns the matched view, the group element and a report."""
    import time

    t0 = time.perf_counter()
    layers = options.layers if options.layers is not None else tuple(range(anchor.dims.n_layers))
    view = source
    transforms: dict[int, LayerTransform] = {}
    reports: list[HeadReport] = []
    for step, i in enumerate(layers):
        if progress:
            progress(step, len(layers), f"matching layer {i}")
        rep = HeadReport(layer=i)
        perm = qk = vo = None
        anc_attn = anchor.blocks[i].attn
        if options.ffn:
            perm = ffn_permutation(anchor, view, i)
            rep.ffn_moved = int((perm != torch.arange(len(perm))).sum())
        if options.attn:
            m_qk, m_vo = cross_qk(view.blocks[i].attn, anc_attn), cross_vo(view.blocks[i].attn, anc_attn)
            both, sv = procrustes(torch.stack([m_qk, m_vo]))  # one batched SVD per layer
            qk, vo = both[0], both[1]
            rep.qk_singular, rep.vo_singular = sv[0].tolist(), sv[1].tolist()
            angles, dets = rotation_angles(both)
            rep.qk_angles, rep.vo_angles = angles[0].tolist(), angles[1].tolist()
            rep.qk_det, rep.vo_det = dets[0].tolist(), dets[1].tolist()
        t = LayerTransform(perm, qk, vo)
        view = apply_layer(view, i, t)
        if options.rescale:
            a_s = rescale_qk(view.blocks[i].attn, anc_attn)
            b_s = rescale_vo(view.blocks[i].attn, anc_attn)
            eye = torch.eye(anchor.dims.d_head, dtype=torch.float64)
            scale = LayerTransform(None, a_s[:, None, None] * eye, b_s[:, None, None] * eye)
            view = apply_layer(view, i, scale)
            t = t.then(scale)
            rep.qk_scale, rep.vo_scale = a_s.tolist(), b_s.tolist()
        transforms[i] = t
        reports.append(rep)
    if progress:
        progress(len(layers), len(layers), "done")
    report = MatchReport(options, distances(source, anchor), distances(view, anchor), reports)
    report.seconds = time.perf_counter() - t0
    return MatchResult(view, transforms, report)

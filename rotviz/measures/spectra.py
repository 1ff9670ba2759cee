"""Spectra: per layer and head, the singular values of the Q-K and V-O cross matrices, the
angles of the rotations matching applied, and the invariant circuit spectra (W_Q^T W_K,
W_O W_V) of anchor, source and matched source, which matching must leave unchanged: the
record, the computation (`spectra`) and its figures.

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

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from rotviz.measures.registry import Context, Measurement, register
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import plotly.graph_objects as go
    from torch import Tensor

    from rotviz.symmetry.view import Attention, ModelView


def circuit_singular_values(x: Tensor, y: Tensor) -> Tensor:
    """Non-zero singular values (d_h of them, descending) of x[h]^T @ y[h] for (H, d_h, d) x, y."""
    import torch

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
    from rotviz.match.pipeline import view_of
    from rotviz.symmetry.view import ModelView

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
    import torch

    from rotviz.groups import procrustes, rotation_angles
    from rotviz.match.layer_solvers import cross_qk, cross_vo

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


def _run(ends, ctx: Context, v: dict):
    from rotviz.match.pipeline import view_of
    from rotviz.symmetry.view import read_view

    a, b = ends.anchor, ends.source
    mv = None if ends.match == "none" else read_view(b.spec, b.config, ends.matched)
    return spectra(view_of(a), view_of(b), mv, ends.layers)


def _summary(s, how: str) -> str:
    change = "" if s.max_circuit_change is None else \
        f"; largest circuit change after matching {s.max_circuit_change:.2e} (relative)"
    return (f"spectra{how}: {len(s.layers)} layers x {s.n_heads} heads of {s.d_head} "
            f"dimensions{change}")


def _rows(d: dict) -> list[dict]:
    return [{"layer": lay["layer"], "head": h, "qk_trace": lay["qk_trace"][h],
             "vo_trace": lay["vo_trace"][h], "qk_det": lay["qk_det"][h],
             "vo_det": lay["vo_det"][h]}
            for lay in d["layers"] for h in range(len(lay["qk_trace"]))]


PAIRS = (("qk", "query-key (Q-K)"), ("vo", "value-output (V-O)"))


RANK = "singular value rank (1 = largest)"


def _two_panels() -> go.Figure:
    from plotly.subplots import make_subplots

    titles = [p[1] for p in PAIRS]
    return make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.1)


def singular_values(layer: Mapping, font_size: int = 14) -> go.Figure:
    """Per head, the singular values of the Q-K and V-O cross matrices of one layer.

    Their sum is what the Procrustes rotation gains: a flat, high spectrum means the two
    heads agree once rotated; a steep one means they share only a few directions.
    """
    from rotviz.plots import style

    fig = _two_panels()
    for col, (kind, _) in enumerate(PAIRS, start=1):
        for h, sv in enumerate(layer.get(f"{kind}_singular") or []):
            fig.add_scatter(
                x=list(range(1, len(sv) + 1)), y=[float(s) for s in sv], mode="lines+markers",
                name=f"head {h}", legendgroup=f"h{h}", showlegend=col == 1,
                line={"color": style.color(h), "dash": style.dash(h)},
                marker={"symbol": style.marker(h), "size": 6},
                hovertemplate=f"head {h}, #%{{x}}: %{{y:.3f}}<extra>{kind.upper()}</extra>",
                row=1, col=col,
            )
        fig.update_xaxes(title_text=RANK, row=1, col=col)
        fig.update_yaxes(title_text=style.SINGULAR, row=1, col=col)
    title = f"Layer {layer.get('layer', '?')}: singular values of the cross matrices, per head"
    return style.finish(fig, title, RANK, style.SINGULAR, "head", font_size)


def rotation_angles(layer: Mapping, font_size: int = 14) -> go.Figure:
    """Per head, the eigen-angles of the rotation matching applied (0° = left alone)."""
    from rotviz.plots import style

    fig = _two_panels()
    for col, (kind, _) in enumerate(PAIRS, start=1):
        angles = layer.get(f"{kind}_angles") or []
        dets = layer.get(f"{kind}_det") or [1.0] * len(angles)
        for h, ang in enumerate(angles):
            refl = float(dets[h]) < 0
            fig.add_scatter(
                x=[h] * len(ang), y=[float(a) for a in ang], mode="markers",
                name=f"head {h}", legendgroup=f"h{h}", showlegend=col == 1,
                marker={"symbol": "x" if refl else style.marker(h), "size": 9,
                        "color": style.color(h), "opacity": 0.8},
                hovertemplate=(f"head {h}: %{{y:.1f}}°" + (" (reflection)" if refl else "")
                               + f"<extra>{kind.upper()}</extra>"),
                row=1, col=col,
            )
        fig.update_xaxes(title_text=style.HEAD, dtick=1, row=1, col=col)
        fig.update_yaxes(title_text=style.ANGLE, range=[-5, 185], row=1, col=col)
    title = f"Layer {layer.get('layer', '?')}: rotation angles matching applied (× = reflection)"
    return style.finish(fig, title, style.HEAD, style.ANGLE, "head", font_size)


def angle_overview(layers: Sequence[Mapping], kind: str = "qk", font_size: int = 14) -> go.Figure:
    """Mean rotation angle per layer and head: where matching had to turn heads the most."""
    import numpy as np
    import plotly.graph_objects as go

    from rotviz.plots import style

    rows = [lay for lay in layers if lay.get(f"{kind}_angles")]
    z = [[float(np.mean(a)) for a in lay[f"{kind}_angles"]] for lay in rows]
    n_heads = max((len(r) for r in z), default=0)
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(n_heads)), y=[str(lay["layer"]) for lay in rows],
        colorscale=style.SEQUENTIAL, zmin=0, zmax=180, name="mean angle",
        colorbar={"title": {"text": "mean angle (degrees)", "side": "right"}},
        hovertemplate="layer %{y}, head %{x}: %{z:.1f}°<extra></extra>",
    ))
    fig.update_xaxes(dtick=1)
    title = f"{kind[0].upper()}-{kind[1].upper()}: mean rotation angle per layer and head"
    return style.finish(fig, title, style.HEAD, "layer (block index)", None, font_size,
                        legend=False)


def circuit_spectra(
    series: Mapping[str, Sequence[float]],
    title: str,
    font_size: int = 14,
    y_label: str = "singular value of the circuit matrix (unitless, log scale)",
) -> go.Figure:
    """Singular values of an invariant circuit (W_Qᵀ W_K or W_O W_V) for several models.

    These circuits do not change under the symmetries, so the source's curve and the matched
    source's curve coincide: the visible proof that matching kept the function.
    """
    import plotly.graph_objects as go

    from rotviz.plots import style

    fig = go.Figure()
    # Curves that coincide (source and matched source) must both stay visible: earlier ones
    # are drawn wide with open markers, later ones thin on top.
    n = len(series)
    for i, (name, sv) in enumerate(series.items()):
        fig.add_scatter(
            x=list(range(1, len(sv) + 1)), y=[float(s) for s in sv], mode="lines+markers",
            name=name,
            line={"color": style.color(i), "dash": style.dash(i), "width": 1.5 + 2 * (n - 1 - i)},
            marker={"symbol": style.marker(i) + ("-open" if i < n - 1 else ""),
                    "size": 6 + 4 * (n - 1 - i), "line": {"width": 2}},
            hovertemplate=f"{name} #%{{x}}: %{{y:.4g}}<extra></extra>",
        )
    style.log_axis(fig)
    return style.finish(fig, title, RANK, y_label, "model", font_size)


def _plot(d: dict, look: Style):
    return angle_overview(d["layers"], "qk", font_size=look.font_size)


SPECTRA = register(Measurement(
    "spectra", "Spectra", "cross-matrix and invariant circuit spectra per layer and head",
    _run, summary=_summary, plot=_plot, rows=_rows, data=False, narrower=True,
    refusal="spectra read every layer's attention of three models in memory", order=60))

"""Figures for the guided demo: weights that change while the outputs do not."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rotviz.plots import style


def weight_heatmaps(
    mats: Mapping[str, np.ndarray],
    title: str,
    font_size: int = 14,
    x_label: str = "input coordinate (residual stream dimension)",
    y_label: str = "output coordinate (head dimension)",
) -> go.Figure:
    """Side-by-side heatmaps of the same weight matrix in several models, one colour scale."""
    arrays = {k: np.asarray(v, dtype=float) for k, v in mats.items()}
    lim = max(float(np.abs(a).max()) for a in arrays.values()) or 1.0
    fig = make_subplots(rows=1, cols=len(arrays), subplot_titles=list(arrays),
                        horizontal_spacing=0.06)
    for i, (name, a) in enumerate(arrays.items(), start=1):
        fig.add_trace(go.Heatmap(
            z=a.tolist(), colorscale=style.DIVERGING, zmin=-lim, zmax=lim, zmid=0,
            showscale=i == len(arrays), name=name,
            colorbar={"title": {"text": "weight value (unitless)", "side": "right"}},
            hovertemplate=f"{name}: row %{{y}}, col %{{x}}: %{{z:.3f}}<extra></extra>",
        ), row=1, col=i)
        fig.update_xaxes(title_text=x_label if i == 1 else "", row=1, col=i)
        fig.update_yaxes(autorange="reversed", row=1, col=i, title_text=y_label if i == 1 else "")
    return style.finish(fig, title, x_label, y_label, None, font_size, height=380, legend=False)


def logit_scatter(
    original: np.ndarray,
    transformed: np.ndarray,
    font_size: int = 14,
    name: str = "transformed model",
) -> go.Figure:
    """Every logit of the transformed model against the original's: on the diagonal = same."""
    a = np.asarray(original, dtype=float).ravel()
    b = np.asarray(transformed, dtype=float).ravel()
    lo, hi = float(min(a.min(), b.min())), float(max(a.max(), b.max()))
    diff = float(np.abs(a - b).max()) if a.size else 0.0
    fig = go.Figure()
    fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="identical outputs (y = x)",
                    line={"color": style.GREY, "dash": "dash"}, hoverinfo="skip")
    fig.add_scatter(
        x=a.tolist(), y=b.tolist(), mode="markers", name=f"{name} (max |difference| {diff:.1e})",
        marker={"color": style.color(3), "size": 6, "opacity": 0.7},
        hovertemplate="original %{x:.4f}, now %{y:.4f}<extra></extra>",
    )
    return style.finish(fig, "Outputs before and after: every logit, one dot",
                        "logit of the original model (unitless score)",
                        f"logit of the {name} (unitless score)", "", font_size, height=420)


def stage_distances(stages: Sequence[tuple[str, float]], font_size: int = 14,
                    title: str = "How far the weights moved from the original") -> go.Figure:
    """One bar per demo stage: distance of the weights from the original model."""
    fig = go.Figure()
    for i, (label, d) in enumerate(stages):
        fig.add_bar(x=[label], y=[float(d)], name=label, marker_color=style.color(i),
                    text=[f"{float(d):.3g}"], textposition="outside",
                    hovertemplate=f"{label}: %{{y:.4g}}<extra></extra>")
    return style.finish(fig, title, "stage of the demo", style.DISTANCE, "stage", font_size,
                        height=400)

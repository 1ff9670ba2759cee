"""Interpolation curves with the barrier marked, and the 2D loss plane."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from rotviz.plots import style


def barrier_point(alphas: Sequence[float], values: Sequence[float]) -> tuple[float, float, float]:
    """Where the curve rises highest above the straight line between its end points.

    Returns (alpha, value on the curve, value on the line); the barrier is their difference
    (the GLMC paper's definition, docs/conventions.md).
    """
    a = np.asarray(alphas, dtype=float)
    v = np.asarray(values, dtype=float)
    line = v[0] + (v[-1] - v[0]) * (a - a[0]) / max(a[-1] - a[0], 1e-12)
    i = int(np.argmax(v - line))
    return float(a[i]), float(v[i]), float(line[i])


def barrier_curves(
    curves: Sequence[Mapping],
    metric: str = "loss",
    font_size: int = 14,
    title: str | None = None,
    acc_range: Sequence[float] | None = None,
) -> go.Figure:
    """One line per matching option along θ(α) = (1-α)·anchor + α·matched source.

    Each curve is a mapping like `rotviz.analysis.landscape.Curve.to_dict()`: `match` (the matching
    SPEC), `alphas`, `loss` and `acc`. For the loss the barrier is drawn as a vertical
    segment from the straight line between the end points up to the curve, and its height
    is given in the legend. The accuracy axis follows the curves (`style.acc_range`) unless
    `acc_range` is given: `style.ACC_FIXED` for the 0-1 scale, or one range shared with
    the panels it is compared with.
    """
    fig = go.Figure()
    key = "loss" if metric == "loss" else "acc"
    for i, c in enumerate(curves):
        name = style.nice_label(str(c["match"]))
        a, v = list(map(float, c["alphas"])), list(map(float, c[key]))
        if metric == "loss":
            am, top, base = barrier_point(a, v)
            name = f"{name} (barrier {top - base:.3f})"
        fig.add_scatter(
            x=a, y=v, mode="lines+markers", name=name, legendgroup=str(i),
            line={"color": style.color(i), "dash": style.dash(i), "width": 2.5},
            marker={"symbol": style.marker(i), "size": 6},
            hovertemplate="α=%{x:.2f}: %{y:.4f}<extra>" + name + "</extra>",
        )
        if metric == "loss":
            fig.add_scatter(
                x=[am, am], y=[base, top], mode="lines", legendgroup=str(i), showlegend=False,
                line={"color": style.color(i), "width": 1.5, "dash": "dot"},
                hovertemplate=f"barrier {top - base:.3f} at α={am:.2f}<extra></extra>",
            )
    y = style.LOSS if metric == "loss" else style.ACCURACY
    what = "Loss" if metric == "loss" else "Accuracy"
    fig = style.finish(fig, title or path_title(what, [str(c["match"]) for c in curves]),
                       style.ALPHA, y, "matching option", font_size)
    fig.update_layout(legend={"orientation": "h", "y": -0.22, "x": 0})
    if metric == "acc":
        fig.update_yaxes(range=list(acc_range) if acc_range is not None else
                         style.acc_range(v for c in curves for v in c["acc"]))
    return fig


def path_title(what: str, matches: Sequence[str]) -> str:
    """A title that is true of every curve drawn: the path ends at the matched source only
    when every curve matched, at the source as trained when none did."""
    done = [m not in ("none", "") for m in matches]
    if all(done):
        return f"{what} along the straight path from anchor to matched source"
    if not any(done):
        return f"{what} along the straight path from anchor to source (no matching)"
    return f"{what} along the straight path from anchor to source, with and without matching"


PLANE_MARKERS = {
    "A": "anchor (A)",
    "B": "source as trained (B)",
    "B'": "source after matching (B')",
    "AB": "average of A and B",
    "AB'": "average of A and B'",
}


def loss_plane(
    x: Sequence[float],
    y: Sequence[float],
    z: np.ndarray | Sequence[Sequence[float]],
    points: Mapping[str, tuple[float, float]],
    font_size: int = 14,
    title: str = "Test loss on the plane through A, B and B'",
    x_label: str = "distance along A → B (Euclidean, parameter units)",
    y_label: str = "distance towards B', orthogonal to A → B (Euclidean, parameter units)",
) -> go.Figure:
    """Contour of the loss over a 2D slice of parameter space, with the models marked.

    `z[j][i]` is the loss at (x[i], y[j]) (`rotviz.analysis.landscape.Plane`: xs, ys, loss, points);
    `points` maps the names in PLANE_MARKERS to plane coordinates.
    """
    z = np.asarray(z, dtype=float)
    # Log-spaced contours would hide the valley floor; clip the colour range at a high
    # percentile so one huge corner does not wash the picture out.
    hi = float(np.nanpercentile(z, 95)) if np.isfinite(z).any() else 1.0
    fig = go.Figure(go.Contour(
        x=list(map(float, x)), y=list(map(float, y)), z=z.tolist(), colorscale=style.SEQUENTIAL,
        zmin=float(np.nanmin(z)), zmax=hi, name="test loss",
        colorbar={"title": {"text": "test loss (nats)", "side": "right"}},
        contours={"coloring": "heatmap", "showlabels": True},
        hovertemplate="(%{x:.2f}, %{y:.2f}): loss %{z:.3f}<extra></extra>",
    ))
    for i, (name, (px, py)) in enumerate(points.items()):
        fig.add_scatter(
            x=[float(px)], y=[float(py)], mode="markers+text", text=[name],
            textposition="top center",
            name=PLANE_MARKERS.get(name, name),
            marker={"symbol": style.marker(i), "size": 13, "color": style.color(i),
                    "line": {"color": "white", "width": 1.5}},
            textfont={"color": "white", "size": font_size + 1},
            hovertemplate=f"{PLANE_MARKERS.get(name, name)}<extra></extra>",
        )
    fig = style.finish(fig, title, x_label, y_label, "model", font_size, height=560)
    fig.update_layout(legend={"orientation": "h", "y": -0.2, "x": 0})
    fig.update_yaxes(scaleanchor="x", scaleratio=1)
    return fig

"""Slices of the loss (rotviz.analysis.slices) and the A/B/B' plane in 3D.

A 2D slice is drawn twice, side by side: a contour (the valley's shape, readable values) and
a 3D surface (its depth). With `log=True` the colours follow log10 of the loss, so a basin
stays visible next to a wall orders of magnitude higher; the height of a surface stays the
loss itself. Several panels share one colour scale: give `zmin`/`zmax` (loss units), or use
`slice_panels`, which takes them over every panel, so colours compare across models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rotviz.plots import style
from rotviz.plots.paths import PLANE_MARKERS

AXIS_UNITS = {"filter": "direction units: 1 = each filter's own norm",
              "layer": "direction units: 1 = each tensor's own norm",
              "unit": "direction units: 1 = each neuron's and head's own norm",
              "none": "parameter units (L2, unnormalised Gaussian)"}
LOSS_BAR = "test loss (nats)"
LOG_BAR = "log10 of the test loss (log10 nats)"


def _axis(d: Mapping, i: int) -> str:
    return f"distance along direction {i} ({AXIS_UNITS.get(d.get('norm', ''), 'units')})"


def _colours(z: np.ndarray, log: bool) -> np.ndarray:
    """What the colours show: the loss, or log10 of it (losses of 0 or less are floored)."""
    return np.log10(np.maximum(z, 1e-12)) if log else z


def _range(zmin: float | None, zmax: float | None, z: np.ndarray, log: bool
           ) -> tuple[float, float]:
    lo = float(np.nanmin(z)) if zmin is None else zmin
    hi = float(np.nanmax(z)) if zmax is None else zmax
    if log:
        lo, hi = (float(np.log10(max(v, 1e-12))) for v in (lo, hi))
    return lo, hi


def shared_range(ds: Sequence[Mapping]) -> tuple[float, float]:
    """One loss range over every slice given (their lowest and highest loss)."""
    zs = [np.asarray(d["loss"], dtype=float) for d in ds]
    return float(min(np.nanmin(z) for z in zs)), float(max(np.nanmax(z) for z in zs))


DIRECTION_WORDS = {"random": "random", "hessian": "Hessian-eigenvector", "toward": "toward",
                   "tangent": "symmetry-tangent", "gauge": "gauge-fixed random",
                   "given": "given"}


def _centre(d: Mapping) -> str:
    """The slice's centre in words (the model itself unless `around` says otherwise)."""
    model, source = d.get("model") or "the model", d.get("source") or "the source"
    around = d.get("around", "anchor")
    if around == "source":
        return source
    if around == "matched":
        return f"{source} matched onto {model}"
    if around == "path":
        return f"alpha {d.get('alpha', 0.5):g} of the path {model} → {source} matched"
    if around == "merged":
        return f"{model} merged with {source} matched ({d.get('merge')})"
    return model


def _title(d: Mapping) -> str:
    what = "plane" if d["dims"] == 2 else "line"
    keep = "kept" if d.get("keep_1d") else "zeroed"
    kind = DIRECTION_WORDS.get(d.get("directions", "random"), d.get("directions", "random"))
    return (f"Test loss on a {kind} {what} around {_centre(d)} "
            f"({d.get('norm')} normalised, biases {keep}, seed {d.get('seed')})")


def _target_name(d: Mapping) -> str:
    return "B (target)" if d.get("toward") == "source" else "B' (target)"


def slice_line(d: Mapping, log: bool = False, font_size: int = 14,
               zmin: float | None = None, zmax: float | None = None,
               acc_range: Sequence[float] | None = None) -> go.Figure:
    """A 1D slice: loss (and accuracy, dotted, on a second axis) against x. The accuracy
    axis follows the data unless `acc_range` is given (`style.ACC_FIXED`: 0-1)."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(x=d["xs"], y=d["loss"], mode="lines+markers", name="test loss",
                    line={"color": style.color(0), "dash": style.dash(0)},
                    marker={"symbol": style.marker(0)})
    fig.add_scatter(x=d["xs"], y=d["acc"], mode="lines+markers", name="test accuracy",
                    line={"color": style.color(1), "dash": style.dash(2)},
                    marker={"symbol": style.marker(1)}, secondary_y=True)
    fig.add_scatter(x=[0.0], y=[d["centre_loss"]], mode="markers", name="the model (centre)",
                    marker={"color": style.OKABE_ITO[-1], "size": 12, "symbol": "star"})
    if d.get("target_x") is not None and d.get("target_loss") is not None:
        fig.add_scatter(x=[d["target_x"]], y=[d["target_loss"]], mode="markers",
                        name=_target_name(d), marker={"color": style.color(2), "size": 11,
                                                      "symbol": "diamond"})
    fig = style.finish(fig, _title(d), _axis(d, 1), style.LOSS, "curve", font_size)
    fig.update_yaxes(title_text=style.ACCURACY, secondary_y=True,
                     range=list(acc_range) if acc_range is not None else
                     style.acc_range(d["acc"]))
    if log:
        style.log_axis(fig, "y", secondary_y=False)
    if zmin is not None or zmax is not None:
        lo = zmin if zmin is not None else float(np.nanmin(d["loss"]))
        hi = zmax if zmax is not None else float(np.nanmax(d["loss"]))
        fig.update_yaxes(range=[np.log10(lo), np.log10(hi)] if log else [lo, hi],
                         secondary_y=False)
    return fig


def slice_figure(d: Mapping, log: bool = False, zmin: float | None = None,
                 zmax: float | None = None, font_size: int = 14,
                 acc_range: Sequence[float] | None = None) -> go.Figure:
    """A slice result (`Slice.to_dict()`): a line in 1D (its accuracy axis: `slice_line`);
    in 2D a contour beside a 3D surface, one colour scale (`zmin`/`zmax` in loss units,
    log10 of them with `log`)."""
    if d["dims"] == 1:
        return slice_line(d, log, font_size, zmin, zmax, acc_range)
    z = np.asarray(d["loss"], dtype=float)
    c = _colours(z, log)
    lo, hi = _range(zmin, zmax, z, log)
    bar = LOG_BAR if log else LOSS_BAR
    fig = make_subplots(rows=1, cols=2, specs=[[{"type": "xy"}, {"type": "scene"}]],
                        subplot_titles=("contour", "surface"), horizontal_spacing=0.08)
    fig.add_trace(go.Contour(
        x=d["xs"], y=d["ys"], z=c.tolist(), colorscale=style.SEQUENTIAL, zmin=lo, zmax=hi,
        name="test loss", contours={"coloring": "heatmap", "showlabels": True},
        colorbar={"title": {"text": bar, "side": "right"}, "x": 0.46},
        hovertemplate="(%{x:.2f}, %{y:.2f}): %{z:.3f}<extra></extra>"), row=1, col=1)
    fig.add_scatter(x=[0.0], y=[0.0], mode="markers", name="the model (centre)",
                    marker={"color": style.OKABE_ITO[-1], "size": 12, "symbol": "star",
                            "line": {"color": "white", "width": 1.5}}, row=1, col=1)
    if d.get("target_x") is not None:
        fig.add_scatter(x=[d["target_x"]], y=[0.0], mode="markers", name=_target_name(d),
                        marker={"color": style.color(2), "size": 11, "symbol": "diamond",
                                "line": {"color": "white", "width": 1.5}}, row=1, col=1)
    fig.add_trace(go.Surface(
        x=d["xs"], y=d["ys"], z=z.tolist(), surfacecolor=c.tolist(), cmin=lo, cmax=hi,
        colorscale=style.SEQUENTIAL, name="test loss surface",
        showscale=False,  # the contour's colour bar is the surface's too: one scale
        hovertemplate="(%{x:.2f}, %{y:.2f}): loss %{z:.3f}<extra></extra>"), row=1, col=2)
    fig.add_trace(go.Scatter3d(
        x=[0.0], y=[0.0], z=[d["centre_loss"]], mode="markers", name="the model (centre, 3D)",
        marker={"color": style.OKABE_ITO[-1], "size": 6, "symbol": "diamond"}), row=1, col=2)
    fig = style.finish(fig, _title(d), _axis(d, 1), _axis(d, 2), "marker", font_size,
                       height=600)
    fig.update_layout(scene={"xaxis_title": "direction 1", "yaxis_title": "direction 2",
                             "zaxis_title": LOSS_BAR},
                      legend={"orientation": "h", "y": -0.15, "x": 0})
    return fig


def slice_panels(ds: Sequence[Mapping], titles: Sequence[str], log: bool = False,
                 font_size: int = 14, title: str | None = None) -> go.Figure:
    """Several 2D slices as contours side by side with one colour scale over them all (the
    same loss is the same colour in every panel), e.g. a slice of A beside one of B', or a
    random plane beside its gauge-fixed twin; `title` replaces the default one."""
    lo, hi = shared_range(ds)
    clo, chi = _range(lo, hi, np.asarray([lo, hi]), log)
    fig = make_subplots(rows=1, cols=len(ds), subplot_titles=list(titles),
                        shared_yaxes=True, horizontal_spacing=0.04)
    for j, d in enumerate(ds):
        c = _colours(np.asarray(d["loss"], dtype=float), log)
        fig.add_trace(go.Contour(
            x=d["xs"], y=d["ys"], z=c.tolist(), colorscale=style.SEQUENTIAL, zmin=clo,
            zmax=chi, showscale=j == 0, name=titles[j],
            contours={"coloring": "heatmap", "showlabels": True},
            colorbar={"title": {"text": LOG_BAR if log else LOSS_BAR, "side": "right"}},
            hovertemplate="(%{x:.2f}, %{y:.2f}): %{z:.3f}<extra></extra>"), row=1, col=j + 1)
    fig = style.finish(fig, title or "Test loss around each model, one colour scale",
                       _axis(ds[0], 1), _axis(ds[0], 2), None, font_size, height=480,
                       legend=False)
    return fig


def loss_surface(plane: Mapping, log: bool = False, font_size: int = 14,
                 zmin: float | None = None, zmax: float | None = None) -> go.Figure:
    """The A/B/B' plane (`Plane.to_dict()`, rotviz.analysis.planes) as a 3D surface, with
    A, B, B' and the midpoints as markers at their exact losses."""
    z = np.asarray(plane["loss"], dtype=float)
    c = _colours(z, log)
    lo, hi = _range(zmin, zmax, z, log)
    fig = go.Figure(go.Surface(
        x=plane["xs"], y=plane["ys"], z=z.tolist(), surfacecolor=c.tolist(), cmin=lo, cmax=hi,
        colorscale=style.SEQUENTIAL, name="test loss surface", opacity=0.9,
        # the colour bar stands clear of the scene, whose z-axis title would run into it
        colorbar={"title": {"text": LOG_BAR if log else LOSS_BAR, "side": "right"},
                  "x": 0.95, "len": 0.8},
        hovertemplate="(%{x:.2f}, %{y:.2f}): loss %{z:.3f}<extra></extra>"))
    for i, (name, (px, py)) in enumerate(plane["points"].items()):
        fig.add_trace(go.Scatter3d(
            x=[float(px)], y=[float(py)], z=[float(plane["point_loss"][name])],
            mode="markers+text", text=[name], name=PLANE_MARKERS.get(name, name),
            marker={"color": style.color(i), "size": 7, "symbol": ("circle", "square",
                    "diamond", "cross", "x")[i % 5], "line": {"color": "white", "width": 1}}))
    x_label = "distance along A → B (Euclidean, parameter units)"
    y_label = "distance towards B', orthogonal to A → B (Euclidean, parameter units)"
    fig = style.finish(fig, "Test loss surface on the plane through A, B and B'", x_label,
                       y_label, "model", font_size, height=640)
    fig.update_layout(scene={"domain": {"x": [0.0, 0.84]},  # short titles: the box clips
                             # a step back from plotly's default view: the axis titles fit
                             "camera": {"eye": {"x": 1.6, "y": 1.6, "z": 1.35}},
                             "xaxis_title": "A → B (param. units)",
                             "yaxis_title": "to B' (param. units)",
                             "zaxis_title": LOSS_BAR},
                      legend={"orientation": "h", "y": -0.1, "x": 0})
    return fig

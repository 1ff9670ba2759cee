"""Loss surfaces and their colour scale: one scale shared by the contours and surfaces a
page shows side by side (the slice record's planes, rotviz.measures.slice; the A/B/B' plane's
3D view, `loss_surface`). With `log=True` the colours follow log10 of the loss, so a basin
stays visible next to a wall orders of magnitude higher; the height of a surface stays the
loss itself. Several panels share one colour scale: give `zmin`/`zmax` (loss units), or take
`shared_range` over every panel, so colours compare across models (`slice_panels`: slices
side by side, the app's random plane beside its gauge-fixed twin); a slice's axes say their
units (`axis_title`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from rotviz.plots import style
from rotviz.plots.paths import PLANE_MARKERS

LOSS_BAR = "test loss (nats)"
LOG_BAR = "log10 of the test loss (log10 nats)"


def colours(z: np.ndarray, log: bool) -> np.ndarray:
    """What the colours show: the loss, or log10 of it (losses of 0 or less are floored)."""
    return np.log10(np.maximum(z, 1e-12)) if log else z


def colour_range(zmin: float | None, zmax: float | None, z: np.ndarray, log: bool
                 ) -> tuple[float, float]:
    """The colour scale's ends: `zmin`/`zmax` where given (loss units), else the data's;
    log10 of them with `log`."""
    lo = float(np.nanmin(z)) if zmin is None else zmin
    hi = float(np.nanmax(z)) if zmax is None else zmax
    if log:
        lo, hi = (float(np.log10(max(v, 1e-12))) for v in (lo, hi))
    return lo, hi


def shared_range(ds: Sequence[Mapping]) -> tuple[float, float]:
    """One loss range over every slice given (their lowest and highest loss)."""
    zs = [np.asarray(d["loss"], dtype=float) for d in ds]
    return float(min(np.nanmin(z) for z in zs)), float(max(np.nanmax(z) for z in zs))


def loss_surface(plane: Mapping, log: bool = False, font_size: int = 14,
                 zmin: float | None = None, zmax: float | None = None) -> go.Figure:
    """The A/B/B' plane (`Plane.to_dict()`, the plane record) as a 3D surface, with
    A, B, B' and the midpoints as markers at their exact losses."""
    z = np.asarray(plane["loss"], dtype=float)
    c = colours(z, log)
    lo, hi = colour_range(zmin, zmax, z, log)
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


AXIS_UNITS = {"filter": "direction units: 1 = each filter's own norm",
              "layer": "direction units: 1 = each tensor's own norm",
              "unit": "direction units: 1 = each neuron's and head's own norm",
              "none": "parameter units (L2, unnormalised Gaussian)"}


def axis_title(d: Mapping, i: int) -> str:
    """A slice's axis i in words, in the units its normalisation gives (`norm`)."""
    return f"distance along direction {i} ({AXIS_UNITS.get(d.get('norm', ''), 'units')})"


def slice_panels(ds: Sequence[Mapping], titles: Sequence[str], log: bool = False,
                 font_size: int = 14, title: str | None = None):
    """Several 2D slices as contours side by side with one colour scale over them all (the
    same loss is the same colour in every panel), e.g. a slice of A beside one of B', or a
    random plane beside its gauge-fixed twin; `title` replaces the default one."""
    from plotly.subplots import make_subplots

    lo, hi = shared_range(ds)
    clo, chi = colour_range(lo, hi, np.asarray([lo, hi]), log)
    fig = make_subplots(rows=1, cols=len(ds), subplot_titles=list(titles),
                        shared_yaxes=True, horizontal_spacing=0.04)
    for j, d in enumerate(ds):
        c = colours(np.asarray(d["loss"], dtype=float), log)
        fig.add_trace(go.Contour(
            x=d["xs"], y=d["ys"], z=c.tolist(), colorscale=style.SEQUENTIAL, zmin=clo,
            zmax=chi, showscale=j == 0, name=titles[j],
            contours={"coloring": "heatmap", "showlabels": True},
            colorbar={"title": {"text": LOG_BAR if log else LOSS_BAR, "side": "right"}},
            hovertemplate="(%{x:.2f}, %{y:.2f}): %{z:.3f}<extra></extra>"), row=1, col=j + 1)
    fig = style.finish(fig, title or "Test loss around each model, one colour scale",
                       axis_title(ds[0], 1), axis_title(ds[0], 2), None, font_size, height=480,
                       legend=False)
    return fig

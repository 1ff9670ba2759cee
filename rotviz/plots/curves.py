"""A trained curved path (Garipov et al.) beside the straight line, and its bend on the
A/B/B' loss plane."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from rotviz.plots import style
from rotviz.plots.barrier import barrier_point

KIND_NAMES = {"bezier": "Bezier curve", "chain": "polygonal chain"}
T_AXIS = "curve parameter t (0 = anchor, 1 = matched source; straight line: α = t)"


def bend_curves(d: Mapping, metric: str = "loss", font_size: int = 14,
                title: str | None = None, acc_range: Sequence[float] | None = None
                ) -> go.Figure:
    """The loss (or accuracy) along the trained curve and along the straight line at the
    same t, each barrier marked as a dotted segment above the line between the end losses
    and given in the legend. `d` is `rotviz.analysis.curves.Bend.to_dict()`. The accuracy
    axis follows both curves unless `acc_range` is given (`style.ACC_FIXED`: 0-1)."""
    fig = go.Figure()
    curve = KIND_NAMES.get(str(d["kind"]), str(d["kind"]))
    key = "loss" if metric == "loss" else "acc"
    series = [(f"{curve} with a trained bend", d[key]),
              ("straight line", d["line_" + key])]
    ts = [float(t) for t in d["ts"]]
    for i, (name, ys) in enumerate(series):
        ys = [float(v) for v in ys]
        if metric == "loss":
            am, top, base = barrier_point(ts, ys)
            name = f"{name} (barrier {top - base:.3f})"
        fig.add_scatter(x=ts, y=ys, mode="lines+markers", name=name, legendgroup=str(i),
                        line={"color": style.color(i), "dash": style.dash(i), "width": 2.5},
                        marker={"symbol": style.marker(i), "size": 6},
                        hovertemplate="t=%{x:.2f}: %{y:.4f}<extra>" + name + "</extra>")
        if metric == "loss":
            fig.add_scatter(x=[am, am], y=[base, top], mode="lines", legendgroup=str(i),
                            showlegend=False,
                            line={"color": style.color(i), "width": 1.5, "dash": "dot"},
                            hovertemplate=f"barrier {top - base:.3f} at t={am:.2f}"
                                          "<extra></extra>")
    what = "Loss" if metric == "loss" else "Accuracy"
    default = (f"{what} along a {curve} (bend {d['off_plane']:.3f} off the A/B/B' plane) "
               "and the straight line")
    fig = style.finish(fig, title or default, T_AXIS,
                       style.LOSS if metric == "loss" else style.ACCURACY, "path", font_size)
    fig.update_layout(legend={"orientation": "h", "y": -0.22, "x": 0})
    if metric == "acc":
        fig.update_yaxes(range=list(acc_range) if acc_range is not None else
                         style.acc_range([*d["acc"], *d["line_acc"]]))
    return fig


def bend_on_plane(fig: go.Figure, d: Mapping, index: int = 2) -> go.Figure:
    """Overlay the curve's projection and its bend on a loss-plane figure
    (rotviz.plots.barrier.loss_plane, the same frame), naming the bend's distance from the
    plane: the surface under the projected curve is not the loss the curve meets when that
    distance is large."""
    xy = d["path_xy"]
    curve = KIND_NAMES.get(str(d["kind"]), str(d["kind"]))
    fig.add_scatter(x=[p[0] for p in xy], y=[p[1] for p in xy], mode="lines",
                    name=f"{curve} (projected)",
                    line={"color": style.color(index), "width": 3, "dash": "dash"})
    fig.add_scatter(x=[d["bend_x"]], y=[d["bend_y"]], mode="markers",
                    name=f"bend C, {d['off_plane']:.3f} off the plane",
                    marker={"color": style.color(index), "symbol": "star", "size": 14,
                            "line": {"color": "black", "width": 1}})
    return fig

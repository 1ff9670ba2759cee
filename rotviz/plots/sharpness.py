"""Sharpness along the path: the top Hessian eigenvalue against alpha, on the matched path
A -> B' and (when compared) the unmatched path A -> B."""

from __future__ import annotations

import plotly.graph_objects as go

from rotviz.plots import style


def sharpness_figure(d: dict, font_size: int = 14) -> go.Figure:
    """One line per path: the top eigenvalue at each alpha (the trace, when measured, is in
    the hover text and the table, its scale being far from the eigenvalue's)."""
    fig = go.Figure()
    lines = [("matched (A to B')", "matched", 0)]
    if d.get("unmatched") is not None:
        lines.append(("unmatched (A to B)", "unmatched", 1))
    for name, key, i in lines:
        fig.add_scatter(x=d["alphas"], y=d[key], mode="lines+markers", name=name,
                        line={"color": style.color(i), "dash": style.dash(i)},
                        marker={"symbol": style.marker(i)},
                        hovertemplate="alpha %{x:.3g}: %{y:.4g}<extra>" + name + "</extra>")
    style.finish(fig, f"Sharpness along the path<br>{d['model']} to {d['source']} on "
                 f"{style.evaluated_on(d)}",
                 "alpha (0: anchor A, 1: source B or B'; unitless)", Y_TITLE, "path",
                 font_size)
    # the title stands off the image's left edge (flush at x = 0, kaleido cut its first
    # letter off) and the pair's names go on a second line (on one, two zoo names and the
    # data ran off the right edge); the two-line axis title gets room to its left
    fig.update_layout(title={"pad": {"l": 12}}, margin={"l": 100, "t": 90})
    return fig


# the eigenvalue's axis title in two lines: on one (rotviz.plots.hessian.EIGENVALUE, written
# for a horizontal axis on the test split) it is longer than the plot is high, and kaleido
# clipped both ends; the split is the title's, so the unit alone stays here
Y_TITLE = "top Hessian eigenvalue<br>(nats per unit parameter², curvature of the loss)"

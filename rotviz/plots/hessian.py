"""Curvature plots: the top Hessian eigenvalues, per group of parameters, and the eigenvalue
density from stochastic Lanczos quadrature."""

from __future__ import annotations

import plotly.graph_objects as go

from rotviz.plots import style

EIGENVALUE = "Hessian eigenvalue (nats per unit parameter², curvature of the test loss)"


def eigenvalue_bars(d: dict, font_size: int = 14) -> go.Figure:
    """The top eigenvalues (largest first) of the whole model and, with `by`, of each group's
    principal sub-matrix, as grouped bars: bar i is the i-th largest eigenvalue."""
    rows = [("whole model", d["eigenvalues"])] + [(g["group"], g["eigenvalues"])
                                                   for g in d.get("groups") or []]
    k = max(len(e) for _, e in rows)
    fig = go.Figure()
    for i in range(k):
        fig.add_bar(x=[name for name, _ in rows],
                    y=[e[i] if i < len(e) else None for _, e in rows],
                    name=f"eigenvalue {i + 1}", marker_color=style.color(i),
                    hovertemplate="%{x}: %{y:.4g}<extra>eigenvalue " + str(i + 1) + "</extra>")
    fig.update_layout(barmode="group")
    by = d.get("by", "none")
    where = "parameter group" if by == "none" else f"parameter group (by {by})"
    return style.finish(fig, f"Top Hessian eigenvalues of {d['model']} on "
                        f"{style.evaluated_on(d)}",
                        where, EIGENVALUE, "rank (largest first)", font_size)


def density_plot(d: dict, font_size: int = 14) -> go.Figure:
    """The eigenvalue density (stochastic Lanczos quadrature), on a log density axis, with
    the top eigenvalues marked."""
    dens = d["density"]
    fig = go.Figure()
    fig.add_scatter(x=dens["grid"], y=[max(v, 1e-12) for v in dens["density"]],
                    mode="lines", name="density (SLQ)", line={"color": style.color(0)})
    fig.add_scatter(x=d["eigenvalues"], y=[max(max(dens["density"]), 1e-12)] *
                    len(d["eigenvalues"]), mode="markers", name="top eigenvalues (Lanczos)",
                    marker={"color": style.color(1), "symbol": style.marker(2)})
    style.finish(fig, f"Hessian eigenvalue density of {d['model']} on "
                 f"{style.evaluated_on(d)}",
                 EIGENVALUE, "density (fraction of eigenvalues per unit eigenvalue)",
                 "estimate", font_size)
    fig.update_yaxes(type="log")
    return fig


def hessian_figure(d: dict) -> go.Figure:
    return density_plot(d) if d.get("density") else eigenvalue_bars(d)

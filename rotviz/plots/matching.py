"""What matching did beyond the per-head report: the weight-matching alternation, the residual
map's eigen-angles, learned matching's validation barrier and activation matching's FFN
correlations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from rotviz.plots import style

OBJECTIVE = "squared distance to anchor (canonical, L2²)"
STEP = "step (each solves one kind of map, the others held fixed)"
ANGLE_INDEX = "eigen-angle index (sorted, largest first)"
NATS = "loss (nats)"
CORRELATION = "mean correlation of paired FFN units (Pearson, -1 to 1)"


def objective_history(rows: Sequence[Mapping], font_size: int = 14,
                      title: str = "Weight matching, step by step: the distance never goes up",
                      ) -> go.Figure:
    """The alternation's objective after each step (`rotviz.app.summaries.objective_rows`): one
    line, with a marker per step showing which maps it solved."""
    fig = go.Figure()
    x = [int(r["step"]) for r in rows]
    y = [float(r["objective"]) for r in rows]
    fig.add_scatter(x=x, y=y, mode="lines", name="squared distance to the anchor",
                    line={"color": style.GREY, "width": 2},
                    hovertemplate="step %{x}: %{y:.4g}<extra></extra>")
    kinds = list(dict.fromkeys(str(r["after"]) for r in rows))
    for i, kind in enumerate(kinds):
        pts = [r for r in rows if r["after"] == kind]
        fig.add_scatter(
            x=[int(r["step"]) for r in pts], y=[float(r["objective"]) for r in pts],
            mode="markers", name=f"after {kind}" if i else kind,
            marker={"color": style.color(i), "symbol": style.marker(i), "size": 9},
            hovertemplate="step %{x}: %{y:.4g}<extra>" + kind + "</extra>",
        )
    style.finish(fig, title, STEP, OBJECTIVE, "step", font_size, height=480)
    return _legend_below(fig)


ROUND = "round of the alternation"
DISTANCE = "canonical distance to anchor (L2)"
SHARE = "share of the total gain (%)"


def round_history(rows: Sequence[Mapping], font_size: int = 14,
                  title: str = "Weight matching, round by round: what each round earned",
                  ) -> go.Figure:
    """The alternation's rounds (`rotviz.app.summaries.round_rows`): the canonical distance
    after each (a line, left axis) and each round's share of the total gain in squared
    distance (bars, right axis), so a run that stopped early shows what it left behind."""
    fig = go.Figure()
    x = [str(r["label"]) for r in rows]
    fig.add_bar(x=x, y=[100.0 * float(r["share"]) for r in rows], yaxis="y2",
                name="round's share of the gain (%)", marker={"color": style.color(1)},
                opacity=0.55, hovertemplate="round %{x}: %{y:.2f}% of the gain<extra></extra>")
    fig.add_scatter(x=x, y=[float(r["distance"]) for r in rows], mode="lines+markers",
                    name="distance after the round", line={"color": style.color(0), "width": 2},
                    marker={"symbol": style.marker(0), "size": 8},
                    hovertemplate="round %{x}: %{y:.4f}<extra></extra>")
    style.finish(fig, title, ROUND, DISTANCE, None, font_size, height=360)
    fig.update_layout(yaxis2={"title": {"text": SHARE, "font": {"size": font_size}},
                              "overlaying": "y", "side": "right", "rangemode": "tozero",
                              "showgrid": False, "tickfont": {"size": font_size - 2}},
                      margin={"r": 80})
    fig.update_xaxes(type="category")
    return _legend_below(fig)


def _legend_below(fig: go.Figure) -> go.Figure:
    """A horizontal legend under the x-axis title: long entry names leave the plot its width."""
    fig.update_layout(legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.22,
                              "yanchor": "top"}, margin={"b": 110})
    return fig


def angle_spectrum(series: Mapping[str, Sequence[float]], font_size: int = 14,
                   title: str = "Residual map: eigen-angle spectrum") -> go.Figure:
    """Eigen-angles (degrees, sorted) of one or more orthogonal maps: 0 everywhere is the
    identity; a permutation shows the angles of its cycles."""
    fig = go.Figure()
    for i, (name, angles) in enumerate(series.items()):
        a = [float(v) for v in angles]
        fig.add_scatter(
            x=list(range(len(a))), y=a, mode="lines+markers", name=name,
            line={"color": style.color(i), "dash": style.dash(i), "width": 2},
            marker={"symbol": style.marker(i), "size": 5},
            hovertemplate="%{x}: %{y:.1f}°<extra>" + name + "</extra>",
        )
    fig.update_yaxes(range=[-5, 185], dtick=45)
    return style.finish(fig, title, ANGLE_INDEX, style.ANGLE, "map", font_size, height=380)


def learn_history(rows: Sequence[Mapping], best_step: int | None = None, font_size: int = 14,
                  title: str = "Learned matching: validation barrier while training",
                  ) -> go.Figure:
    """Validation barrier at each check, the mean training loss between checks, and the step
    whose maps were kept."""
    fig = go.Figure()
    steps = [int(r["step"]) for r in rows]
    vb = [float(r["val_barrier"]) for r in rows]
    fig.add_scatter(x=steps, y=vb, mode="lines+markers",
                    name="validation barrier (nats above the straight line)",
                    line={"color": style.color(4), "width": 2.5},
                    marker={"symbol": style.marker(0), "size": 7},
                    hovertemplate="step %{x}: barrier %{y:.4f}<extra></extra>")
    tl = [(int(r["step"]), float(r["train_loss"])) for r in rows
          if r.get("train_loss") is not None]
    if tl:
        fig.add_scatter(x=[s for s, _ in tl], y=[v for _, v in tl], mode="lines+markers",
                        name="training loss half-way, λ ~ U(0.4, 0.6) (cross-entropy)",
                        line={"color": style.color(3), "dash": "dash", "width": 2},
                        marker={"symbol": style.marker(1), "size": 6},
                        hovertemplate="step %{x}: loss %{y:.4f}<extra></extra>")
    if best_step is not None and best_step in steps:
        b = vb[steps.index(best_step)]
        fig.add_scatter(x=[best_step], y=[b], mode="markers", name=f"kept: step {best_step}",
                        marker={"color": style.color(2), "symbol": "star", "size": 16,
                                "line": {"color": "#000000", "width": 1}},
                        hovertemplate="kept the maps of step %{x}<extra></extra>")
    fig.update_yaxes(rangemode="tozero")
    style.finish(fig, title, "training step (Adam updates of the rotations)", NATS, "",
                 font_size, height=420)
    return _legend_below(fig)


def ffn_correlation(before: Sequence[float], after: Sequence[float],
                    layers: Sequence[int] | None = None, font_size: int = 14,
                    title: str = "Activation matching: how alike the paired FFN units fire",
                    ) -> go.Figure:
    """Per layer, the mean correlation of FFN unit k of the anchor with the source unit paired
    with it, before (same index) and after activation matching."""
    names = [str(i) for i in (layers if layers is not None else range(len(before)))]
    fig = go.Figure()
    for i, (label, vals) in enumerate((("before matching (same index)", before),
                                       ("after activation matching", after))):
        fig.add_bar(x=names, y=[float(v) for v in vals], name=label,
                    marker_color=style.color(i * 3), marker_pattern_shape="" if i == 0 else "/",
                    hovertemplate="layer %{x}: %{y:.3f}<extra>" + label + "</extra>")
    fig.update_layout(barmode="group")
    return style.finish(fig, title, "layer (block index)", CORRELATION, "source units",
                        font_size, height=360)

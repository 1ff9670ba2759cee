"""Barriers over training and against the spawn step (Frankle et al., 2020): one line per
matching, the barrier in nats against the step."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from rotviz.plots import style

STEP = "training step (optimiser updates)"
SPAWN_STEP = "spawn step k (parent's optimiser updates before the children split)"


def _lines(d: Mapping, font_size: int, title: str, x_title: str, what: str) -> go.Figure:
    fig = go.Figure()
    for i, m in enumerate(d["matches"]):
        name = style.nice_label(str(m))
        fig.add_scatter(
            x=list(d["x"]), y=[float(v) for v in d["barrier"][m]], mode="lines+markers",
            name=name, line={"color": style.color(i), "dash": style.dash(i), "width": 2.5},
            marker={"symbol": style.marker(i), "size": 8},
            hovertemplate=f"{what} %{{x}}: barrier %{{y:.4f}} nats<extra>{name}</extra>")
    fig = style.finish(fig, title, x_title, style.BARRIER, "matching option", font_size)
    fig.update_layout(legend={"orientation": "h", "y": -0.22, "x": 0})
    return fig


def barriers_over_training(d: Mapping, font_size: int = 14, title: str | None = None
                           ) -> go.Figure:
    """The barrier between the two series at each common step, one line per matching
    (a `rotviz.analysis.training.Barriers.to_dict()` of kind training)."""
    return _lines(d, font_size, title or "Barrier between the two runs over training", STEP,
                  "step")


def instability_by_spawn_step(d: Mapping, font_size: int = 14, title: str | None = None
                              ) -> go.Figure:
    """The barrier between the two children against the step k they were spawned at, one
    line per matching; 0 means the children land in one linearly connected basin."""
    return _lines(d, font_size, title or "Instability: barrier between two children against "
                  "the spawn step", SPAWN_STEP, "k =")

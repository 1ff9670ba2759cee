"""The symmetry ladder: one row per rung (the group growing downwards, the anchor aligned to
itself last), three panels side by side: the barrier, the distance to the anchor and the
accuracy of the simple merge at 0.5."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rotviz.plots import style

PATTERNS = ("", "/", ".")  # per panel, so the bars also differ in grey
SELF_NAME = "align-to-self (the anchor matched onto itself)"
PANELS = (
    ("barrier", "loss barrier", style.BARRIER, "{:.4f}"),
    ("distance", "distance to the anchor", "Euclidean distance after matching (L2 norm)",
     "{:.4f}"),
    ("merged_acc", "merged accuracy (simple, 0.5)", "test accuracy of the merge (fraction, 0-1)",
     "{:.4f}"),
)


def rung_label(r: Mapping) -> str:
    """A rung's row label: its words over its matching SPEC."""
    return f"{r['words']}<br>--match {r['asked']}"


def ladder_figure(d: Mapping, font_size: int = 14, title: str | None = None) -> go.Figure:
    """Horizontal bars per rung (a `rotviz.analysis.ladder.Ladder.to_dict()`): each metric in
    its own panel and colour, the align-to-self rung in black; hovering a bar shows the
    rung's reason the function is unchanged. The accuracy panel marks the anchor's own."""
    rungs = list(d["rungs"])
    labels = [rung_label(r) for r in rungs]
    fig = make_subplots(rows=1, cols=len(PANELS), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[p[1] for p in PANELS])
    for col, (key, name, axis, fmt) in enumerate(PANELS, start=1):
        for is_self in (False, True):
            idx = [i for i, r in enumerate(rungs) if (r["kind"] == "self") == is_self]
            if not idx:
                continue
            values = [float(rungs[i][key]) for i in idx]
            fig.add_bar(
                y=[labels[i] for i in idx], x=values, orientation="h",
                name=SELF_NAME if is_self else name,
                legendgroup="self" if is_self else key, showlegend=not is_self or col == 1,
                marker_color="#000000" if is_self else style.color(col - 1),
                marker_pattern_shape="x" if is_self else PATTERNS[col - 1],
                text=[fmt.format(v) for v in values], textposition="outside",
                cliponaxis=False, customdata=["<br>".join(textwrap.wrap(rungs[i]["reason"], 60))
                                              for i in idx],
                hovertemplate=f"%{{y}}<br>{name}: %{{x:.4f}}<br><br>Why the function is "
                              "unchanged:<br>%{customdata}<extra></extra>", row=1, col=col)
        fig.update_xaxes(title_text=axis, row=1, col=col, rangemode="tozero")
    if d.get("anchor_acc") is not None:
        fig.add_vline(x=float(d["anchor_acc"]), line_dash="dash", line_color=style.GREY,
                      row=1, col=len(PANELS))
        fig.add_scatter(x=[None], y=[None], mode="lines", name="the anchor's own accuracy",
                        line={"dash": "dash", "color": style.GREY})
    fig.update_xaxes(range=[0, 1.15], row=1, col=len(PANELS))
    fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=labels)
    style.finish(fig, title or "The symmetry ladder: what each larger group of symmetries buys",
                 PANELS[0][2], "rung (the group grows downwards)", "measure", font_size,
                 height=230 + 56 * len(rungs))
    fig.update_yaxes(title_standoff=8, automargin=True, row=1, col=1)
    fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -70 / (56 * len(rungs)
                                                                             + 80), "x": 0},
                      bargap=0.3, margin={"t": 90, "b": 120})
    return fig

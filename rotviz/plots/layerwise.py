"""Layer-wise barriers: grouped bars of each block's (or module kind's) barrier, with and
without matching, and the cumulative series as lines."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from rotviz.plots import style

KIND = "module kind (the group of tensors interpolated)"


def layerwise_bars(d: Mapping, font_size: int = 14, title: str | None = None) -> go.Figure:
    """Bars of the barrier when only one group moves (per block or per module kind), matched
    beside unmatched, and the cumulative barrier (groups 0..i moved) as a line per matching.

    `d` is `rotviz.analysis.layerwise.Layerwise.to_dict()`."""
    fig = go.Figure()
    groups = [str(g) for g in d["groups"]]
    matched = style.nice_label(str(d["match"]))
    series = [(f"{matched}: one {d['by']} at a time", d["barrier"], d["cum_barrier"])]
    if d.get("barrier_unmatched") is not None:
        series.insert(0, ("no matching: one " + d["by"] + " at a time", d["barrier_unmatched"],
                          d["cum_barrier_unmatched"]))
    for i, (name, bars, cum) in enumerate(series):
        fig.add_bar(x=groups, y=bars, name=name, marker_color=style.color(i),
                    hovertemplate="%{x}: barrier %{y:.4f}<extra>" + name + "</extra>")
        cname = name.replace(f"one {d['by']} at a time", f"{d['by']}s 0..i together")
        fig.add_scatter(x=groups, y=cum, mode="lines+markers", name=cname,
                        line={"color": style.color(i), "dash": style.dash(i + 1), "width": 2},
                        marker={"symbol": style.marker(i), "size": 7},
                        hovertemplate="up to %{x}: barrier %{y:.4f}<extra>" + cname + "</extra>")
    fig.update_layout(barmode="group")
    x = style.LAYER if d["by"] == "block" else KIND
    return style.finish(fig, title or f"Layer-wise barriers: one {d['by']} interpolated, the "
                        "rest at the anchor", x, style.BARRIER, "path", font_size)

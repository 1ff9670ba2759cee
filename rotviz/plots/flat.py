"""Symmetry's flat directions: per block and kind, the largest relative loss change along an
orbit and the largest |cosine| of the gradient with a tangent, as bars on a log axis, with a
random direction's cosine as the reference line."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from rotviz.plots import style

FLOOR = 1e-18  # exact zeros drawn at the floor of the log axis


def flat_bars(d: Mapping, font_size: int = 14, title: str | None = None) -> go.Figure:
    """`d` is `rotviz.analysis.tangents.FlatResult.to_dict()`."""
    groups: dict[str, list[dict]] = {}
    for row in d["rows"]:
        groups.setdefault(f"L{row['layer']} {row['kind']}", []).append(row)
    x = list(groups)
    series = [("max |relative loss change| along the orbits", "loss_change"),
              ("max |cos(gradient, tangent)|", "cosine")]
    if any(r.get("curvature") is not None for r in d["rows"]):
        series.append(("max |tᵀHt| / |t|² (curvature along tangents)", "curvature"))
    fig = go.Figure()
    for i, (name, key) in enumerate(series):
        ys = [max(FLOOR, max(abs(r[key] or 0.0) for r in rows)) for rows in groups.values()]
        fig.add_bar(x=x, y=ys, name=name, marker_color=style.color(i),
                    hovertemplate="%{x}: %{y:.3g}<extra>" + name + "</extra>")
    fig.add_scatter(x=x, y=[max(FLOOR, d["control_cosine"])] * len(x), mode="lines",
                    name="|cos(gradient, random direction)| (control)",
                    line={"color": style.GREY, "dash": style.dash(1), "width": 2})
    fig.update_layout(barmode="group")
    style.log_axis(fig, "y")
    return style.finish(fig, title or "Flat directions of the symmetry group: loss change, "
                        "gradient cosine and curvature along each tangent",
                        "block and kind (qk: Q-K maps, vo: V-O maps, ffn: unit scales)",
                        "magnitude (dimensionless; curvature in nats per unit²)",
                        "quantity", font_size)

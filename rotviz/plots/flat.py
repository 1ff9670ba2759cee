"""Symmetry's flat directions: per block and kind, the largest relative loss change along an
orbit and the largest |cosine| of the gradient with a tangent, as bars on a log axis, with a
random direction's cosine as the reference line; and per block the group's dimension against
the Hessian's near-zero eigenvalues, as grouped bars."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from rotviz.plots import style

FLOOR = 1e-18  # exact zeros drawn at the floor of the log axis


def flat_bars(d: Mapping, font_size: int = 14, title: str | None = None) -> go.Figure:
    """`d` is `rotviz.analysis.tangents.FlatResult.to_dict()`."""
    groups: dict[str, list[dict]] = {}
    for row in d["rows"]:
        key = "residual" if row["kind"] == "residual" else f"L{row['layer']} {row['kind']}"
        groups.setdefault(key, []).append(row)
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
                        "block and kind (qk: Q-K maps, vo: V-O maps, ffn: unit scales; "
                        "residual: the stream's map)",
                        "magnitude (dimensionless; curvature in nats per unit²)",
                        "quantity", font_size)


def nullity_bars(d: Mapping, font_size: int = 14, title: str | None = None) -> go.Figure:
    """Per block (then the parameters outside the blocks and the whole model), the symmetry
    group's dimension and the number of near-zero eigenvalues of the Hessian restricted to
    those parameters, side by side; an SLQ estimate carries its standard error as an error
    bar. `d` is `FlatResult.to_dict()` with its `nullity` rows."""
    rows = d["nullity"]
    x = [r["block"] if r["method"] == "exact" else f"{r['block']} (slq)" for r in rows]
    fig = go.Figure()
    fig.add_bar(x=x, y=[r["dimension"] for r in rows], name="symmetry group dimension",
                marker_color=style.color(0),
                hovertemplate="%{x}: %{y}<extra>group dimension</extra>")
    errors = [r["error"] if r["method"] == "slq" and r["error"] is not None else 0.0
              for r in rows]  # None: an slq count from one probe, with no error to draw
    fig.add_bar(x=x, y=[r["near_zero"] for r in rows],
                name="near-zero Hessian eigenvalues", marker_color=style.color(1),
                error_y={"type": "data", "array": errors, "visible": any(errors)},
                hovertemplate="%{x}: %{y:.4g}<extra>near-zero eigenvalues</extra>")
    fig.update_layout(barmode="group")
    tol = rows[0]["tolerance"] if rows else 0.0
    return style.finish(fig, title or "Symmetry group dimension against near-zero Hessian "
                        f"eigenvalues (|λ| ≤ {tol:.3g} λ_max), per block",
                        "parameter group (block; 'model': all parameters, every block's "
                        "group and the residual map)", "count (dimensions, eigenvalues)",
                        "quantity", font_size)


def flat_figure(d: Mapping) -> go.Figure:
    """The record's figure: the dimension against the near-zero eigenvalues when they were
    counted, else the tangents' checks."""
    return nullity_bars(d) if d.get("nullity") else flat_bars(d)

"""Many models aligned at once (rotviz.analysis.many): the pairwise distance matrix before and
after alignment, and the merged model's accuracy against the number of models merged."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rotviz.plots import style


def short_names(refs: Sequence[str]) -> list[str]:
    """Model references without their `zoo:` prefix or folder path, for axis ticks."""
    return [str(r).removeprefix("zoo:").rstrip("/").rsplit("/", 1)[-1] for r in refs]


def distance_matrices(d: Mapping, font_size: int = 14) -> go.Figure:
    """Two heat maps side by side, the pairwise distances before and after alignment, on one
    shared colour scale (0 to the largest distance of either), so colours compare across."""
    names = short_names(d["refs"])
    top = max(max(row) for m in (d["before"], d["after"]) for row in m) or 1.0
    how = "the anchor" if d["to"] == "anchor" else "the barycentre"
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("as given", f"aligned to {how}"))
    for col, key in enumerate(("before", "after"), start=1):
        z = d[key]
        fig.add_trace(go.Heatmap(
            z=z, x=names, y=names, coloraxis="coloraxis", name=key,
            text=[[f"{v:.2f}" for v in row] for row in z], texttemplate="%{text}",
            hovertemplate="%{y} to %{x}: %{z:.3f}<extra>" + key + "</extra>"), 1, col)
        fig.update_xaxes(title_text="model", row=1, col=col)
        fig.update_yaxes(title_text="model", autorange="reversed", row=1, col=col)
    fig.update_layout(coloraxis={"colorscale": style.SEQUENTIAL, "cmin": 0.0, "cmax": top,
                                 "colorbar": {"title": {"text": "distance (L2)"}}})
    style.finish(fig, f"Pairwise parameter distance before and after alignment "
                 f"[{style.nice_label(d['match'])}]", "model", "model", font_size=font_size,
                 legend=False)
    fig.update_xaxes(title_text="model")
    return fig


def merged_by_count(d: Mapping, font_size: int = 14,
                    acc_range: Sequence[float] | None = None) -> go.Figure:
    """The merged model's test accuracy against the number of models merged (the first k),
    aligned and as given, beside the best single model. The accuracy axis follows the data
    unless `acc_range` is given (`style.ACC_FIXED`: 0-1)."""
    fig = go.Figure()
    for i, key in enumerate(("aligned", "unaligned")):
        label = f"aligned ({d['to']})" if key == "aligned" else "not aligned"
        fig.add_scatter(x=d["k"], y=d["acc"][key], mode="lines+markers", name=label,
                        line={"color": style.color(3 if i == 0 else 0), "dash": style.dash(i)},
                        marker={"symbol": style.marker(i)},
                        hovertemplate="%{x} models: %{y:.4f}<extra>" + label + "</extra>")
    best = max(d["model_acc"])
    fig.add_scatter(x=[d["k"][0], d["k"][-1]], y=[best, best], mode="lines",
                    name="best single model", line={"color": style.GREY, "dash": "dot"})
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(range=list(acc_range) if acc_range is not None else style.acc_range(
        [*d["acc"]["aligned"], *d["acc"]["unaligned"], best]))
    return style.finish(fig, "Merged model's accuracy against the number of models merged",
                        "models merged (the first k, equal weights)", style.ACCURACY,
                        "models", font_size)

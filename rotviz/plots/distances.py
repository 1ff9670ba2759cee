"""Parameter distances before and after matching, and the per-option ablation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rotviz.plots import style

KIND_NAMES = {
    "q": "W_Q", "k": "W_K", "v": "W_V", "o": "W_O", "ffn_in": "FFN in", "ffn_out": "FFN out",
    "norms": "norms", "embeddings": "embeddings", "head": "output head", "other": "other",
}


def _order(keys) -> list[str]:
    """Layers in numeric order with 'rest' last; kinds in the order given."""
    keys = list(keys)
    if all(k == "rest" or str(k).isdigit() for k in keys):
        return sorted(keys, key=lambda k: (k == "rest", int(k) if str(k).isdigit() else 0))
    return keys


def distance_bars(
    before: Mapping[str, float],
    after: Mapping[str, float],
    by: str = "layer",
    font_size: int = 14,
) -> go.Figure:
    """Grouped bars: distance to the anchor before and after matching, per layer or per kind."""
    keys = _order(list(before) + [k for k in after if k not in before])
    names = [KIND_NAMES.get(k, k) for k in keys] if by == "kind" else [str(k) for k in keys]
    fig = go.Figure()
    for i, (label, values) in enumerate((("before matching", before), ("after matching", after))):
        fig.add_bar(
            x=names, y=[float(values.get(k, 0.0)) for k in keys], name=label,
            marker_color=style.color(i * 3), marker_pattern_shape="" if i == 0 else "/",
            hovertemplate="%{x}: %{y:.3f}<extra>" + label + "</extra>",
        )
    fig.update_layout(barmode="group")
    x = style.LAYER if by == "layer" else "module kind (which weights)"
    title = "Distance to the anchor per " + ("layer" if by == "layer" else "module kind")
    return style.finish(fig, title, x, style.DISTANCE, "source model", font_size)


def ablation_bars(rows: Sequence[Mapping], font_size: int = 14) -> go.Figure:
    """One bar per matching option: total distance, and the loss barrier where measured.

    Each row has `match` (SPEC), `distance` and optionally `barrier`. Bars are horizontal so
    the option names read in full.
    """
    labels = [style.nice_label(str(r["match"])) for r in rows]
    has_barrier = any(r.get("barrier") is not None for r in rows)
    titles = ["distance to the anchor"] + (["loss barrier"] if has_barrier else [])
    fig = make_subplots(rows=1, cols=len(titles), horizontal_spacing=0.06, subplot_titles=titles,
                        shared_yaxes=True)
    d = [float(r["distance"]) for r in rows]
    fig.add_bar(y=labels, x=d, orientation="h", name="distance to the anchor",
                marker_color=style.color(3), row=1, col=1, text=[f"{v:.2f}" for v in d],
                textposition="outside", cliponaxis=False,
                hovertemplate="%{y}: %{x:.3f}<extra>distance</extra>")
    fig.update_xaxes(title_text="Euclidean distance (L2 norm)", row=1, col=1)
    if has_barrier:
        b = [r.get("barrier") for r in rows]
        fig.add_bar(y=labels, x=b, orientation="h", name="loss barrier",
                    marker_color=style.color(4), marker_pattern_shape="/", row=1, col=2,
                    text=[f"{v:.2f}" if v is not None else "" for v in b],
                    textposition="outside", cliponaxis=False,
                    hovertemplate="%{y}: %{x:.3f}<extra>barrier</extra>")
        fig.update_xaxes(title_text="loss barrier (nats above the straight line)", row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    style.finish(fig, "What each matching option buys (shorter bars are better)",
                 "Euclidean distance (L2 norm)", "matching option (what was aligned)", "measure",
                 font_size, height=120 + 60 * len(rows))
    fig.update_layout(legend={"orientation": "h", "y": -0.25, "x": 0})
    return fig

"""The seed paper's Figure 6: which layers must be matched for the merge to work."""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from rotviz.plots import style


def layer_sweeps(sweeps: Mapping, metric: str = "mid_loss", font_size: int = 14) -> go.Figure:
    """Two lines over the layers: matching only layer i, and matching the last k layers
    (plotted at the first layer they start from), with no matching and every layer matched
    as horizontal references. `sweeps` is `rotviz.analysis.ablations.LayerSweeps.to_dict()`."""
    n = int(sweeps["n_layers"])
    names = {"mid_loss": "loss of the merged model (α = 0.5, nats)",
             "barrier": "loss barrier (nats above the straight line)",
             "mid_acc": "accuracy of the merged model (fraction correct, 0-1)"}
    fig = go.Figure()
    single = [float(p[metric]) for p in sweeps["single"]]
    tail = [float(p[metric]) for p in sweeps["tail"]]  # tail[k - 1]: the last k layers
    fig.add_scatter(x=list(range(n)), y=single, mode="lines+markers", name="only layer i",
                    line={"color": style.color(0), "dash": style.dash(0)},
                    marker={"symbol": style.marker(0)})
    fig.add_scatter(x=[n - k for k in range(1, n + 1)], y=tail, mode="lines+markers",
                    name="layers i to the last", line={"color": style.color(1),
                                                       "dash": style.dash(1)},
                    marker={"symbol": style.marker(1)})
    for j, (key, label) in enumerate((("none", "no layer matched"),
                                      ("all", "every layer matched"))):
        fig.add_hline(y=float(sweeps[key][metric]), line_dash=style.dash(2 + j),
                      line_color=style.color(2 + j))
        fig.add_scatter(x=[None], y=[None], mode="lines", name=label,
                        line={"color": style.color(2 + j), "dash": style.dash(2 + j)})
    title = f"Which layers must be matched ({style.nice_label(sweeps['match'])})"
    return style.finish(fig, title, "layer (block index)", names.get(metric, metric),
                        "layers matched", font_size)

"""Merged-model accuracy, per fusion method, with and without matching first."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from rotviz.plots import style


def fusion_chart(rows: Sequence[Mapping], metric: str = "acc", font_size: int = 14,
                 references: Mapping[str, float] | None = None,
                 y_range: Sequence[float] | None = None) -> go.Figure:
    """Grouped bars: one group per fusion method, one bar per matching setting.

    Each row has `method`, `matching` (a label) and the metric (`acc` or `loss`).
    `references` (e.g. {"anchor": 0.95, "source": 0.94}) are drawn as horizontal lines.
    A 0-1 score's axis starts at 0 (bars) and ends just above the highest bar or line,
    unless `y_range` is given (`style.ACC_FIXED` for the 0-1 scale, or one range shared
    with a chart it is compared with).
    """
    methods = list(dict.fromkeys(str(r["method"]) for r in rows))
    settings = list(dict.fromkeys(str(r["matching"]) for r in rows))
    fig = go.Figure()
    for i, s in enumerate(settings):
        by_method = {str(r["method"]): r for r in rows if str(r["matching"]) == s}
        fig.add_bar(
            x=methods, y=[by_method[m][metric] if m in by_method else None for m in methods],
            name=style.nice_label(s), marker_color=style.color(i),
            marker_pattern_shape=("", "/", ".", "x", "-")[i % 5],
            hovertemplate="%{x}: %{y:.3f}<extra>" + style.nice_label(s) + "</extra>",
        )
    for j, (name, value) in enumerate((references or {}).items()):
        fig.add_scatter(
            x=methods, y=[float(value)] * len(methods), mode="lines", name=name,
            line={"color": "#000000" if j == 0 else style.GREY, "dash": ("dash", "dot")[j % 2]},
            hovertemplate=f"{name}: {float(value):.3f}<extra></extra>",
        )
    fig.update_layout(barmode="group")
    named = {"acc": ("accuracy", style.ACCURACY), "loss": ("loss", style.LOSS)}
    what = style.metric_label(metric)
    word, y = named.get(metric, (what, f"test {what} (0-1, higher is better)"))
    if metric not in ("loss", "mse"):
        values = [r[metric] for r in rows if metric in r] + list((references or {}).values())
        fig.update_yaxes(range=list(y_range) if y_range is not None else bar_range(values))
    title = f"Merged model {word} per fusion method"
    return style.finish(fig, title, "fusion method", y, "matching before fusion", font_size)


def bar_range(values: Sequence[float], fixed: bool = False) -> list[float]:
    """The y range of bars of a 0-1 score: from 0 (a bar's length is its value) to just above
    the data (`style.acc_range`'s top), or the fixed 0-1 scale."""
    return [0.0, style.acc_range(values, fixed)[1]]


SWEPT = {"weight": "weight of the source (0 = anchor, 1 = source)",
         "scale": "λ, the scale of the merged task vector",
         "density": "density (share of each task vector kept, 0-1)",
         "alpha": "RegMean's off-diagonal scale α (0-1)"}


def sweep_chart(sweeps: Sequence[Mapping], metric: str = "acc", font_size: int = 14,
                acc_range: Sequence[float] | None = None) -> go.Figure:
    """Merged accuracy (or loss) against the swept number, one line per matching setting
    (each a `MergeSweep.to_dict()` of one method and parameter), the anchor's and the
    source's own values as dashed lines. The accuracy axis follows the lines
    (`style.acc_range`) unless `acc_range` is given (`style.ACC_FIXED`: 0-1)."""
    first = sweeps[0]
    param = str(first["param"])
    fig = go.Figure()
    for i, d in enumerate(sweeps):
        fig.add_scatter(x=d["values"], y=d[metric], mode="lines+markers",
                        name=style.nice_label(d["match"]),
                        line={"color": style.color(i), "dash": style.dash(i)},
                        marker={"symbol": style.marker(i)},
                        hovertemplate=f"{param} %{{x:.3g}}: %{{y:.4f}}<extra>"
                                      f"{style.nice_label(d['match'])}</extra>")
    xs = [min(min(d["values"]) for d in sweeps), max(max(d["values"]) for d in sweeps)]
    for j, who in enumerate(("anchor", "source")):
        value = float(first[f"{who}_{metric}"])
        fig.add_scatter(x=xs, y=[value, value], mode="lines", name=f"{who} ({value:.3f})",
                        line={"color": "#000000" if j == 0 else style.GREY,
                              "dash": ("dash", "dot")[j]},
                        hovertemplate=f"{who}: {value:.4f}<extra></extra>")
    named = {"acc": ("accuracy", style.ACCURACY), "loss": ("loss", style.LOSS)}
    word, y = named.get(metric, (metric, metric))
    title = (f"Merged model {word} against {param} ({first['method']}"
             f"{', base ' + first['base'] if first.get('base') else ''})")
    fig = style.finish(fig, title, SWEPT.get(param, param), y, "matching before merging",
                       font_size)
    if metric == "acc":
        fig.update_yaxes(range=list(acc_range) if acc_range is not None else style.acc_range(
            [v for d in sweeps for v in d["acc"]] + [first["anchor_acc"], first["source_acc"]]))
    return fig

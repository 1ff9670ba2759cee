"""One look for every rotviz figure: a colour-blind-safe palette, axis labels with units.

The Okabe-Ito palette stays distinguishable under the common colour-vision deficiencies;
lines also differ in dash and marker so a figure printed in grey still reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import plotly.graph_objects as go

from rotviz.symmetry import registry

# Okabe & Ito (2008), "Color Universal Design"; black last, it is reserved for references.
OKABE_ITO = (
    "#E69F00",  # orange
    "#56B4E9",  # sky blue
    "#009E73",  # bluish green
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#CC79A7",  # reddish purple
    "#F0E442",  # yellow (weak on white: used last)
    "#000000",
)
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
MARKERS = ("circle", "square", "diamond", "triangle-up", "x", "cross", "star", "pentagon")
GREY = "#7F7F7F"

# Colour scales: sequential 'Viridis' and diverging 'RdBu' (reversed: red = positive) are
# both readable with red-green colour blindness.
SEQUENTIAL = "Viridis"
DIVERGING = "RdBu_r"

# Axis labels, with units, shared by every page so the same quantity reads the same way.
DISTANCE = "Euclidean distance (L2 norm of parameter difference)"
ALPHA = "interpolation coefficient α (0 = anchor, 1 = source, matched as the legend says)"
LOSS = "test loss (cross-entropy, nats)"
ACCURACY = "test accuracy (fraction correct, 0-1)"
BARRIER = "loss barrier (nats above the straight line)"
SINGULAR = "singular value of the cross matrix (unitless)"
ANGLE = "rotation angle (degrees)"
HEAD = "attention head (index)"
LAYER = "layer (block index; 'rest' = embeddings, final norm, head)"


# The fixed accuracy scale: the whole 0-1 range (a little headroom so that markers at 1 show).
ACC_FIXED = (0.0, 1.02)


def acc_range(values: Iterable[float], fixed: bool = False) -> list[float]:
    """The y range of an accuracy axis drawn over `values`.

    By default it follows the data: their span, padded by 5 % of it (at least 0.01) on each
    side and kept within -0.02..1.02, so that curves near 0.15 or 0.95 are not drawn as flat
    lines on a 0-1 axis. `fixed` gives the whole 0-1 scale, to compare figures at a glance.
    Panels that are compared take one range over all their values (pass them all here).
    """
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if fixed or not finite:
        return list(ACC_FIXED)
    lo, hi = min(finite), max(finite)
    pad = max(0.05 * (hi - lo), 0.01)
    return [max(lo - pad, -0.02), min(hi + pad, ACC_FIXED[1])]


def color(i: int) -> str:
    """The i-th palette colour (cycling, skipping black unless asked for 8+)."""
    return OKABE_ITO[i % (len(OKABE_ITO) - 1)]


def dash(i: int) -> str:
    return DASHES[i % len(DASHES)]


def marker(i: int) -> str:
    return MARKERS[i % len(MARKERS)]


def finish(
    fig: go.Figure,
    title: str,
    x: str,
    y: str,
    legend_title: str | None = None,
    font_size: int = 14,
    height: int | None = None,
    legend: bool = True,
) -> go.Figure:
    """Title, axis labels, legend and font, the same way for every figure.

    `legend=False` is for heatmaps and contours, whose colour bar (titled, with units) is
    the legend.
    """
    fig.update_layout(
        title={"text": title, "x": 0.0, "xanchor": "left"},
        xaxis_title=x,
        yaxis_title=y,
        legend_title_text=legend_title,
        showlegend=legend,
        font={"size": font_size},
        template="plotly_white",
        colorway=list(OKABE_ITO),
        margin={"l": 70, "r": 30, "t": 70, "b": 60},
    )
    if height is not None:
        fig.update_layout(height=height)
    fig.update_xaxes(title_font_size=font_size, tickfont_size=font_size - 2)
    fig.update_yaxes(title_font_size=font_size, tickfont_size=font_size - 2)
    return fig


def evaluated_on(d: dict) -> str:
    """What a result was evaluated on, for a title: "digits (test)", from a result's "data"
    and "split" (the split alone where the result holds no data reference)."""
    return f"{d['data']} ({d['split']})" if d.get("data") else str(d["split"])


def log_axis(fig: go.Figure, axis: str = "y", **where) -> None:
    """A log axis with one labelled tick per decade (1, 10, 100 or 10⁻², 10⁻¹, ...)."""
    upd = fig.update_yaxes if axis == "y" else fig.update_xaxes
    upd(type="log", dtick=1, exponentformat="power", minor={"showgrid": True}, **where)


def nice_label(label: str) -> str:
    """Matching option labels ('ffn,attn') in plain words for legends."""
    parts = [p for p in label.split(",") if p]
    return " + ".join(registry.label(p) for p in parts) or "no matching"


def labels_of(items: Sequence[dict], key: str = "label") -> list[str]:
    return [str(it[key]) for it in items]


# The task metrics beyond loss and accuracy (rotviz.data.tasks), as charts and tables name them.
METRIC_NAMES = {"macro_f1": "macro-F1", "micro_f1": "micro-F1",
                "entity_f1": "entity micro-F1", "mse": "mean squared error"}
METRIC_HELP = {
    "macro_f1": "F1 of each class (label, tag) averaged with equal weight: rare classes count "
                "as much as common ones (0-1, higher is better)",
    "micro_f1": "F1 over every label decision pooled (0-1, higher is better)",
    "entity_f1": "F1 over whole entities of the BIO tags, as conlleval counts them: an entity "
                 "counts only when its type and both ends are right (0-1, higher is better)",
    "mse": "mean squared error of the regression outputs (lower is better)",
}


def metric_label(key: str) -> str:
    return METRIC_NAMES.get(key, key)


def metric_help(key: str) -> str:
    return METRIC_HELP.get(key, key)

"""Distances: how far the source is from the anchor before and after matching, in total,
per layer and per kind of weight (what matching minimises; docs/solvers.md): the record
and its figure, and the seed paper's ablation of the matching options (`ablation`: each
SPEC's distance, per layer and per kind, with its barrier) and its figure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from rotviz.measures.barrier import match_label
from rotviz.measures.registry import Context, Measurement, register
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import torch

    from rotviz.data.split import Split
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress


class _Result(dict):
    def to_dict(self) -> dict:
        return dict(self)


def _run(ends, ctx: Context, v: dict) -> _Result:
    """What matching did, from the endpoints (held or streamed alike): nothing to compute."""
    i = ends.info
    return _Result(match=i.match, layers=ends.layers, anchor=ends.anchor_ref,
                   source=ends.source_ref, distance_before=i.distance_before,
                   distance_after=i.distance_after, max_output_diff=i.max_output_diff,
                   before=i.before, after=i.after, match_seconds=i.seconds)


def _summary(d, how: str) -> str:
    return (f"distances [{match_label(d['match'], d['layers'])}]{how}: {d['distance_before']:.4f}"
            f" -> {d['distance_after']:.4f} (Euclidean, parameter units); max output "
            f"difference {d['max_output_diff'] or 0.0:.2e}")


def _rows(d: dict) -> list[dict]:
    """The total first (by `total`, part `all`), then per layer and per kind."""
    out = [{"by": "total", "part": "all", "before": d["before"]["total"],
            "after": d["after"]["total"]}]
    for by in ("per_layer", "per_kind"):
        for k, before in d["before"].get(by, {}).items():
            out.append({"by": by.removeprefix("per_"), "part": k, "before": before,
                        "after": d["after"].get(by, {}).get(k)})
    return out


ABLATION_SPECS = ("none", "ffn", "attn", "ffn,attn", "seed")


@dataclass
class AblationRow:
    match: str  # canonical SPEC
    distance: float  # to the anchor, total
    per_layer: dict[str, float]  # block index, or "rest"
    per_kind: dict[str, float]  # q, k, v, o, ffn_in, ffn_out, norms, embeddings, head, other
    barrier: float
    loss_range: float
    mid_loss: float
    mid_acc: float
    alphas: list[float]
    loss: list[float]
    acc: list[float]
    match_seconds: float
    max_output_diff: float | None


@dataclass
class Ablation:
    rows: list[AblationRow]
    distance_none: float  # distance before any matching
    data: str
    split: str
    device: str
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def _spread(progress: Progress | None, k: int, total: int, label: str) -> Progress | None:
    """Progress of step k of `total`, each with its own inner progress."""
    if progress is None:
        return None
    return lambda d, t, m: progress(k * t + d, total * t, f"[{label}] {m}")


def ablation(
    anchor: Loaded,
    source: Loaded,
    split: Split,
    specs: Sequence[str] = ABLATION_SPECS,
    points: int = 21,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    batch_size: int = 512,
) -> Ablation:
    """ablation(anchor, source, split, specs=ABLATION_SPECS, points=21, device=) -> Ablation

    For each matching SPEC (none, ffn, attn, ffn+attn, seed by default; the seed paper's
    Figures 3-5), the distance to the anchor (total, per layer, per module kind) and the
    interpolation curve with its barrier, loss range and midpoint accuracy. The data is
    moved to the device once and every curve runs on the anchor's one module."""
    import time

    from rotviz.evaluation import Evaluator
    from rotviz.match.endpoints import match_endpoints
    from rotviz.match.selection import parse_selection
    from rotviz.measures.barrier import curve_on

    t0 = time.perf_counter()
    parsed = [parse_selection(s) for s in specs]
    ev = Evaluator(anchor, split, device, batch_size)
    rows = []
    d0 = 0.0
    for k, spec in enumerate(parsed):
        options = None if spec.is_none else spec.options()
        ends = match_endpoints(anchor, source, options, ev.device, data=split)
        info = ends.info
        d0 = info.distance_before
        c = curve_on(ends, split, points, ev.device, evaluator=ev,
                     progress=_spread(progress, k, len(parsed), spec.label))
        rows.append(AblationRow(
            match=spec.label, distance=info.distance_after, per_layer=info.after["per_layer"],
            per_kind=info.after["per_kind"], barrier=c.barrier, loss_range=c.loss_range,
            mid_loss=c.mid_loss, mid_acc=c.mid_acc, alphas=c.alphas, loss=c.loss, acc=c.acc,
            match_seconds=info.seconds, max_output_diff=info.max_output_diff,
        ))
    return Ablation(rows, d0, split.data, split.split, str(ev.device), time.perf_counter() - t0)


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
    log: bool = False,
) -> go.Figure:
    """Grouped bars: distance to the anchor before and after matching, per layer or per kind;
    `log`: the distance on a log axis (layers that matching moves far apart beside ones it
    barely moves)."""
    import plotly.graph_objects as go

    from rotviz.plots import style

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
    fig = style.finish(fig, title, x, style.DISTANCE, "source model", font_size)
    if log:
        style.log_axis(fig)
    return fig


def ablation_bars(rows: Sequence[Mapping], font_size: int = 14) -> go.Figure:
    """One bar per matching option: total distance, and the loss barrier where measured.

    Each row has `match` (SPEC), `distance` and optionally `barrier`. Bars are horizontal so
    the option names read in full.
    """
    from plotly.subplots import make_subplots

    from rotviz.plots import style

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


def _plot(d: dict, look: Style):
    return distance_bars(d["before"]["per_layer"], d["after"]["per_layer"],
                         font_size=look.font_size, log=look.log)


DISTANCES = register(Measurement(
    "distances", "Distances", "distance to the anchor before and after matching, per layer "
    "and per kind of weight", _run, summary=_summary, plot=_plot, rows=_rows, at_size=_run,
    data=False, narrower=True, order=50))

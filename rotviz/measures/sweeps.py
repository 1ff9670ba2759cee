"""Layer sweeps (the seed paper's Figure 6): match one layer at a time, and the last k layers
for k = 1..L, with the pair's matching; for each, the distance, the barrier on a short path
and the loss and accuracy of the simple average (alpha = 0.5). Here: the record, the sweeps
(`layer_sweeps`) and their figure (`sweeps_figure`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from rotviz.limits import BATCH_SIZE, POINTS
from rotviz.measures.registry import Context, Measurement, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import torch

    from rotviz.data.split import Split
    from rotviz.match.options import MatchOptions
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

PARAMS = (
    Param("points", 11, f"points on each path (default 11, {POINTS.text})", POINTS,
          label="Points on each path", widget=(3, 21, 2)),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)


@dataclass
class SweepPoint:
    layers: list[int]  # the layers matched
    distance: float
    barrier: float
    loss_range: float
    mid_loss: float  # loss of the simple average (alpha = 0.5): the seed paper's Figure 6
    mid_acc: float


@dataclass
class LayerSweeps:
    match: str  # SPEC applied to the chosen layers
    n_layers: int
    none: SweepPoint  # no layer matched
    all: SweepPoint  # every layer matched
    single: list[SweepPoint]  # single[i]: only layer i matched
    tail: list[SweepPoint]  # tail[k - 1]: the last k layers matched
    points: int
    data: str
    split: str
    device: str
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def layer_sweeps(
    anchor: Loaded,
    source: Loaded,
    split: Split,
    spec: str | MatchOptions = "seed",
    points: int = 11,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    batch_size: int = 512,
) -> LayerSweeps:
    """layer_sweeps(anchor, source, split, spec="seed", points=11, device=) -> LayerSweeps

    Single-layer and tail-layers matching (the seed paper's Figure 6): which layers must be
    matched for the merge to work.
    """
    import time

    from rotviz.evaluation import Evaluator
    from rotviz.match.endpoints import match_endpoints
    from rotviz.match.options import MatchOptions
    from rotviz.match.selection import parse_selection, selection_of
    from rotviz.measures.barrier import curve_on

    t0 = time.perf_counter()
    s = selection_of(spec) if isinstance(spec, MatchOptions) else parse_selection(spec)
    ev = Evaluator(anchor, split, device, batch_size)
    n = n_layers(anchor)
    subsets: list[tuple[int, ...] | None] = [()]
    subsets += [(i,) for i in range(n)]
    subsets += [tuple(range(n - k, n)) for k in range(1, n + 1)]
    cache: dict[tuple[int, ...], SweepPoint] = {}
    for j, layers in enumerate(subsets):
        if layers in cache:
            continue
        options = None if (s.is_none or not layers) else s.options(layers)
        ends = match_endpoints(anchor, source, options, ev.device, data=split)
        info = ends.info
        c = curve_on(ends, split, points, ev.device, evaluator=ev)
        cache[layers] = SweepPoint(list(layers), info.distance_after, c.barrier, c.loss_range,
                                   c.mid_loss, c.mid_acc)
        if progress:
            progress(j + 1, len(subsets), f"layers {list(layers)}")
    full = tuple(range(n))
    return LayerSweeps(
        match=s.label, n_layers=n, none=cache[()], all=cache[full],
        single=[cache[(i,)] for i in range(n)],
        tail=[cache[tuple(range(n - k, n))] for k in range(1, n + 1)],
        points=points, data=split.data, split=split.split, device=str(ev.device),
        seconds=time.perf_counter() - t0,
    )


def n_layers(loaded: Loaded) -> int:
    """The number of transformer blocks of a loaded model."""
    from rotviz.symmetry.view import resolve_layout

    return len(resolve_layout(loaded.spec, loaded.state).blocks)


def _run(ends, ctx: Context, v: dict):
    return layer_sweeps(ends.anchor, ends.source, ctx.split, ends.match, v["points"],
                        ctx.device, ctx.progress, v["batch_size"])


def _summary(s, how: str) -> str:
    best = min(range(s.n_layers), key=lambda i: s.single[i].mid_loss)
    return (f"layer sweeps [{s.match}]{how}: merged loss {s.none.mid_loss:.4f} unmatched, "
            f"{s.all.mid_loss:.4f} all layers matched, {s.single[best].mid_loss:.4f} matching "
            f"only layer {best} (the best single layer); {s.seconds:.2f} s")


def _rows(d: dict) -> list[dict]:
    out = [{"matched": "none", **{k: d["none"][k] for k in ("distance", "barrier", "mid_loss",
                                                             "mid_acc")}},
           {"matched": "all", **{k: d["all"][k] for k in ("distance", "barrier", "mid_loss",
                                                           "mid_acc")}}]
    for kind in ("single", "tail"):
        for p in d[kind]:
            out.append({"matched": f"{kind} {','.join(map(str, p['layers']))}",
                        **{k: p[k] for k in ("distance", "barrier", "mid_loss", "mid_acc")}})
    return out


def _match_check(options) -> str | None:
    """Sweeps vary which layers are matched: with no matching every row is the unmatched
    pair, and its "best single layer" would mean nothing."""
    if options is None:
        return ("sweeps varies which layers are matched, and --match none matches none: "
                "give a matching, e.g. --match seed")
    return None


def sweeps_figure(sweeps: Mapping, metric: str = "mid_loss", font_size: int = 14) -> go.Figure:
    """Two lines over the layers: matching only layer i, and matching the last k layers
    (plotted at the first layer they start from), with no matching and every layer matched
    as horizontal references. `sweeps` is `LayerSweeps.to_dict()`."""
    import plotly.graph_objects as go

    from rotviz.plots import style

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


def _plot(d: dict, look: Style):
    return sweeps_figure(d, font_size=look.font_size)


SWEEPS = register(Measurement(
    "sweeps", "Layer sweeps (which layers to match)",
    "the merge when one layer, or the last k layers, are matched (the seed paper's Figure 6)",
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows, match_check=_match_check,
    refusal="layer sweeps match the pair once per layer subset, in memory", order=70))

"""Variance collapse (Jordan et al., ICLR 2023): along the straight path from the anchor to
the matched source, how much of its activations' spread the interpolated model keeps. For
each block and each kind of unit (the residual stream after the block, the FFN hidden units
before the activation, each head's output: rotviz.analysis.activations), the ratio

    std_alpha(u) / ((1 - alpha) std_A(u) + alpha std_B'(u)),

per unit u, averaged over the block's units. At alpha 0 and 1 it is 1; below 1 the
interpolated model's activations have collapsed towards their mean. The record, its
computation (`collapse_on`) and its figure (heat maps, layer against alpha, one per kind)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from rotviz.limits import BATCH_SIZE, POINTS
from rotviz.measures.barrier import match_label
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import torch

    from rotviz.data.split import Split
    from rotviz.match.endpoints import HeldEndpoints
    from rotviz.types import Progress

KIND_LABELS = {"residual": "residual stream after the block",
               "ffn": "FFN hidden units (pre-activation)",
               "heads": "attention heads' outputs"}
SHORT = {"residual": "residual stream", "ffn": "FFN hidden (pre-activation)",
         "heads": "head outputs"}
COLOUR_BAR = "std ratio (interpolated / interpolated endpoints)"

PARAMS = (
    Param("points", 11, f"number of alphas in [0, 1] (default 11, {POINTS.text})", POINTS,
          label="Points on the path", widget=(3, 21, 2), essential=True),
    Param("batch_size", 256, f"batch size of the activation passes (default 256, "
          f"{BATCH_SIZE.text})", BATCH_SIZE, label="Batch size"),
)


@dataclass
class Collapse:
    """The std ratio per kind, block and alpha, and the endpoints' own average stds."""

    alphas: list[float]
    layers: list[int]
    ratio: dict[str, list[list[float]]]  # kind -> [layer][alpha]
    anchor_std: dict[str, list[float]]  # kind -> per layer, the average std over units
    source_std: dict[str, list[float]]  # the matched source's
    match: str
    data: str
    split: str
    n: int  # examples
    tokens: int  # non-padding tokens the statistics are taken over
    device: str
    seconds: float
    anchor: str = ""
    source: str = ""
    layers_matched: list[int] | None = None
    distance_before: float = 0.0
    distance_after: float = 0.0
    kinds: list[str] = field(default_factory=lambda: list(KIND_LABELS))

    @property
    def lowest(self) -> tuple[float, str, int, float]:
        """(the lowest ratio, its kind, layer and alpha)."""
        best = (float("inf"), "", 0, 0.0)
        for k, rows in self.ratio.items():
            for i, row in enumerate(rows):
                for a, r in zip(self.alphas, row, strict=True):
                    if r == r and r < best[0]:
                        best = (r, k, self.layers[i], a)
        return best

    def to_dict(self) -> dict:
        return asdict(self)


def collapse_on(ends: HeldEndpoints, split: Split, points: int = 11,
                device: str | torch.device = "cpu", progress: Progress | None = None,
                batch_size: int = 256) -> Collapse:
    """collapse_on(endpoints, split, points=11, device=) -> Collapse

    The activation statistics of the anchor, the matched source and each interpolated model
    at `points` evenly spaced alphas (rotviz.analysis.paths.path_point), on every
    non-padding token of `split`, and their std ratios."""
    from rotviz.analysis.activations import activation_stats
    from rotviz.analysis.paths import path_point
    from rotviz.evaluation import Evaluator

    POINTS.check(points)
    t0 = time.perf_counter()
    anchor = ends.anchor
    ev = Evaluator(anchor, split, device, batch_size)
    a_params, b_params = ev.params(anchor.state), ev.params(ends.matched)

    def stats_at(alpha: float):
        return activation_stats(anchor, path_point(a_params, b_params, alpha), split,
                                evaluator=ev)

    return _collapse(ends, ends.info, split, points, stats_at, str(ev.device), t0, progress)


def sized_collapse(ends, split: Split, points: int = 11, device: str | torch.device = "cpu",
                   progress: Progress | None = None, batch_size: int = 256) -> Collapse:
    """`collapse_on` at size: each model of the path (the anchor, the matched source and
    each point between) runs block by block, every block's tensors the path's point of the
    two checkpoints' read just before it runs (rotviz.atsize.points.Opened), its statistics
    taken by the same hooks (rotviz.analysis.activations, `at_size`)."""
    from rotviz.analysis.activations import activation_stats
    from rotviz.analysis.paths import path_point
    from rotviz.atsize.points import Opened
    from rotviz.match.endpoints import MatchInfo
    from rotviz.memory import release

    POINTS.check(points)
    t0 = time.perf_counter()
    op = Opened([ends.anchor_path, ends.matched_path], split, device, batch_size)
    model = op.models[0]

    def mix(alpha: float, names) -> dict:
        return path_point(op.read(0, names), op.read(1, names), alpha)

    def stats_at(alpha: float):
        runner = model.runner(op.module, lambda names: mix(alpha, names),
                              lambda k: mix(alpha, model.block_keys[k]))
        try:
            return activation_stats(op.ev.loaded, op.ev.loaded.state, split, evaluator=op.ev,
                                    at_size=True)
        finally:
            runner.close()
            release()

    info = ends.info or MatchInfo("none", 0.0, 0.0, None, 0.0)
    return _collapse(ends, info, split, points, stats_at, str(op.device), t0, progress)


def _collapse(ends, info, split: Split, points: int, stats_at, device: str, t0: float,
              progress: Progress | None) -> Collapse:
    """The statistics `stats_at(alpha)` of each of `points` evenly spaced alphas (in memory
    or at size alike), their std ratios to the interpolated endpoints', as a Collapse."""
    import numpy as np

    from rotviz.analysis.activations import KINDS, std_ratio

    alphas = np.linspace(0.0, 1.0, points).tolist()
    stats = []
    for j, alpha in enumerate(alphas):
        stats.append(stats_at(alpha))
        if progress is not None:
            progress(j + 1, len(alphas), f"alpha = {alpha:.3f}")
    sa, sb = stats[0], stats[-1]
    n_layers = len(sa.std["residual"])
    ratio = {k: [[std_ratio(s.std[k][i], sa.std[k][i], sb.std[k][i], a)
                  for a, s in zip(alphas, stats, strict=True)] for i in range(n_layers)]
             for k in KINDS}
    return Collapse(
        alphas=alphas, layers=list(range(n_layers)), ratio=ratio,
        anchor_std=sa.summary(), source_std=sb.summary(), match=info.match,
        data=split.data, split=split.split, n=split.n, tokens=sa.n, device=device,
        seconds=time.perf_counter() - t0 + info.seconds, anchor=ends.anchor_ref,
        source=ends.source_ref, layers_matched=ends.layers,
        distance_before=info.distance_before, distance_after=info.distance_after)


def _at_size(ends, ctx: Context, v: dict) -> Collapse:
    return sized_collapse(ends, ctx.split, v["points"], ctx.device, ctx.progress,
                          v["batch_size"])


def _run(ends, ctx: Context, v: dict) -> Collapse:
    return collapse_on(ends, ctx.split, v["points"], ctx.device, ctx.progress, v["batch_size"])


def _mid(d: dict, kind: str) -> float:
    """The ratio at the alpha nearest 0.5, averaged over layers."""
    j = min(range(len(d["alphas"])), key=lambda i: abs(d["alphas"][i] - 0.5))
    rows = d["ratio"][kind]
    return sum(r[j] for r in rows) / len(rows)


def _summary(c: Collapse, how: str) -> str:
    d = c.to_dict()
    low, kind, layer, alpha = c.lowest
    mids = ", ".join(f"{k} {_mid(d, k):.3f}" for k in c.ratio)
    return (f"collapse [{match_label(c.match, c.layers_matched)}] on {c.device}{how}: std "
            f"ratio at alpha 0.5 (mean over layers) {mids}; lowest {low:.3f} ({kind}, layer "
            f"{layer}, alpha {alpha:.2f}); {len(c.alphas)} points on {c.tokens} tokens of "
            f"{c.n} {c.split} samples in {c.seconds:.2f} s")


def _rows(d: dict) -> list[dict]:
    return [{"kind": k, "layer": layer, "alpha": a, "ratio": r}
            for k, rows in d["ratio"].items()
            for layer, row in zip(d["layers"], rows, strict=True)
            for a, r in zip(d["alphas"], row, strict=True)]


def collapse_heatmaps(d: dict, font_size: int = 14):
    """One heat map per kind of unit (layer against alpha) on one shared colour scale,
    centred on 1 (no collapse): below 1 the interpolated model's activations shrank."""
    from plotly.subplots import make_subplots

    from rotviz.plots import style

    kinds = list(d["ratio"])
    values = [r for k in kinds for row in d["ratio"][k] for r in row if r == r]
    lo, hi = min(values + [1.0]), max(values + [1.0])
    span = max(1.0 - lo, hi - 1.0, 1e-6)
    fig = make_subplots(rows=1, cols=len(kinds), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[SHORT.get(k, k) for k in kinds])
    for c, k in enumerate(kinds, start=1):
        fig.add_heatmap(
            x=d["alphas"], y=d["layers"], z=d["ratio"][k], coloraxis="coloraxis",
            hovertemplate="α=%{x:.2f}, layer %{y}: ratio %{z:.3f}<extra>" + k + "</extra>",
            row=1, col=c)
        fig.update_xaxes(title_text="α (0 = anchor, 1 = B')", row=1, col=c)
    fig.update_layout(coloraxis={"colorscale": style.DIVERGING, "cmin": 1.0 - span,
                                 "cmax": 1.0 + span,
                                 "colorbar": {"title": {"text": COLOUR_BAR, "side": "right"}}})
    title = f"Variance collapse on the path [{d['match']}], {style.evaluated_on(d)}"
    style.finish(fig, title, "α (0 = anchor, 1 = B')", "layer (block index)",
                 font_size=font_size, legend=False, height=460)
    fig.update_layout(width=1100, margin={"t": 90})
    fig.update_yaxes(title_text="layer (block index)", row=1, col=1, dtick=1)
    return fig


def _plot(d: dict, look: Style):
    return collapse_heatmaps(d, look.font_size)


def _caption(d: dict) -> str:
    mids = ", ".join(f"{KIND_LABELS[k]} {_mid(d, k):.3f}" for k in d["ratio"])
    return (f"Std ratio at α = 0.5, mean over layers: {mids}. 1 means the midpoint model's "
            "activations spread as much as the endpoints' interpolated; below 1 they "
            "collapsed (REPAIR resets them: `--repair` on barrier and merge).")


SECTION = Section(
    "function", 30, title="Variance collapse",
    intro="Interpolate the anchor and the matched source and measure each unit's spread: "
          "the interpolated model's activation standard deviation over the interpolation "
          "of the endpoints'. Jordan et al. (ICLR 2023) found it falls far below 1 in the "
          "middle of the path of ReLU networks, layer after layer, and that resetting it "
          "(REPAIR) removes much of the barrier.",
    caption=_caption, defaults={"points": 5}, busy="Measuring activations",
    doing=lambda v: f"activation statistics at {v['points']} points on the path")

COLLAPSE = register(Measurement(
    "collapse", "Variance collapse",
    "std of the activations along the path over the interpolated endpoints' (per block)",
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows, at_size=_at_size,
    at_size_help="matched at size, each model of the path run block by block (each block's "
                 "tensors interpolated as it starts), its activations measured by the same "
                 "hooks",
    at_size_how=" (at size: each point run block by block)",
    section=SECTION, order=75))

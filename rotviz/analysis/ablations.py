"""Ablations: what each symmetry contributes (the seed paper's Figures 3-5) and which layers
matter (its Figure 6).

- `ablation`: for each matching SPEC (none, ffn, attn, ffn+attn, seed by default), the
  distance to the anchor (total, per layer, per module kind) and the interpolation curve with
  its barrier, loss range and midpoint accuracy.
- `layer_sweeps`: matching one layer at a time, and the last k layers for k = 1..L; for each,
  the distance and the loss and accuracy of the midpoint (the simple average of the two
  models, i.e. the merged model) plus the barrier over a short path.
The data is moved to the device once and every curve runs on the anchor's one module.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from rotviz.analysis.landscape import curve_on
from rotviz.data.split import Split
from rotviz.evaluation import Evaluator
from rotviz.match.endpoints import match_endpoints
from rotviz.match.options import MatchOptions
from rotviz.match.selection import parse_selection, selection_of
from rotviz.sources.loading import Loaded
from rotviz.symmetry.view import resolve_layout
from rotviz.types import Progress

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
    """ablation(anchor, source, split, specs=ABLATION_SPECS, points=21, device=) -> Ablation"""
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
    return len(resolve_layout(loaded.spec, loaded.state).blocks)

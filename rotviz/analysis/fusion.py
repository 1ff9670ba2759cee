"""The seed paper's Tables 1-2: every merge method with every matching SPEC (`fusion_table`,
`fusion_on`), each cell one merge of the matched endpoints (rotviz.analysis.merges) evaluated.

The merge record and the merge sweep are rotviz.measures.merge and merge_sweep.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from rotviz.analysis.merges import check_base_model, method_params, statistics_of
from rotviz.data.split import Split
from rotviz.evaluation import Evaluator
from rotviz.match.endpoints import HeldEndpoints, as_options, match_endpoints
from rotviz.match.options import MatchOptions
from rotviz.merging import check_models, check_weight
from rotviz.merging import method as method_record
from rotviz.merging.combine import merge_states
from rotviz.sources.loading import Loaded
from rotviz.types import Progress

# what a table's `stats_split` says when none of its methods took statistics (in memory and
# at size alike)
NO_STATISTICS = "none (elementwise methods)"


@dataclass
class FusionTable:
    """Merged accuracy: one row per method, one column per matching SPEC (Tables 1-2 shape)."""

    methods: list[str]
    specs: list[str]
    acc: dict[str, dict[str, float]]  # method -> spec -> accuracy of the merged model
    loss: dict[str, dict[str, float]]
    anchor_acc: float
    source_acc: float
    anchor_loss: float
    source_loss: float
    distance: dict[str, float]  # spec -> distance of the (matched) source to the anchor
    weight: float
    alpha: float
    batches: int
    batch_size: int
    data: str
    split: str
    stats_split: str  # the split statistics were taken on, or NO_STATISTICS
    device: str
    seconds: float
    timing: dict[str, float]  # "match:SPEC", "stats:METHOD", "merge:METHOD" -> seconds
    # method -> spec -> the task's further metrics of the merged model (macro-F1, ...)
    scores: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    anchor_scores: dict[str, float] = field(default_factory=dict)
    source_scores: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_markdown(self) -> str:
        head = "| method | " + " | ".join(f"match {s}" for s in self.specs) + " |"
        rule = "|---|" + "---|" * len(self.specs)
        rows = [f"| {m} | " + " | ".join(f"{self.acc[m][s]:.4f}" for s in self.specs) + " |"
                for m in self.methods]
        return "\n".join([head, rule, *rows])


def fusion_on(
    ends: Mapping[str, HeldEndpoints],
    split: Split,
    stats_data: Split | None = None,
    methods: Sequence[str] | None = None,
    weight: float = 0.5,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    base: Loaded | None = None,
    **params: Any,
) -> FusionTable:
    """fusion_on({label: endpoints}, split, methods=None, weight=0.5, alpha=0.9) -> FusionTable

    Every method (default: every registered one that runs with the base given or not, and
    combines two models) with every matching, one set of endpoints per column. `params` go
    to each method that declares them (batches, batch_size, seed, alpha, density, ...); the
    anchor's statistics are computed once per method, the matched source's once per (method,
    matching). The methods built on task vectors use `base` (never matched)."""
    t0 = time.perf_counter()
    if methods is None:
        from rotviz.merging.registry import table_methods

        methods = table_methods(base is not None)
    records = [method_record(m) for m in methods]
    weight = check_weight(weight)
    values = {m.name: method_params(m, {k: v for k, v in params.items()
                                       if any(p.name == k for p in m.params)})
              for m in records}
    first = next(iter(ends.values()))
    anchor = first.anchor
    for m in records:
        check_models(m, 2)
        check_base_model(m, anchor, base if takes_base(m) else None)
    ev = Evaluator(anchor, split, device)
    stats_name = params.get("stats_split") or "train"
    st_split = stats_data if stats_data is not None else (
        split.sibling(stats_name) if any(m.needs_statistics for m in records) else split)
    total = len(ends) * (1 + len(records))
    step = 0
    timing: dict[str, float] = {}
    scored: dict[str, dict[str, dict[str, float]]] = {}
    acc: dict[str, dict[str, float]] = {m.name: {} for m in records}
    loss: dict[str, dict[str, float]] = {m.name: {} for m in records}
    distance: dict[str, float] = {}
    anchor_stats: dict[str, dict | None] = {}

    def tick(msg: str) -> None:
        nonlocal step
        step += 1
        if progress:
            progress(step, total, msg)

    for label, e in ends.items():
        timing[f"match:{label}"] = e.info.seconds
        distance[label] = e.info.distance_after
        tick(f"matched [{label}]")
        for m in records:
            t = time.perf_counter()
            if m.name not in anchor_stats:
                anchor_stats[m.name] = statistics_of(m, anchor, anchor.state, st_split,
                                                     ev.device, values[m.name])
            sb = statistics_of(m, anchor, e.matched, st_split, ev.device, values[m.name])
            timing[f"stats:{m.name}"] = timing.get(f"stats:{m.name}", 0.0) + \
                time.perf_counter() - t
            t = time.perf_counter()
            merged = merge_states(anchor, m.name, anchor.state, e.matched, weight,
                                  anchor_stats[m.name], sb,
                                  base.state if takes_base(m) and base is not None else None,
                                  **values[m.name])
            timing[f"merge:{m.name}"] = timing.get(f"merge:{m.name}", 0.0) + \
                time.perf_counter() - t
            loss[m.name][label], acc[m.name][label] = ev.evaluate(ev.params(merged))
            scored.setdefault(m.name, {})[label] = ev.scores(ev.params(merged))
            tick(f"{m.name} merge [{label}]")
    a_loss, a_acc = ev.evaluate(ev.params(anchor.state))
    s_loss, s_acc = ev.evaluate(ev.params(first.source.state))
    return FusionTable(
        methods=[m.name for m in records], specs=list(ends), acc=acc, loss=loss,
        anchor_acc=a_acc, source_acc=s_acc, anchor_loss=a_loss, source_loss=s_loss,
        distance=distance, weight=weight, alpha=_given(params, "alpha", 0.9),
        batches=_given(params, "batches", 8), batch_size=_given(params, "batch_size", 32),
        data=split.data, split=split.split,
        stats_split=st_split.split if any(m.needs_statistics for m in records) else NO_STATISTICS,
        device=str(ev.device),
        seconds=time.perf_counter() - t0, timing=timing, scores=scored,
        anchor_scores=ev.scores(ev.params(anchor.state)),
        source_scores=ev.scores(ev.params(first.source.state)),
    )


def takes_base(m) -> bool:
    """A base given goes to the methods that need one and to those that merge about one where
    it is given (nuslerp, multislerp: `base_optional`); the others combine the models."""
    return m.needs_base or m.base_optional


def _given(params: Mapping[str, Any], name: str, default: Any) -> Any:
    value = params.get(name)
    return default if value is None else value


def fusion_table(
    anchor: Loaded,
    source: Loaded,
    split: Split,
    stats_split: Split | str | None = None,
    methods: Sequence[str] | None = None,
    specs: Sequence[str | MatchOptions | None] = ("none", "seed"),
    weight: float = 0.5,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    base: Loaded | None = None,
    **params: Any,
) -> FusionTable:
    """fusion_table(anchor, source, split, stats_split=None, methods=, specs=) -> FusionTable

    Match once per SPEC, then `fusion_on` the endpoints: the paper's Tables 1-2 shape."""
    ends: dict[str, HeldEndpoints] = {}
    for spec in specs:
        e = match_endpoints(anchor, source, as_options(spec), device, data=split)
        ends[e.match] = e
    if isinstance(stats_split, str):  # a split's name, as the methods' parameter takes it
        params, stats_split = {**params, "stats_split": stats_split}, None
    return fusion_on(ends, split, stats_split, methods, weight, device, progress, base,
                     **params)

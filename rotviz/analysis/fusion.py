"""Merging after matching: one merged model (`merge_on`, `merge`) and the paper's Tables 1-2
(`fusion_table`: every method with every matching SPEC).

The methods themselves are registered records (rotviz.merging: simple, Fisher, RegMean, task
arithmetic, TIES, DARE, SLERP, Model Stock, and whatever a plug-in registers). A method built
on task vectors takes a base model (`base`), which is never matched: alignment moves the
source only, so the base must share the anchor's basis (the anchor's lineage: the model both
were fine-tuned from); models from different inits are matched first and merged without a
base. Statistics (Fisher, Gram matrices) are always computed on the
models as matched: the source's live in the basis of its own neurons and heads, so statistics
taken before matching are in the wrong basis afterwards (a bug in public code).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from rotviz.data.split import Split
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.match.endpoints import HeldEndpoints, as_options, match_endpoints
from rotviz.match.options import MatchOptions
from rotviz.merging import MergeMethod, check_base, check_models, check_weight, users
from rotviz.merging import method as method_record
from rotviz.merging.combine import merge_states
from rotviz.merging.registry import sweepable
from rotviz.params import needs, read_params
from rotviz.sources.loading import Loaded
from rotviz.sources.pairs import check_compatible
from rotviz.types import Progress

Tensor = torch.Tensor


# ---- merging -----------------------------------------------------------------------------------


@dataclass
class Merged:
    """A merged model: its accuracy on the evaluation split, and how it was made."""

    method: str
    match: str
    weight: float  # of the source; 0 = anchor, 1 = source
    loss: float
    acc: float
    anchor_loss: float
    anchor_acc: float
    source_loss: float
    source_acc: float
    data: str
    split: str  # evaluation split
    stats_split: str | None  # split the Fisher / Gram statistics came from (None: simple)
    batches: int
    batch_size: int
    alpha: float | None  # RegMean off-diagonal scale
    device: str
    n: int
    seconds: float
    match_seconds: float
    stats_seconds: float
    distance_before: float
    distance_after: float
    anchor: str = ""
    source: str = ""
    layers: list[int] | None = None  # layers matched (None: all)
    base: str = ""  # the base model the task vectors are taken from ("" without)
    # the task's further metrics (rotviz.data.tasks: macro-F1, entity F1, ...; none for LMs)
    scores: dict[str, float] = field(default_factory=dict)
    anchor_scores: dict[str, float] = field(default_factory=dict)
    source_scores: dict[str, float] = field(default_factory=dict)
    state: dict[str, Tensor] = field(default_factory=dict, repr=False)
    anchor_stats: dict[str, Tensor] | None = field(default=None, repr=False)
    source_stats: dict[str, Tensor] | None = field(default=None, repr=False)

    # values of the method's own parameters beyond those above (a registered method's)
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        skip = {"state", "anchor_stats", "source_stats"} | (set() if self.params else {"params"})
        return {k: v for k, v in asdict(self).items() if k not in skip}


def method_params(m: MergeMethod, given: Mapping[str, Any]) -> dict[str, Any]:
    """The method's parameter values: `given` (checked) over its defaults; a parameter the
    method does not declare is a one-line error naming the methods that do."""
    declared = {p.name for p in m.params}
    for name, value in given.items():
        if value is not None and name not in declared:
            who = users(name)
            flag = "--" + name.replace("_", "-")
            if not who:
                raise RotvizError(f"no merge method takes {flag}; drop it")
            needs(flag, True, f"--method {' or '.join(who)}", False)
    return read_params(m.params, {k: v for k, v in given.items() if k in declared},
                       f"--method {m.name}")


def check_base_model(m: MergeMethod, anchor: Loaded, base: Loaded | None) -> None:
    """The method takes a base (or none), and a base shares the anchor's architecture and
    shapes (one line otherwise)."""
    check_base(m, base is not None)
    if base is None:
        return
    try:
        check_compatible(anchor, base)
    except RotvizError as e:
        raise RotvizError(f"--base '{base.ref}' does not fit the anchor '{anchor.ref}': "
                          f"{e}") from None


def statistics_of(m: MergeMethod, loaded: Loaded, state: Mapping[str, Tensor], split: Split,
                  device, values: Mapping[str, Any],
                  progress: Progress | None = None) -> dict[str, Tensor] | None:
    """The statistics method `m` needs of parameter set `state` (None when it needs none)."""
    if m.statistics is None:
        return None
    return m.statistics(loaded, state, split, device, progress=progress, **values)


def pair_statistics(m: MergeMethod, ends: HeldEndpoints, split: Split, device,
                    values: Mapping[str, Any], stats_data: Split | None = None,
                    progress: Progress | None = None) -> tuple[Split | None, Any, Any]:
    """(the statistics split, the anchor's statistics, the matched source's) that method `m`
    needs, taken on `stats_data` or the split its `stats_split` parameter names (default
    train) of the evaluation data; (None, None, None) for a method that needs none."""
    if not m.needs_statistics:
        return None, None, None
    st = stats_data if stats_data is not None else \
        split.sibling(values.get("stats_split", "train"))
    sa = statistics_of(m, ends.anchor, ends.anchor.state, st, device, values,
                       _stage(progress, "anchor"))
    sb = statistics_of(m, ends.anchor, ends.matched, st, device, values,
                       _stage(progress, "source"))
    return st, sa, sb


def merge_on(
    ends: HeldEndpoints,
    method_name: str,
    split: Split,
    weight: float = 0.5,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    stats_data: Split | None = None,
    base: Loaded | None = None,
    **params: Any,
) -> Merged:
    """merge_on(endpoints, "regmean", split, weight=0.5, device=, alpha=0.9) -> Merged

    Merge the matched source into the anchor with a registered method and its `params`
    (rotviz.merging; those not given keep their defaults) and evaluate the merged model on
    `split`. Statistics come from `stats_data` (default: the split named by the method's
    `stats_split` parameter, train, of the same data), computed on the matched source. A
    method built on task vectors takes `base`, the model both were fine-tuned from (never
    matched). `Merged.state` holds the merged weights."""
    m = method_record(method_name)
    weight = check_weight(weight)
    values = method_params(m, params)
    check_base_model(m, ends.anchor, base)
    t0 = time.perf_counter()
    anchor, info = ends.anchor, ends.info
    ev = Evaluator(anchor, split, device)
    t1 = time.perf_counter()
    st_split, sa, sb = pair_statistics(m, ends, split, ev.device, values, stats_data, progress)
    stats_s = time.perf_counter() - t1
    merged = merge_states(anchor, m.name, anchor.state, ends.matched, weight, sa, sb,
                          None if base is None else base.state, **values)
    loss, acc = ev.evaluate(ev.params(merged))
    a_loss, a_acc = ev.evaluate(ev.params(anchor.state))
    s_loss, s_acc = ev.evaluate(ev.params(ends.matched))
    return Merged(
        method=m.name, match=info.match, weight=weight, loss=loss, acc=acc,
        anchor_loss=a_loss, anchor_acc=a_acc, source_loss=s_loss, source_acc=s_acc,
        data=split.data, split=split.split,
        stats_split=None if st_split is None else st_split.split,
        batches=values.get("batches", 8), batch_size=values.get("batch_size", 32),
        alpha=values.get("alpha"), device=str(ev.device), n=split.n,
        seconds=time.perf_counter() - t0 + info.seconds, match_seconds=info.seconds,
        stats_seconds=stats_s, distance_before=info.distance_before,
        distance_after=info.distance_after, anchor=anchor.ref, source=ends.source_ref,
        layers=ends.layers, base="" if base is None else base.ref, state=merged,
        anchor_stats=sa, source_stats=sb,
        scores=ev.scores(ev.params(merged)), anchor_scores=ev.scores(ev.params(anchor.state)),
        source_scores=ev.scores(ev.params(ends.matched)),
        params={k: v for k, v in values.items() if k in m.extra},
    )


def merge(
    anchor: Loaded,
    source: Loaded,
    method: str,
    options: MatchOptions | str | None,
    split: Split,
    stats_split: Split | str | None = None,
    weight: float = 0.5,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    base: Loaded | None = None,
    **params: Any,
) -> Merged:
    """merge(anchor, source, method, options, split, stats_split=None, weight=0.5, ...) -> Merged

    Match the source onto the anchor with `options` (MatchOptions, SPEC or None), then
    `merge_on` the endpoints with `method` (simple, fisher, regmean, ties, ... or a registered
    one), its parameters (`batches`, `alpha`, `density`, ...) and, for a method built on task
    vectors, the `base` (not matched: it must share the anchor's basis)."""
    m = method_record(method)
    weight = check_weight(weight)
    method_params(m, params)  # a bad parameter is refused before matching
    check_base_model(m, anchor, base)
    ends = match_endpoints(anchor, source, options, device, data=split)
    if isinstance(stats_split, str):  # a split's name, as the method's parameter takes it
        params, stats_split = {**params, "stats_split": stats_split}, None
    return merge_on(ends, m.name, split, weight, device, progress, stats_split, base, **params)


def default_stats_split(split: Split) -> Split:
    """The train split of the evaluation data (statistics never come from the test split)."""
    return split.sibling("train")


def _stage(progress: Progress | None, what: str) -> Progress | None:
    if progress is None:
        return None
    return lambda d, t, m: progress(d, t, f"{m} of the {what}")


# ---- the paper's Tables 1-2 -------------------------------------------------------------------


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
    stats_split: str
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
        methods = default_methods(base is not None)
    records = [method_record(m) for m in methods]
    weight = check_weight(weight)
    values = {m.name: method_params(m, {k: v for k, v in params.items()
                                       if any(p.name == k for p in m.params)})
              for m in records}
    first = next(iter(ends.values()))
    anchor = first.anchor
    for m in records:
        check_models(m, 2)
        check_base_model(m, anchor, base if m.needs_base else None)
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
                                  base.state if m.needs_base and base is not None else None,
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
        data=split.data, split=split.split, stats_split=st_split.split, device=str(ev.device),
        seconds=time.perf_counter() - t0, timing=timing, scores=scored,
        anchor_scores=ev.scores(ev.params(anchor.state)),
        source_scores=ev.scores(ev.params(first.source.state)),
    )


def default_methods(has_base: bool) -> list[str]:
    """The registered methods a table runs by default: every one, less those that need a
    base when none is given."""
    from rotviz.merging import methods as all_methods

    return [m.name for m in all_methods() if has_base or not m.needs_base]


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


# ---- one parameter swept ---------------------------------------------------------------------


@dataclass
class MergeSweep:
    """Merged loss and accuracy as one number of a merge is turned (the weight of the source,
    or a method's own parameter: lambda, density, RegMean's alpha), every other one held."""

    method: str
    param: str  # "weight" or the method's parameter name
    values: list[float]
    loss: list[float]
    acc: list[float]
    match: str
    weight: float  # the source's weight where it is not the swept number
    anchor_loss: float
    anchor_acc: float
    source_loss: float
    source_acc: float
    data: str
    split: str
    n: int
    device: str
    seconds: float
    anchor: str = ""
    source: str = ""
    base: str = ""
    params: dict[str, Any] = field(default_factory=dict)  # the held values of the others

    @property
    def best(self) -> int:
        """Index of the value with the highest merged accuracy (the first of equals)."""
        return max(range(len(self.acc)), key=lambda i: (self.acc[i], -i))

    def to_dict(self) -> dict:
        return asdict(self)


def sweep_on(
    ends: HeldEndpoints,
    method_name: str,
    param: str,
    values: Sequence[float],
    split: Split,
    weight: float = 0.5,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    stats_data: Split | None = None,
    base: Loaded | None = None,
    **params: Any,
) -> MergeSweep:
    """sweep_on(endpoints, "ties", "density", [0.1, 0.3, 1.0], split, base=base) -> MergeSweep

    Merge the matched source into the anchor at each value of `param` (the source's
    `weight`, or one of the method's own real parameters: `sweepable`) and evaluate each
    merged model on `split`. Statistics, when the method needs them, are taken once. The
    values are checked against the parameter's bound before anything is computed."""
    m = method_record(method_name)
    choices = sweepable(m)
    if param not in choices:
        raise RotvizError(f"--param {param} is not a number --method {m.name} can sweep; use "
                          f"one of {', '.join(choices)}")
    if not values:
        raise RotvizError("a sweep needs at least one value")
    bound = next((p.bound for p in m.params if p.name == param), None)
    checked = [check_weight(v) if param == "weight" else bound.check(v) for v in values]
    weight = check_weight(weight)
    held = method_params(m, {k: v for k, v in params.items() if k != param})
    check_base_model(m, ends.anchor, base)
    t0 = time.perf_counter()
    anchor = ends.anchor
    ev = Evaluator(anchor, split, device)
    _, sa, sb = pair_statistics(m, ends, split, ev.device, held, stats_data, progress)
    base_state = None if base is None else base.state

    def merged_at(v: float) -> dict[str, Tensor]:
        w, own = (v, held) if param == "weight" else (weight, {**held, param: v})
        return ev.params(merge_states(anchor, m.name, anchor.state, ends.matched, w, sa, sb,
                                      base_state, **own))

    def done(k: int) -> None:
        if progress:
            progress(k, len(checked), f"{param} = {checked[k - 1]:g}")

    found = ev.evaluate_each(merged_at, checked, done)
    a_loss, a_acc = ev.evaluate(ev.params(anchor.state))
    s_loss, s_acc = ev.evaluate(ev.params(ends.matched))
    return MergeSweep(
        method=m.name, param=param, values=[float(v) for v in checked],
        loss=[f[0] for f in found], acc=[f[1] for f in found], match=ends.info.match,
        weight=weight, anchor_loss=a_loss, anchor_acc=a_acc, source_loss=s_loss,
        source_acc=s_acc, data=split.data, split=split.split, n=split.n, device=str(ev.device),
        seconds=time.perf_counter() - t0 + ends.info.seconds, anchor=anchor.ref,
        source=ends.source_ref, base="" if base is None else base.ref,
        params={k: v for k, v in held.items() if k in m.extra and k != param},
    )

"""One merge of matched endpoints, evaluated: the merged model (`merge_on`) and the checks
every merge of a pair makes (a method's own parameters, its base, its statistics).

The methods themselves are registered records (rotviz.merging). A method built on task
vectors takes a base model (`base`), which is never matched: alignment moves the source
only, so the base must share the anchor's basis (the anchor's lineage: the model both were
fine-tuned from); models from different inits are matched first and merged without a base.
Statistics (Fisher, Gram matrices) are always computed on the models as matched: the
source's live in the basis of its own neurons and heads, so statistics taken before matching
are in the wrong basis afterwards (a bug in public code). The merge record, the merge sweep,
the fusion table, the slice around a merge and the at-size merge all build on this.
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
from rotviz.match.endpoints import HeldEndpoints, unmeasured
from rotviz.merging import MergeMethod, check_base, check_weight, users
from rotviz.merging import method as method_record
from rotviz.merging.combine import build_pair, merge_states
from rotviz.params import needs, read_params
from rotviz.sources.loading import Loaded
from rotviz.sources.pairs import check_compatible
from rotviz.sources.stacking import at_block, block_of, model_of
from rotviz.types import Progress

Tensor = torch.Tensor


@dataclass
class Merged:
    """A merged model: its accuracy on the evaluation split, and how it was made."""

    method: str
    match: str
    weight: float  # of the source; 0 = anchor, 1 = source
    # the merged model's and the endpoints' loss and accuracy; None: not evaluated (a merge
    # only written, `evaluate=False`)
    loss: float | None
    acc: float | None
    anchor_loss: float | None
    anchor_acc: float | None
    source_loss: float | None
    source_acc: float | None
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
    distance_before: float | None  # None: a pair not matched, merged only to be written
    distance_after: float | None
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
    # A method that builds the model from whole blocks (passthrough): its depth, where each
    # block came from and whether it equals that block bit for bit (`block_check`), and its
    # config where the architecture differs from the anchor's (written with the model)
    depth: int | None = None
    block_checks: list[dict] | None = None
    config: dict | None = field(default=None, repr=False)
    # a pair of different depths: how it was brought to one (rotviz.analysis.depths) and the
    # shallower and deeper models' loss and accuracy as they were; None: one depth
    depths: dict[str, Any] | None = None

    def to_dict(self) -> dict:
        skip = {"state", "anchor_stats", "source_stats", "config"} | \
            (set() if self.params else {"params"}) | \
            (set() if self.block_checks is not None else {"block_checks", "depth"}) | \
            (set() if self.depths is not None else {"depths"})
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
    values = read_params(m.params, {k: v for k, v in given.items() if k in declared},
                         f"--method {m.name}")
    if m.check is not None:
        m.check(values)
    return values


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
    evaluate: bool = True,
    **params: Any,
) -> Merged:
    """merge_on(endpoints, "regmean", split, weight=0.5, device=, alpha=0.9) -> Merged

    Merge the matched source into the anchor with a registered method and its `params`
    (rotviz.merging; those not given keep their defaults) and evaluate the merged model on
    `split`. Statistics come from `stats_data` (default: the split named by the method's
    `stats_split` parameter, train, of the same data), computed on the matched source. A
    method built on task vectors takes `base`, the model both were fine-tuned from (never
    matched). `Merged.state` holds the merged weights. `evaluate=False` only merges (the
    losses and scores are then None and empty: the work mergekit does, for a merge that is
    to be written; a merge that is not one model, ZipIt!'s partial zip, is refused)."""
    m = method_record(method_name)
    weight = check_weight(weight)
    values = method_params(m, params)
    check_base_model(m, ends.anchor, base)
    t0 = time.perf_counter()
    anchor, info = ends.anchor, ends.info if evaluate else unmeasured(ends.info)
    ev = Evaluator(anchor, split, device)
    t1 = time.perf_counter()
    st_split, sa, sb = pair_statistics(m, ends, split, ev.device, values, stats_data, progress)
    stats_s = time.perf_counter() - t1
    built = None
    own = None if m.evaluate is None or not evaluate else m.evaluate(
        anchor, (anchor.state, ends.matched), (sa, sb), (1.0 - weight, weight), values, ev)
    loss = acc = a_loss = a_acc = s_loss = s_acc = None
    scores: dict[str, float] = {}
    a_scores: dict[str, float] = {}
    s_scores: dict[str, float] = {}
    if own is not None:  # no single parameter set (ZipIt!'s partial zip): the method evaluated it
        merged, (loss, acc) = {}, own
    else:
        if m.assemble is not None:
            built = build_pair(anchor, m.name, anchor.state, ends.matched, **values)
            model = model_of(anchor, built.state, f"{anchor.ref} (built)", built.config)
            merged, mev = model.state, Evaluator(model, split, device)
        else:
            merged = merge_states(anchor, m.name, anchor.state, ends.matched, weight, sa, sb,
                                  None if base is None else base.state, **values)
            mev = ev
        if evaluate:
            loss, acc = mev.evaluate(mev.params(merged))
            scores = mev.scores(mev.params(merged))
    if evaluate:
        a_loss, a_acc = ev.evaluate(ev.params(anchor.state))
        s_loss, s_acc = ev.evaluate(ev.params(ends.matched))
        a_scores = ev.scores(ev.params(anchor.state))
        s_scores = ev.scores(ev.params(ends.matched))
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
        scores=scores, anchor_scores=a_scores, source_scores=s_scores,
        params={k: v for k, v in values.items() if k in m.extra},
        depth=None if built is None else len(built.blocks),
        block_checks=None if built is None else block_check(
            anchor.spec, merged, [anchor.state, ends.matched], built.blocks),
        config=None if built is None else built.config,
    )


def block_check(spec, built: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]],
                blocks: Sequence[tuple[int, int]]) -> list[dict]:
    """The function check of a stacked model: each of its blocks against the block it was
    copied from, tensor by tensor (`torch.equal`: bit for bit), as the built module holds
    them. A block whose every tensor is equal computes what its source block computed on
    the same input (the stream it reads is then the question of matching, not of copying)."""
    from rotviz.merging.slices import MODEL_WORDS

    rows = []
    for j, (model, index) in enumerate(blocks):
        names = [k for k in states[model]
                 if (b := block_of(spec, k)) is not None and b[1] == index]
        worst: float | None = 0.0  # None: a tensor missing or of another shape
        equal = bool(names)
        for k in names:
            mine = built.get(at_block(spec, k, j))
            theirs = states[model][k]
            if mine is None or mine.shape != theirs.shape:
                equal, worst = False, None
                continue
            same = torch.equal(mine.to(theirs.dtype), theirs)
            equal = equal and same
            if not same and worst is not None:
                worst = max(worst, (mine.double() - theirs.double()).abs().max().item())
        rows.append({"block": j, "model": MODEL_WORDS[model], "from": index,
                     "tensors": len(names), "equal": equal, "max_diff": worst})
    return rows


def default_stats_split(split: Split) -> Split:
    """The train split of the evaluation data (statistics never come from the test split)."""
    return split.sibling("train")


def _stage(progress: Progress | None, what: str) -> Progress | None:
    if progress is None:
        return None
    return lambda d, t, m: progress(d, t, f"{m} of the {what}")

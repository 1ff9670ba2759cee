"""Merging N >= 2 parameter sets of one architecture with a registered method
(rotviz.merging.registry), optionally about a base model.

Integer tensors are copied from the anchor (the first model); every floating tensor goes to
the method (its `rows` or its `combine`), and where that declines (None) to the simple
weighted average. Tied aliases (lm_head = wte) get their owner's merged tensor, so they stay
one tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rotviz.errors import RotvizError
from rotviz.merging.registry import (
    Built,
    MergeJob,
    MergeMethod,
    check_base,
    check_models,
    check_weight,
    method,
)
from rotviz.merging.simple import simple_average

if TYPE_CHECKING:  # torch and the model loader are imported when a merge runs, not when the
    # registry discovers this module
    import torch

    from rotviz.sources.loading import Loaded

    Tensor = torch.Tensor


def check_weights(weights: Sequence[float], n: int) -> tuple[float, ...]:
    """One finite weight >= 0 per model, not all zero (one line otherwise)."""
    ws = tuple(float(w) for w in weights)
    if len(ws) != n:
        raise RotvizError(f"give one weight per model: {n} models, {len(ws)} weights")
    if not all(w >= 0.0 and w == w and w != float("inf") for w in ws) or sum(ws) <= 0.0:
        raise RotvizError(f"merge weights must be finite, >= 0 and not all 0, got {list(ws)}")
    return ws


def merge_job(loaded: Loaded, m: MergeMethod, weights: Sequence[float],
              stats: Sequence[Mapping[str, Tensor]] | None, params: Mapping[str, Any]
              ) -> MergeJob:
    """The job a method's `combine` sees: its parameter values (defaults for those not
    given) and what its `prepare` makes of the architecture."""
    values = {p.name: params.get(p.name, p.default) for p in m.params}
    return MergeJob(loaded, tuple(weights), None if stats is None else tuple(stats), values,
                    m.prepare(loaded) if m.prepare else None)


def combine_one(m: MergeMethod, job: MergeJob, name: str, tensors: Sequence[Tensor],
                base: Tensor | None) -> Tensor:
    """One merged tensor: integer tensors are the anchor's, a declined one the simple average."""
    if not tensors[0].is_floating_point():
        return tensors[0].clone()
    merged = m.merge(job, name, tensors, base)
    return simple_average(tensors, job.weights) if merged is None else merged


def merge_many(loaded: Loaded, name: str, states: Sequence[Mapping[str, Tensor]],
               weights: Sequence[float] | None = None,
               base_state: Mapping[str, Tensor] | None = None,
               stats: Sequence[Mapping[str, Tensor]] | None = None,
               **params: Any) -> dict[str, Tensor]:
    """merge_many(loaded, "ties", [anchor, source, ...], weights, base_state, density=0.5)

    Merge N >= 2 parameter sets of `loaded`'s architecture (the anchor first) with method
    `name` and its `params` (missing ones take their defaults), with one weight per model
    (default equal), about `base_state` for a method that needs a base, and with one
    statistics map per model for a method that needs statistics; returns a new state dict.
    No input is modified."""
    m = method(name)
    check_models(m, len(states))
    ws = check_weights([1.0 / len(states)] * len(states) if weights is None else weights,
                       len(states))
    check_base(m, base_state is not None)
    if m.needs_statistics and (stats is None or len(stats) != len(states)
                               or any(s is None for s in stats)):
        raise RotvizError(f"{m.name} merging needs statistics of every model")
    if m.whole is not None:  # the method merges whole models (its zips span the layers)
        values = {p.name: params.get(p.name, p.default) for p in m.params}
        out = m.whole(loaded, states, stats, ws, values)
        _retie(loaded, out)
        return out
    job = merge_job(loaded, m, ws, stats if m.needs_statistics else None, params)
    if m.assemble is not None:
        built = assemble(loaded, m, job, states)
        if built.config is not None:
            raise RotvizError(f"--method {m.name} with these settings builds a model of "
                              f"another architecture ({len(built.blocks)} blocks) than the "
                              "anchor's; only `rotviz merge` evaluates and writes it")
        return built.state
    out: dict[str, Tensor] = {}
    for k, a in states[0].items():
        ts = [a, *(s[k] for s in states[1:])]
        out[k] = combine_one(m, job, k, ts, None if base_state is None else base_state[k])
    _retie(loaded, out)
    return out


def assemble(loaded: Loaded, m: MergeMethod, job: MergeJob,
             states: Sequence[Mapping[str, Tensor]]) -> Built:
    """The model method `m` (one with `assemble`) builds from whole blocks of `states`, tied
    aliases given their owner's tensor."""
    assert m.assemble is not None
    built = m.assemble(job, states)
    _retie(loaded, built.state)
    return built


def build_pair(loaded: Loaded, name: str, anchor_state: Mapping[str, Tensor],
               source_state: Mapping[str, Tensor], **params: Any) -> Built:
    """The model an `assemble` method (passthrough) builds of the anchor and the source,
    with its config where the architecture changes (another depth)."""
    m = method(name)
    job = merge_job(loaded, m, (0.5, 0.5), None, params)
    return assemble(loaded, m, job, [anchor_state, source_state])


def merge_states(loaded: Loaded, name: str, anchor_state: Mapping[str, Tensor],
                 source_state: Mapping[str, Tensor], weight: float = 0.5,
                 anchor_stats: Mapping[str, Tensor] | None = None,
                 source_stats: Mapping[str, Tensor] | None = None,
                 base_state: Mapping[str, Tensor] | None = None,
                 **params: Any) -> dict[str, Tensor]:
    """Merge two parameter sets of `loaded`'s architecture with method `name` and its
    `params`, the source weighted `weight` (the anchor 1 - weight): `merge_many` of the pair."""
    weight = check_weight(weight)
    m = method(name)
    if m.needs_statistics and (anchor_stats is None or source_stats is None):
        raise RotvizError(f"{m.name} merging needs statistics of both models")
    stats = [anchor_stats, source_stats] if m.needs_statistics else None
    return merge_many(loaded, name, [anchor_state, source_state], (1.0 - weight, weight),
                      base_state, stats, **params)


def _retie(loaded: Loaded, state: dict[str, Tensor]) -> None:
    """Tied aliases (lm_head = wte) get the owner's merged tensor, so they stay one tensor."""
    by_id: dict[int, str] = {}
    for name, p in loaded.model.named_parameters(remove_duplicate=False):
        if id(p) in by_id:
            if name in state and by_id[id(p)] in state:
                state[name] = state[by_id[id(p)]]
        else:
            by_id[id(p)] = name

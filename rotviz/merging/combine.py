"""Merging two parameter sets with a registered method (rotviz.merging.registry).

Integer tensors are copied from the anchor; every floating tensor goes to the method's
`combine`, and where that declines (None) to the simple average. Tied aliases (lm_head = wte)
get their owner's merged tensor, so they stay one tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rotviz.errors import RotvizError
from rotviz.merging.registry import MergeJob, check_weight, method
from rotviz.merging.simple import simple_average
from rotviz.models import Loaded

Tensor = torch.Tensor


def merge_states(loaded: Loaded, name: str, anchor_state: Mapping[str, Tensor],
                 source_state: Mapping[str, Tensor], weight: float = 0.5,
                 anchor_stats: Mapping[str, Tensor] | None = None,
                 source_stats: Mapping[str, Tensor] | None = None,
                 **params: Any) -> dict[str, Tensor]:
    """Merge two parameter sets of `loaded`'s architecture with method `name` and its
    `params` (missing ones take their defaults); returns a new full state dict."""
    m = method(name)
    weight = check_weight(weight)
    if m.needs_statistics and (anchor_stats is None or source_stats is None):
        raise RotvizError(f"{m.name} merging needs statistics of both models")
    values = {p.name: params.get(p.name, p.default) for p in m.params}
    job = MergeJob(loaded, (1.0 - weight, weight), anchor_stats, source_stats, values,
                   m.prepare(loaded) if m.prepare else None)
    out: dict[str, Tensor] = {}
    for k, a in anchor_state.items():
        b = source_state[k]
        if not a.is_floating_point():
            out[k] = a.clone()
            continue
        merged = m.combine(job, k, a, b)
        out[k] = simple_average([a, b], job.weights) if merged is None else merged
    _retie(loaded, out)
    return out


def _retie(loaded: Loaded, state: dict[str, Tensor]) -> None:
    """Tied aliases (lm_head = wte) get the owner's merged tensor, so they stay one tensor."""
    by_id: dict[int, str] = {}
    for name, p in loaded.model.named_parameters(remove_duplicate=False):
        if id(p) in by_id:
            if name in state and by_id[id(p)] in state:
                state[name] = state[by_id[id(p)]]
        else:
            by_id[id(p)] = name



"""mergekit 0.1.5's own merge of one tensor group (its registered method's `merge_group`),
the reference the definition tests of the task-vector methods compare rotviz with."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def mergekit_merge(method: str, tensors: Sequence[torch.Tensor], base: torch.Tensor,
                   weights: Sequence[float], **given) -> torch.Tensor:
    """mergekit's `method` of `tensors` about `base`: `given` sets its parameters by
    mergekit's names (per-model ones as one value for every model), the rest its defaults."""
    from mergekit.merge_methods.base import ParameterScope, TensorGroup
    from mergekit.merge_methods.registry import get

    m = get(method)
    group = TensorGroup.from_tensors([base, *tensors], base_index=0)
    ids = range(1, len(tensors) + 1)
    params: dict = {}
    for spec in m.spec.parameters:
        value = given.get(spec.name, spec.default)
        if spec.scope == ParameterScope.SHARED:
            params[spec.name] = value
        elif spec.name == "weight":
            params[spec.name] = dict(zip(ids, weights, strict=True))
        else:
            params[spec.name] = dict.fromkeys(ids, value)
    return m.merge_group(group, **params)

"""The simple average: theta = sum_i w_i theta_i, tensor by tensor ((1 - w) theta_anchor +
w theta_source for a pair; the weights are normalised to sum to 1).

The weighted mean is taken in float64 and cast back to the tensor's dtype, so a half
checkpoint merges without float16 rounding in the sum. It needs no statistics, so it is the
method that runs at size (block by block, rotviz.stream).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import Mergekit, MergeMethod, register

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob

    Tensor = torch.Tensor


def simple_average(tensors: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    """sum_i w_i t_i / sum_i w_i, in float64, cast back to the first tensor's dtype."""
    total = sum(float(w) for w in weights)
    scale = 1.0 if total == 1.0 else 1.0 / total
    out = sum(float(w) * scale * t.double() for w, t in zip(weights, tensors, strict=True))
    return out.to(tensors[0].dtype)


def _combine(job: MergeJob, name: str, tensors: Sequence[Tensor], base: Tensor | None) -> Tensor:
    return simple_average(tensors, job.weights)


SIMPLE = register(MergeMethod(
    "simple", "simple average",
    "the weighted average (1 - w) anchor + w source of every tensor",
    _combine, at_size=True, mergekit=Mergekit("linear", fixed={"normalize": True})))

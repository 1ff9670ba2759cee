"""The simple average: theta = (1 - w) theta_anchor + w theta_source, tensor by tensor.

The weighted mean is taken in float64 and cast back to the tensor's dtype, so a half
checkpoint merges without float16 rounding in the sum. It needs no statistics, so it is the
method that runs at size (block by block, rotviz.stream).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import MergeMethod, register

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob

    Tensor = torch.Tensor


def simple_average(tensors: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    out = sum(float(w) * t.double() for w, t in zip(weights, tensors, strict=True))
    return out.to(tensors[0].dtype)




def _combine(job: MergeJob, name: str, a: Tensor, b: Tensor) -> Tensor:
    return simple_average([a, b], job.weights)


SIMPLE = register(MergeMethod(
    "simple", "simple average",
    "the weighted average (1 - w) anchor + w source of every tensor",
    _combine, at_size=True))

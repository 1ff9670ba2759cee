"""The simple average: theta = sum_i w_i theta_i, tensor by tensor ((1 - w) theta_anchor +
w theta_source for a pair; the weights are normalised to sum to 1).

The weighted mean is taken in float64 and cast back to the tensor's dtype, so a half
checkpoint merges without float16 rounding in the sum. It needs no statistics, so it runs at
size, a slice of rows at a time (rotviz.merging.rows).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor


def simple_rows(src: RowSource, weights: Sequence[float]) -> Iterator[Tensor]:
    """sum_i w_i t_i / sum_i w_i, slice by slice in float64."""
    total = sum(float(w) for w in weights)
    scale = 1.0 if total == 1.0 else 1.0 / total
    for models, _ in src.slices():
        yield sum(float(w) * scale * t for w, t in zip(weights, models, strict=True))


def simple_average(tensors: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    """sum_i w_i t_i / sum_i w_i, in float64, cast back to the first tensor's dtype."""
    return whole(lambda src: simple_rows(src, weights), tensors, None)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    return simple_rows(src, job.weights)


SIMPLE = register(MergeMethod(
    "simple", "simple average",
    "the weighted average (1 - w) anchor + w source of every tensor",
    rows=_rows, mergekit=Mergekit("linear", fixed={"normalize": True}), order=10))

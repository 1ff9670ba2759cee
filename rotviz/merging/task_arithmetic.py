"""Task arithmetic (Ilharco et al., 2023, "Editing Models with Task Arithmetic"), as mergekit
defines it: theta = base + λ sum_i w_i (theta_i - base), tensor by tensor, the weights taken
as given (mergekit's `normalize` is off for this method: with rotviz's pair weights (1 - w, w),
which sum to 1, λ = 1 is the simple average about the base and λ = 2 the sum of the two task
vectors). It needs the base the models were fine-tuned from; it runs at size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.merging.task_vectors import SCALE_PARAM, combine_deltas

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor


def task_arithmetic_rows(src: RowSource, weights: Sequence[float], scale: float = 1.0
                         ) -> Iterator[Tensor]:
    """base + scale * sum_i w_i (t_i - base), slice by slice in float64."""
    for models, base in src.slices():
        yield combine_deltas(base, [m - base for m in models], weights, scale)


def task_arithmetic(tensors: Sequence[Tensor], base: Tensor, weights: Sequence[float],
                    scale: float = 1.0) -> Tensor:
    """base + scale * sum_i w_i (t_i - base), in float64, cast to the base's dtype."""
    return whole(lambda src: task_arithmetic_rows(src, weights, scale), tensors, base)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    return task_arithmetic_rows(src, job.weights, job.params["scale"])


TASK_ARITHMETIC = register(MergeMethod(
    "task_arithmetic", "task arithmetic",
    "the base plus λ times the weighted sum of the task vectors theta_i - base "
    "(Ilharco et al., 2023)",
    rows=_rows, params=(SCALE_PARAM,), needs_base=True, extra=("scale",),
    mergekit=Mergekit("task_arithmetic", base="base", shared={"scale": "lambda"},
                      fixed={"normalize": False}), order=40))

"""Task arithmetic (Ilharco et al., 2023, "Editing Models with Task Arithmetic"), as mergekit
defines it: theta = base + λ sum_i w_i (theta_i - base), tensor by tensor, the weights taken
as given (mergekit's `normalize` is off for this method: with rotviz's pair weights (1 - w, w),
which sum to 1, λ = 1 is the simple average about the base and λ = 2 the sum of the two task
vectors). It needs the base the models were fine-tuned from; it runs at size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.task_vectors import SCALE_PARAM, combine_deltas, task_vectors

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob

    Tensor = torch.Tensor


def task_arithmetic(tensors: Sequence[Tensor], base: Tensor, weights: Sequence[float],
                    scale: float = 1.0) -> Tensor:
    """base + scale * sum_i w_i (t_i - base), in float64, cast to the base's dtype."""
    return combine_deltas(base, task_vectors(tensors, base), weights, scale)


def _combine(job: MergeJob, name: str, tensors: Sequence[Tensor],
             base: Tensor | None) -> Tensor:
    return task_arithmetic(tensors, base, job.weights, job.params["scale"])


TASK_ARITHMETIC = register(MergeMethod(
    "task_arithmetic", "task arithmetic",
    "the base plus λ times the weighted sum of the task vectors theta_i - base "
    "(Ilharco et al., 2023)",
    _combine, params=(SCALE_PARAM,), at_size=True, needs_base=True, extra=("scale",),
    mergekit=Mergekit("task_arithmetic", base="base", shared={"scale": "lambda"},
                      fixed={"normalize": False})))

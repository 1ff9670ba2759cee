"""TIES merging (Yadav et al., 2023, "TIES-Merging: Resolving Interference When Merging
Models"), as mergekit defines it: trim each task vector d_i = theta_i - base to its `density`
share of largest-magnitude entries, elect each entry's sign from the weighted trimmed vectors
(`consensus` sum or count), and take the disjoint mean: per entry, sum_i w_i d_i over the
vectors whose sign is the elected one, divided by their weights' sum (mergekit's `normalize`,
on for TIES); then theta = base + λ times that. An entry no vector carries keeps the base's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.merging.task_vectors import (
    CONSENSUS_PARAM,
    SCALE_PARAM,
    Trim,
    combine_deltas,
    density_param,
)

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor


def ties_rows(src: RowSource, weights: Sequence[float], density: float = 1.0,
              consensus: str = "sum", scale: float = 1.0) -> Iterator[Tensor]:
    """TIES of one tensor, slice by slice in float64: the trim's thresholds first (passes
    over the slices), then each slice trimmed, elected and averaged."""
    trim = Trim(src, density)
    for models, base in src.slices():
        deltas = [trim(i, m - base) for i, m in enumerate(models)]
        yield combine_deltas(base, deltas, weights, scale, consensus, normalize=True)


def ties(tensors: Sequence[Tensor], base: Tensor, weights: Sequence[float],
         density: float = 1.0, consensus: str = "sum", scale: float = 1.0) -> Tensor:
    """TIES of one tensor, in float64, cast to the base's dtype."""
    return whole(lambda src: ties_rows(src, weights, density, consensus, scale), tensors, base)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    p = job.params
    return ties_rows(src, job.weights, p["density"], p["consensus"], p["scale"])


TIES = register(MergeMethod(
    "ties", "TIES",
    "task vectors trimmed to their largest entries, signs elected, the agreeing entries "
    "averaged (Yadav et al., 2023)",
    rows=_rows,
    params=(density_param(1.0, "kept by magnitude (TIES) or at random (DARE)"),
            CONSENSUS_PARAM, SCALE_PARAM),
    needs_base=True, extra=("density", "consensus", "scale"),
    # mergekit elects signs by the weighted sum only (no "count"); TIES divides by the
    # weights of the agreeing vectors (normalize on)
    mergekit=Mergekit("ties", base="base", shared={"scale": "lambda"},
                      per_model={"density": "density"}, values={"consensus": {"sum": None}},
                      fixed={"normalize": True}), order=50))

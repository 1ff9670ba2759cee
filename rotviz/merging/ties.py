"""TIES merging (Yadav et al., 2023, "TIES-Merging: Resolving Interference When Merging
Models"), as mergekit defines it: trim each task vector d_i = theta_i - base to its `density`
share of largest-magnitude entries, elect each entry's sign from the weighted trimmed vectors
(`consensus` sum or count), and take the disjoint mean: per entry, sum_i w_i d_i over the
vectors whose sign is the elected one, divided by their weights' sum (mergekit's `normalize`,
on for TIES); then theta = base + λ times that. An entry no vector carries keeps the base's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.task_vectors import (
    CONSENSUS_PARAM,
    SCALE_PARAM,
    combine_deltas,
    density_param,
    task_vectors,
    trim,
)

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob

    Tensor = torch.Tensor


def ties(tensors: Sequence[Tensor], base: Tensor, weights: Sequence[float],
         density: float = 1.0, consensus: str = "sum", scale: float = 1.0) -> Tensor:
    """TIES of one tensor, in float64, cast to the base's dtype."""
    deltas = [trim(d, density) for d in task_vectors(tensors, base)]
    return combine_deltas(base, deltas, weights, scale, consensus, normalize=True)


def _combine(job: MergeJob, name: str, tensors: Sequence[Tensor],
             base: Tensor | None) -> Tensor:
    p = job.params
    return ties(tensors, base, job.weights, p["density"], p["consensus"], p["scale"])


TIES = register(MergeMethod(
    "ties", "TIES",
    "task vectors trimmed to their largest entries, signs elected, the agreeing entries "
    "averaged (Yadav et al., 2023)",
    _combine,
    params=(density_param(1.0, "kept by magnitude (TIES) or at random (DARE)"),
            CONSENSUS_PARAM, SCALE_PARAM),
    at_size=True, needs_base=True, extra=("density", "consensus", "scale"),
    # mergekit elects signs by the weighted sum only (no "count"); TIES divides by the
    # weights of the agreeing vectors (normalize on)
    mergekit=Mergekit("ties", base="base", shared={"scale": "lambda"},
                      per_model={"density": "density"}, values={"consensus": {"sum": None}},
                      fixed={"normalize": True})))

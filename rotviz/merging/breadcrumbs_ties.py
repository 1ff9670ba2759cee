"""Model Breadcrumbs with TIES (mergekit 0.1.5's `breadcrumbs_ties`): each task vector masked
as Breadcrumbs masks it (rotviz.merging.breadcrumbs: the `gamma` share of largest-magnitude
outliers and the smallest entries dropped, a `density` share kept), then TIES's sign election
on the weighted vectors, and theta = base + λ sum_i w_i d~_i over the vectors that carry the
elected sign, not divided by their weights (mergekit's `normalize` is off for it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from rotviz.merging.breadcrumbs import DENSITY_PARAM, GAMMA, MERGEKIT_FIXED, breadcrumbs_rows
from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.task_vectors import CONSENSUS_PARAM, SCALE_PARAM

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    p = job.params
    return breadcrumbs_rows(src, job.weights, p["density"], p["gamma"], p["scale"],
                            p["consensus"])


BREADCRUMBS_TIES = register(MergeMethod(
    "breadcrumbs_ties", "Breadcrumbs (TIES)",
    "task vectors without their largest outliers and smallest entries, signs elected, the "
    "agreeing entries summed onto the base (Davari & Belilovsky, 2023)",
    rows=_rows, params=(DENSITY_PARAM, GAMMA, CONSENSUS_PARAM, SCALE_PARAM), needs_base=True,
    extra=("density", "gamma", "consensus", "scale"),
    # mergekit elects by the weighted sum only (no "count")
    mergekit=Mergekit("breadcrumbs_ties", base="base", shared={"scale": "lambda"},
                      per_model={"density": "density", "gamma": "gamma"},
                      values={"consensus": {"sum": None}}, fixed=MERGEKIT_FIXED), order=74))

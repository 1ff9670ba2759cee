"""DELLA-linear (mergekit 0.1.5's `della_linear`): each task vector dropped as DELLA drops it
(rotviz.merging.della: keep probabilities density ± epsilon by magnitude rank within a row,
the kept entries rescaled), then theta = base + λ sum_i w_i d~_i, no sign election and no
division by the weights (mergekit's `normalize` off).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from rotviz.merging.dare import DROP_SEED
from rotviz.merging.della import (
    DENSITY,
    EPSILON_PARAM,
    MERGEKIT_PER_MODEL,
    MERGEKIT_RESCALE,
    MERGEKIT_SHARED,
    RESCALE,
    della_rows,
)
from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.task_vectors import SCALE_PARAM

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    p = job.params
    return della_rows(src, job.weights, name, p["density"], p["epsilon"], p["seed"],
                      p["rescale"], p["scale"], consensus=None)


DELLA_LINEAR = register(MergeMethod(
    "della_linear", "DELLA (linear)",
    "task vectors dropped at random, the larger entries kept more often, rescaled, then "
    "summed with their weights onto the base (Deep et al., 2024)",
    rows=_rows, params=(DENSITY, EPSILON_PARAM, DROP_SEED, RESCALE, SCALE_PARAM),
    needs_base=True, extra=("density", "epsilon", "seed", "rescale", "scale"),
    mergekit=Mergekit("della_linear", base="base", shared=MERGEKIT_SHARED,
                      per_model=MERGEKIT_PER_MODEL, values=MERGEKIT_RESCALE,
                      fixed={"normalize": False}), order=78))

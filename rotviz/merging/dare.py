"""DARE (Yu et al., 2024, "Language Models are Super Mario: Absorbing Abilities from
Homologous Models as a Free Lunch"), as mergekit defines its `dare_linear` and `dare_ties`:
drop each entry of each task vector d_i = theta_i - base at random with probability
1 - `density` (a generator seeded by `seed`, the tensor's name and the model's index), rescale
what is kept (`rescale`: l1, to the task vector's L1 norm before dropping, mergekit 0.1.5's
default (its `rescale: true`) and so rotviz's, which lets the defaults export to mergekit;
density, by 1 / density, the paper's, which keeps each entry's expectation; or none), then

- dare_linear: theta = base + λ sum_i w_i d~_i;
- dare_ties: TIES's sign election on the weighted vectors, and theta = base + λ sum_i w_i d~_i
  over the vectors whose sign is the elected one, not divided by their weights (mergekit's
  `normalize` is off for both DARE methods).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.limits import SEED
from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.merging.task_vectors import (
    CONSENSUS_PARAM,
    RESCALES,
    SCALE_PARAM,
    Drop,
    combine_deltas,
    density_param,
    drop_seed,
)
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor

DENSITY = density_param(1.0, "kept by magnitude (TIES) or at random (DARE)")
RESCALE = Param("rescale", "l1", "what DARE's kept entries are rescaled by: l1 (to the L1 norm "
                "before dropping, mergekit's default), density (1 / density, the paper's) or "
                "none (default l1)", choices=RESCALES, label="DARE: rescaling")
DROP_SEED = Param("seed", 0, "seed of DARE's random drop (default 0)", SEED, label="Seed")


def dare_rows(src: RowSource, weights: Sequence[float], name: str, density: float = 1.0,
              seed: int = 0, rescale: str = "l1", scale: float = 1.0,
              consensus: str | None = None) -> Iterator[Tensor]:
    """DARE of one tensor (named `name`, which seeds its masks), slice by slice in float64:
    linear without `consensus`, TIES's election with it."""
    drop = Drop(src, density, [drop_seed(seed, name, i) for i in range(src.n)], rescale)
    for models, base in src.slices():
        deltas = [drop(i, m - base) for i, m in enumerate(models)]
        yield combine_deltas(base, deltas, weights, scale, consensus, normalize=False)


def dare(tensors: Sequence[Tensor], base: Tensor, weights: Sequence[float], name: str,
         density: float = 1.0, seed: int = 0, rescale: str = "l1", scale: float = 1.0,
         consensus: str | None = None) -> Tensor:
    """DARE of one tensor (named `name`, which seeds its masks): linear without `consensus`,
    TIES's election with it; in float64, cast to the base's dtype."""
    return whole(lambda src: dare_rows(src, weights, name, density, seed, rescale, scale,
                                       consensus), tensors, base)


def _linear(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    p = job.params
    return dare_rows(src, job.weights, name, p["density"], p["seed"], p["rescale"],
                     p["scale"])


def _ties(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    p = job.params
    return dare_rows(src, job.weights, name, p["density"], p["seed"], p["rescale"],
                     p["scale"], p["consensus"])


# mergekit: the drop from its own RNG (--random-seed), the kept entries rescaled to the task
# vector's L1 norm (rescale true) or not at all; the paper's 1 / density has no switch there
_SHARED = {"scale": "lambda"}
_PER_MODEL = {"density": "density"}
_RESCALE = {"rescale": {"l1": True, "none": False}}

DARE_LINEAR = register(MergeMethod(
    "dare_linear", "DARE (linear)",
    "task vectors dropped at random (rate 1 - density) and rescaled, then summed with their "
    "weights onto the base (Yu et al., 2024)",
    rows=_linear, params=(DENSITY, DROP_SEED, RESCALE, SCALE_PARAM), needs_base=True,
    extra=("density", "seed", "rescale", "scale"),
    mergekit=Mergekit("dare_linear", base="base", shared=_SHARED, per_model=_PER_MODEL,
                      values=_RESCALE, fixed={"normalize": False}), order=60))

DARE_TIES = register(MergeMethod(
    "dare_ties", "DARE (TIES)",
    "task vectors dropped at random and rescaled, signs elected, the agreeing entries summed "
    "onto the base (Yu et al., 2024)",
    rows=_ties, params=(DENSITY, DROP_SEED, RESCALE, CONSENSUS_PARAM, SCALE_PARAM),
    needs_base=True, extra=("density", "seed", "rescale", "consensus", "scale"),
    mergekit=Mergekit("dare_ties", base="base", shared=_SHARED, per_model=_PER_MODEL,
                      values={**_RESCALE, "consensus": {"sum": None}},
                      fixed={"normalize": False}), order=70))

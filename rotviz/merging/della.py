"""DELLA (Deep, Bhardwaj & Sanchez, 2024, "DELLA-Merging: Reducing Interference in Model
Merging through Magnitude-Based Sampling"), as mergekit 0.1.5 defines its `della` (and
`della_linear`, rotviz.merging.della_linear): each entry of each task vector
d_i = theta_i - base is kept at random with a probability that grows with its magnitude's rank
within its row,

    p = density - epsilon + 2 epsilon (r - 1) / (n - 1),   r = 1 (smallest) .. n (largest),

n the row's length (mergekit ranks along a tensor's second dimension, a vector as one row;
a row of one entry, where mergekit fails, has p = density), then the kept entries are
rescaled (`rescale`: l1, to the task vector's L1 norm before dropping over the whole tensor,
mergekit's default (rescale: true) and so rotviz's, as for DARE; density, each by 1 / p, the
paper's, which keeps each entry's expectation; or none), and

- della: TIES's sign election on the weighted vectors and the disjoint mean (mergekit's
  `normalize` on): per entry, sum_i w_i d~_i over the vectors carrying the elected sign,
  divided by their weights' sum; theta = base + λ times that;
- della_linear: theta = base + λ sum_i w_i d~_i (normalize off).

Density >= 1 keeps everything (epsilon unused), density <= 0 nothing; otherwise epsilon must
keep density ± epsilon inside (0, 1): 0 <= epsilon < min(density, 1 - density) (mergekit
refuses the rest; a negative epsilon, which it takes, would favour the small entries).

Ranks are per row, so a merge runs a slice of rows at a time; the L1 rescaling needs the
whole tensor's norms, gathered in a first pass that draws the same masks (each model's draws
come from a CPU generator seeded by the seed, the tensor's name and the model's index, in
the tensor's row order, as DARE's: rotviz.merging.task_vectors.drop_seed).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.errors import RotvizError
from rotviz.limits import EPSILON
from rotviz.merging.dare import DROP_SEED
from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.merging.task_vectors import (
    CONSENSUS_PARAM,
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

# the words of DARE's --rescale (one option serves both): density is the paper's, 1 / the
# keep probability (DARE's is the density itself)
RESCALES = ("density", "l1", "none")
DENSITY = density_param(1.0, "kept on average (DELLA: at random, more of the larger entries)")
EPSILON_PARAM = Param("epsilon", 0.15, "DELLA's spread of keep probabilities: density ± "
                      "epsilon from the smallest entry of a row to the largest; 0 <= epsilon "
                      "< min(density, 1 - density) (default 0.15, mergekit's)", EPSILON,
                      label="ε: spread of keep probabilities", widget=(0.0, 0.45, 0.01))
# one --rescale option serves DARE and DELLA, with one default: mergekit's for all four
# methods (its rescale: true, the L1 norm), so a merge at the defaults exports to mergekit
RESCALE = Param("rescale", "l1", "what DELLA's kept entries are rescaled by: l1 (to the L1 "
                "norm before dropping, mergekit's default), density (1 / each entry's keep "
                "probability, the paper's) or none (default l1)", choices=RESCALES,
                label="DELLA: rescaling")


def check_epsilon(density: float, epsilon: float) -> None:
    """One line unless density ± epsilon lies in (0, 1) (where density is in (0, 1): outside,
    epsilon is unused, as in mergekit)."""
    if not 0.0 < density < 1.0:
        return
    top = min(density, 1.0 - density)
    if not 0.0 <= epsilon < top:
        raise RotvizError(f"--epsilon must be in [0, {top:g}) at --density {density:g} "
                          f"(0 <= epsilon < min(density, 1 - density), so that density ± "
                          f"epsilon lies in (0, 1)), got {epsilon:g}; lower --epsilon")


def _as_rows(d: Tensor) -> Tensor:
    """The tensor as mergekit ranks it: along its second dimension, a vector as one row."""
    return d.reshape(1, -1) if d.dim() < 2 else d


def keep_probabilities(d: Tensor, density: float, epsilon: float) -> Tensor:
    """Each entry's keep probability (float64, d's shape): density - epsilon for the
    smallest magnitude of its row, rising linearly in rank to density + epsilon."""
    import torch

    x = _as_rows(d)
    n = x.shape[1]
    order = x.abs().argsort(dim=1)  # the rank of each entry: one sort, then a scatter
    along = [1, n] + [1] * (x.dim() - 2)  # ranked along the second dimension, as mergekit
    place = torch.arange(n, dtype=torch.float64, device=x.device).reshape(along).expand(x.shape)
    ranks = torch.empty(x.shape, dtype=torch.float64, device=x.device).scatter_(1, order, place)
    spread = ranks / (n - 1) if n > 1 else torch.full_like(ranks, 0.5)
    return ((density - epsilon) + spread * (2 * epsilon)).reshape(d.shape)


class MagPrune(Drop):
    """DELLA's drop of each model's task vector in `src`: DARE's (`Drop`: seeded generators
    slice after slice, the L1 pass, the rescaling) with each entry kept with its own
    `keep_probabilities` and rescaled by it. `uniform` draws the numbers a mask compares
    with (a test may replace it)."""

    def __init__(self, src: RowSource, density: float, epsilon: float, seeds: Sequence[int],
                 rescale: str = "l1") -> None:
        self.epsilon = epsilon
        if 0.0 < density < 1.0 and src.numel > 0:
            check_epsilon(density, epsilon)
        super().__init__(src, density, seeds, rescale)

    def uniform(self, i: int, d: Tensor) -> Tensor:
        """Uniform [0, 1) numbers of d's shape, float64, from model i's generator."""
        import torch

        return torch.rand(d.shape, generator=self.gens[i], dtype=torch.float64).to(d.device)

    def _keep(self, i: int, d: Tensor) -> tuple[Tensor, Tensor]:
        """The slice's mask (True: kept) and the keep probabilities."""
        p = keep_probabilities(d, self.density, self.epsilon)
        return self.uniform(i, d) < p, p

    def _apply(self, d: Tensor, keep: Tensor) -> Tensor:
        import torch

        return torch.where(keep, d, torch.zeros((), dtype=d.dtype, device=d.device))


def della_rows(src: RowSource, weights: Sequence[float], name: str, density: float = 1.0,
               epsilon: float = 0.15, seed: int = 0, rescale: str = "l1",
               scale: float = 1.0, consensus: str | None = "sum") -> Iterator[Tensor]:
    """DELLA of one tensor (named `name`, which seeds its masks), slice by slice in float64:
    with `consensus`, TIES's election and the disjoint mean (della); without, the weighted
    sum (della_linear)."""
    from dataclasses import replace

    # a vector (or a number) is one row, ranked at once: read whole
    rows = replace(src, chunk=max(1, src.numel)) if len(src.shape) < 2 else src
    drop = MagPrune(rows, density, epsilon, [drop_seed(seed, name, i) for i in range(src.n)],
                    rescale)
    for models, base in rows.slices():
        deltas = [drop(i, m - base) for i, m in enumerate(models)]
        yield combine_deltas(base, deltas, weights, scale, consensus,
                             normalize=consensus is not None)


def della(tensors: Sequence[Tensor], base: Tensor, weights: Sequence[float], name: str,
          density: float = 1.0, epsilon: float = 0.15, seed: int = 0, rescale: str = "l1",
          scale: float = 1.0, consensus: str | None = "sum") -> Tensor:
    """DELLA of one tensor (della with `consensus`, della_linear without), in float64, cast to
    the base's dtype."""
    return whole(lambda src: della_rows(src, weights, name, density, epsilon, seed, rescale,
                                        scale, consensus), tensors, base)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    p = job.params
    return della_rows(src, job.weights, name, p["density"], p["epsilon"], p["seed"],
                      p["rescale"], p["scale"], p["consensus"])


# mergekit: its own random draws (--random-seed); rescale true is l1, false none; the paper's
# 1 / p has no switch there
MERGEKIT_SHARED = {"scale": "lambda"}
MERGEKIT_PER_MODEL = {"density": "density", "epsilon": "epsilon"}
MERGEKIT_RESCALE = {"rescale": {"l1": True, "none": False}}

DELLA = register(MergeMethod(
    "della", "DELLA",
    "task vectors dropped at random, the larger entries kept more often, rescaled, signs "
    "elected, the agreeing entries averaged (Deep et al., 2024)",
    rows=_rows, params=(DENSITY, EPSILON_PARAM, DROP_SEED, RESCALE, CONSENSUS_PARAM,
                        SCALE_PARAM),
    needs_base=True, extra=("density", "epsilon", "seed", "rescale", "consensus", "scale"),
    mergekit=Mergekit("della", base="base", shared=MERGEKIT_SHARED,
                      per_model=MERGEKIT_PER_MODEL,
                      values={**MERGEKIT_RESCALE, "consensus": {"sum": None}},
                      fixed={"normalize": True}), order=76))

"""Model Breadcrumbs (Davari & Belilovsky, 2023, "Model Breadcrumbs: Scaling Multi-Task Model
Merging with Sparse Masks"), as mergekit 0.1.5 defines its `breadcrumbs`: each task vector
d_i = theta_i - base loses its largest-magnitude entries (the outliers, a `gamma` share of
the tensor) and its smallest (as many as leave a `density` share), and
theta = base + λ sum_i w_i d~_i (mergekit's `normalize` and `rescale` off).

Counts, of a tensor of n entries: keep t = int(density n) entries, drop the top
g = int(gamma n), and when t + g > n drop fewer outliers (n - t of them), so the kept entries
are those ranked g' + 1 .. g' + t by magnitude from the top, g' = min(g, n - t). Density >= 1
keeps every entry (the outliers too); density 0 keeps none. The ranking is of the whole
tensor, so it is found as TIES's trim finds its threshold (rotviz.merging.task_vectors.Trim:
passes over the slices), twice: the top g' + t entries kept, less the top g'. Entries of
equal magnitude at a cut are taken first to last in the tensor's order (mergekit's sort
takes them in its own order; only equal nonzero magnitudes can tell the two apart).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.limits import DENSITY
from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.merging.task_vectors import SCALE_PARAM, Trim, combine_deltas, density_param
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor

GAMMA = Param("gamma", 0.01, "share of each task vector's largest-magnitude entries dropped as "
              "outliers (Breadcrumbs), in [0, 1] (default 0.01, mergekit's)", DENSITY,
              label="γ: share of outliers dropped", widget=(0.0, 0.2, 0.005))
DENSITY_PARAM = density_param(1.0, "kept (Breadcrumbs: after the outliers, the largest left)")


def _top(src: RowSource, k: int) -> Trim:
    """The trim that keeps each model's k largest-magnitude entries: TIES's, at the density
    whose count max(1, int(density n)) is exactly k (k + 0.5 over n; 0 and n handled apart)."""
    n = src.numel
    if k <= 0:
        return Trim(src, 0.0)
    if k >= n:
        return Trim(src, 1.0)
    return Trim(src, (k + 0.5) / n)


class Outliers:
    """Breadcrumbs' mask of each model's task vector in `src` (the counts in the module's
    docstring); called once per slice in order, `keep(i, d)`."""

    def __init__(self, src: RowSource, density: float, gamma: float) -> None:
        n = src.numel
        self.every = density >= 1.0
        kept = int(density * n)
        outliers = min(int(gamma * n), n - kept)
        self.outer = _top(src, outliers + kept)
        self.inner = _top(src, outliers)

    def __call__(self, i: int, d: Tensor) -> Tensor:
        if self.every:
            return d
        # the inner set lies in the outer one (both take equal magnitudes first to last), so
        # the difference is d on the kept entries and exactly 0 elsewhere
        return self.outer(i, d) - self.inner(i, d)


def breadcrumbs_rows(src: RowSource, weights: Sequence[float], density: float = 1.0,
                     gamma: float = 0.01, scale: float = 1.0,
                     consensus: str | None = None) -> Iterator[Tensor]:
    """Breadcrumbs of one tensor, slice by slice in float64: the two magnitude cuts first
    (passes over the slices), then each slice masked and summed (with TIES's sign election
    when `consensus` is given: breadcrumbs_ties)."""
    keep = Outliers(src, density, gamma)
    for models, base in src.slices():
        deltas = [keep(i, m - base) for i, m in enumerate(models)]
        yield combine_deltas(base, deltas, weights, scale, consensus, normalize=False)


def breadcrumbs(tensors: Sequence[Tensor], base: Tensor, weights: Sequence[float],
                density: float = 1.0, gamma: float = 0.01, scale: float = 1.0,
                consensus: str | None = None) -> Tensor:
    """Breadcrumbs (or Breadcrumbs-TIES with `consensus`) of one tensor, in float64, cast to
    the base's dtype."""
    return whole(lambda src: breadcrumbs_rows(src, weights, density, gamma, scale, consensus),
                 tensors, base)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    p = job.params
    return breadcrumbs_rows(src, job.weights, p["density"], p["gamma"], p["scale"])


# mergekit: normalize and rescale off for both Breadcrumbs methods (its defaults, written)
MERGEKIT_FIXED = {"normalize": False, "rescale": False}

BREADCRUMBS = register(MergeMethod(
    "breadcrumbs", "Breadcrumbs",
    "task vectors without their largest outliers and their smallest entries, summed with "
    "their weights onto the base (Davari & Belilovsky, 2023)",
    rows=_rows, params=(DENSITY_PARAM, GAMMA, SCALE_PARAM), needs_base=True,
    extra=("density", "gamma", "scale"),
    mergekit=Mergekit("breadcrumbs", base="base", shared={"scale": "lambda"},
                      per_model={"density": "density", "gamma": "gamma"},
                      fixed=MERGEKIT_FIXED), order=72))

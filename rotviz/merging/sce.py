"""SCE (Wan et al., 2024, "FuseChat"): select, calculate, erase, as mergekit 0.1.5 defines
its `sce`. With the base w0 and N >= 2 fine-tunes, the task vectors d_i = w_i - w0 of one
tensor are

- selected (`select_topk` < 1): the entries whose variance across the models (population
  variance, over i) is largest are kept, k = floor(select_topk * the number of entries of
  nonzero variance) of them, the rest zeroed in every d_i (k = 0: all zeroed; select_topk
  >= 1 keeps all). Entries of equal variance at the k-th are kept first to last in the
  tensor's order (mergekit's top-k leaves that order to torch);
- calculated: model i's weight is the mean square of its selected d_i over the tensor,
  divided by the sum of those (equal weights 1 / N where that sum is below 1e-6);
- erased: each entry's sign is elected from the sum of the selected d_i (0 counts as +),
  and only the entries of that sign are averaged with the weights:

    theta = w0 + sum_i a_i e_i d_i / max(sum_i a_i e_i, 1e-6),  e_i = [sign d_i = elected].

mergekit takes no weights (the method computes its own), so rotviz's --weight does not
change it. It needs the base; it runs at size, a slice of rows at a time, the variance's
threshold and the mean squares gathered first in passes over the slices.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.limits import SELECT_TOPK
from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.merging.task_vectors import _Select, elect
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor

UNIFORM_BELOW = 1e-6  # mergekit's: a sum of mean squares below this gives equal weights
DIVISOR_FLOOR = 1e-6  # mergekit's floor of the erased weights' sum

SELECT = Param("select_topk", 1.0, "SCE: share of the entries kept, those whose task vectors "
               "vary most across the models, in [0, 1] (mergekit's select_topk; default 1)",
               SELECT_TOPK, label="SCE: share of entries selected", widget=(0.0, 1.0, 0.05))


def variance(models: Sequence[Tensor], base: Tensor) -> Tensor:
    """The population variance across the models of each entry of their task vectors
    (mean, then mean squared deviation: what torch.var computes, to rounding, and 15x
    faster than it over a stacked first dimension)."""
    deltas = [m - base for m in models]
    mean = sum(deltas) / len(deltas)
    return sum((d - mean).square() for d in deltas) / len(deltas)


class Selection:
    """SCE's selection of one tensor: the k entries of largest variance (k = floor(density
    x the entries of nonzero variance)), found in passes over the slices; then `start()`
    before each pass, and `mask(var)` per slice in order (it counts the entries equal to
    the threshold still to keep)."""

    def __init__(self, src: RowSource, density: float) -> None:
        self.density = density
        self.value: float | None = None
        self.keep_equal = 0
        self.k = src.numel if density >= 1.0 else 0
        if density <= 0.0 or density >= 1.0 or src.numel == 0:
            return
        nonzero = sum(int(variance(ms, b).count_nonzero()) for ms, b in src.slices())
        self.k = int(nonzero * density)
        if self.k == 0:
            return
        found = _Select(self.k, src.numel)
        while found.value is None:
            found.begin()
            for models, base in src.slices():
                found.see(variance(models, base).reshape(-1))
            found.end()
        self.value, self.keep_equal = float(found.value), self.k - found.greater

    def start(self) -> None:
        self.left = self.keep_equal

    def mask(self, var: Tensor) -> Tensor:
        """Which entries of this slice are selected (True), given their variance."""
        import torch

        if self.density >= 1.0:
            return torch.ones_like(var, dtype=torch.bool)
        if self.value is None:
            return torch.zeros_like(var, dtype=torch.bool)
        keep = var > self.value
        if self.left:
            equal = (var == self.value).reshape(-1)
            equal &= equal.cumsum(0) <= self.left
            self.left -= int(equal.sum())
            keep |= equal.reshape(var.shape)
        return keep


def sce_rows(src: RowSource, select_topk: float = 1.0) -> Iterator[Tensor]:
    """SCE of one tensor, slice by slice in float64: the selection's threshold (passes), the
    mean squares of the selected task vectors (a pass), then each slice erased and mixed."""
    import torch

    sel = Selection(src, select_topk)

    def selected() -> Iterator[tuple[list[Tensor], Tensor]]:
        sel.start()
        for models, base in src.slices():
            deltas = [m - base for m in models]
            keep = sel.mask(variance(models, base))
            yield [torch.where(keep, d, 0.0) for d in deltas], base

    squares = [0.0] * src.n
    for deltas, _ in selected():
        squares = [s + float(d.square().sum()) for s, d in zip(squares, deltas, strict=True)]
    means = [s / max(1, src.numel) for s in squares]
    total = sum(means)
    alphas = [1.0 / src.n] * src.n if abs(total) < UNIFORM_BELOW else [m / total for m in means]
    for deltas, base in selected():
        carries = elect(deltas, "sum")
        zero = torch.zeros((), dtype=base.dtype, device=base.device)
        parts = [torch.where(c, a, zero) for a, c in zip(alphas, carries, strict=True)]
        mixed = sum(p * d for p, d in zip(parts, deltas, strict=True))
        yield base + mixed / sum(parts).clamp(min=DIVISOR_FLOOR)


def sce(tensors: Sequence[Tensor], base: Tensor, select_topk: float = 1.0) -> Tensor:
    """SCE of one tensor, in float64, cast to the base's dtype."""
    return whole(lambda src: sce_rows(src, select_topk), tensors, base)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    return sce_rows(src, job.params["select_topk"])


SCE = register(MergeMethod(
    "sce", "SCE",
    "task vector entries that vary most across the models selected, weighted by each "
    "model's mean square, signs elected and the agreeing entries averaged (Wan et al., 2024)",
    rows=_rows, params=(SELECT,), needs_base=True, extra=("select_topk",),
    weighted=False,
    mergekit=Mergekit("sce", base="base", weight=None, shared={"select_topk": "select_topk"}),
    order=150))

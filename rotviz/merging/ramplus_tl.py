"""RAM+ (tensor-local), as mergekit 0.1.5's `ramplus_tl` (Reinforced Agent Merging, arXiv
2601.13572): RAM (rotviz.merging.ram), with each model's unique entries scaled up by how much
of what it changes it shares with the others, measured over the whole tensor.

With the base w0 and N >= 2 fine-tunes w_i, d_i = w_i - w0, an entry of d_i counts when
|d_i| > epsilon (`ram_epsilon`, shared with RAM, default 1e-5); n = the number of models whose
entry counts. Per model and per tensor,

    rho_i    = #(entries of d_i that count where n > 1) / max(#(those where n = 1), epsilon),
    lambda_i = 1 + r min(max(rho_i, 0), alpha),
    theta    = w0 + sum_i [c_i, n = 1] lambda_i d_i + sum_i [c_i, n > 1] d_i / n.

Why: RAM keeps an entry only one model changes whole, so a model whose changes mostly overlap
with the others' loses most of its update to averaging; RAM+ gives its few unique entries a
gain of at most 1 + r alpha (`ramplus_r`, default 0.1; `ramplus_alpha`, default 0.2, both
mergekit's) to make up for it. rho_i counts entries of the whole tensor, so the method
gathers the counts in a first pass over the rows, then merges them in a second: it runs at
size. mergekit takes no weights (`--weight` does not change it). Where a model's entries
never count (its task vector zero) at epsilon 0, mergekit divides 0 by 0 and returns NaN
everywhere; that model carries nothing, so rotviz takes its lambda as 1 (the merge is RAM's).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.limits import RAMPLUS_ALPHA, RAMPLUS_R
from rotviz.merging.ram import EPSILON
from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor

R = Param("ramplus_r", 0.1, "RAM+: gain per unit of overlap ratio given to a model's unique "
          "entries (mergekit's r; default 0.1)", RAMPLUS_R, label="RAM+: r (gain)",
          widget=(0.0, 1.0, 0.01))
ALPHA = Param("ramplus_alpha", 0.2, "RAM+: the overlap ratio's cap, so a gain is at most "
              "1 + r alpha (mergekit's alpha; default 0.2)", RAMPLUS_ALPHA,
              label="RAM+: alpha (ratio cap)", widget=(0.0, 2.0, 0.05))


def _masks(models: Sequence[Tensor], base: Tensor, epsilon: float):
    """Each model's task vector on one slice, which of its entries count, and how many models
    count at each entry."""
    import torch

    deltas = [m - base for m in models]
    counts = [d.abs() > epsilon for d in deltas]
    return deltas, counts, torch.stack(counts).sum(0)


def gains(src: RowSource, r: float, alpha: float, epsilon: float) -> list[float]:
    """lambda_i of each model: a pass over the rows counting its entries that count alone and
    with others."""
    shared, unique = [0] * src.n, [0] * src.n
    for models, base in src.slices():
        _, counts, n = _masks(models, base, epsilon)
        for i, c in enumerate(counts):
            shared[i] += int((c & (n > 1)).sum())
            unique[i] += int((c & (n == 1)).sum())
    out = []
    for s, u in zip(shared, unique, strict=True):
        floor = max(float(u), epsilon)
        rho = (s / floor if floor > 0 else float("inf")) if s or u else 0.0  # inf: capped
        out.append(1.0 + r * min(max(rho, 0.0), alpha))
    return out


def ramplus_rows(src: RowSource, r: float = 0.1, alpha: float = 0.2,
                 epsilon: float = 1e-5) -> Iterator[Tensor]:
    """RAM+ of one tensor, slice by slice in float64: the gains first (one pass), then RAM
    with each model's unique entries scaled by its gain."""
    import torch

    lam = gains(src, r, alpha, epsilon)
    for models, base in src.slices():
        deltas, counts, n = _masks(models, base, epsilon)
        alone = n == 1
        share = 1.0 / n.clamp(min=1).to(base.dtype)  # a shared entry's part of the mean
        total = torch.zeros_like(base)
        for d, c, g in zip(deltas, counts, lam, strict=True):
            total += torch.where(c, d, 0.0) * torch.where(alone, g, share)
        yield base + total


def ramplus_tl(tensors: Sequence[Tensor], base: Tensor, r: float = 0.1, alpha: float = 0.2,
               epsilon: float = 1e-5) -> Tensor:
    """RAM+ of one tensor, in float64, cast to the base's dtype."""
    return whole(lambda src: ramplus_rows(src, r, alpha, epsilon), tensors, base)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    p = job.params
    return ramplus_rows(src, p["ramplus_r"], p["ramplus_alpha"], p["ram_epsilon"])


RAMPLUS_TL = register(MergeMethod(
    "ramplus_tl", "RAM+ (tensor-local)",
    "RAM with each model's unique entries scaled up by how much of its change it shares with "
    "the others in the tensor (Reinforced Agent Merging Plus, 2026)",
    rows=_rows, params=(R, ALPHA, EPSILON), needs_base=True,
    extra=("ramplus_r", "ramplus_alpha", "ram_epsilon"),
    weighted=False, mergekit=Mergekit("ramplus_tl", base="base", weight=None,
                      shared={"ramplus_r": "r", "ramplus_alpha": "alpha",
                              "ram_epsilon": "epsilon"}),
    order=165))

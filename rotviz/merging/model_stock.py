"""Model Stock (Jang et al., 2024, "Model Stock: All we need is just a few fine-tuned
models"), as mergekit defines it, tensor by tensor: with the base w0 and N >= 2 fine-tunes
w_i, the task vectors d_i = w_i - w0 are flattened, cos is the mean over pairs i < j of
<d_i, d_j> / max(|d_i| |d_j|, 1e-6) (clipped to [-1, 1]), and

    t = N cos / (1 + (N - 1) cos),    theta = t mean_i(w_i) + (1 - t) w0.

Where 1 + (N - 1) cos is below 1e-6 in magnitude there is no finite ratio, and the base is
kept (t = 0). The mean of the fine-tunes is weighted by their weights (equal by default:
mergekit's plain mean). mergekit's `filter_wise` (one ratio per row) is not offered: one
ratio per tensor, its default. It needs the base; it runs at size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor

NORM_FLOOR = 1e-6  # mergekit's floor of |d_i| |d_j| in the cosine
SINGULAR = 1e-6  # |1 + (N - 1) cos| below this keeps the base


def stock_ratio(src: RowSource) -> float:
    """t = N cos / (1 + (N - 1) cos), cos the mean pairwise cosine of the task vectors of
    the whole tensors (their dot products summed over a pass of the slices)."""
    import math

    n = src.n
    dots = [[0.0] * n for _ in range(n)]
    for models, base in src.slices():
        ds = [(m - base).reshape(-1) for m in models]
        for i, di in enumerate(ds):
            for j in range(i, n):
                dots[i][j] += float(di @ ds[j])
    norms = [math.sqrt(dots[i][i]) for i in range(n)]
    cos = [min(1.0, max(-1.0, dots[i][j] / max(norms[i] * norms[j], NORM_FLOOR)))
           for i in range(n) for j in range(i + 1, n)]
    mean_cos = sum(cos) / len(cos)
    den = 1.0 + (n - 1) * mean_cos
    return 0.0 if abs(den) < SINGULAR else n * mean_cos / den


def model_stock_rows(src: RowSource, weights: Sequence[float] | None = None
                     ) -> Iterator[Tensor]:
    """Model Stock of one tensor, slice by slice in float64: the ratio first (a pass)."""
    ws = [1.0] * src.n if weights is None else [float(w) for w in weights]
    total = sum(ws)
    t = stock_ratio(src)
    for models, base in src.slices():
        mean = sum(w / total * m for w, m in zip(ws, models, strict=True))
        yield t * mean + (1.0 - t) * base


def model_stock(tensors: Sequence[Tensor], base: Tensor,
                weights: Sequence[float] | None = None) -> Tensor:
    """Model Stock of one tensor, in float64, cast to the base's dtype."""
    return whole(lambda src: model_stock_rows(src, weights), tensors, base)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    return model_stock_rows(src, job.weights)


MODEL_STOCK = register(MergeMethod(
    "model_stock", "Model Stock",
    "the fine-tunes' mean pulled toward the base by a ratio from the angle between their task "
    "vectors (Jang et al., 2024)",
    rows=_rows, needs_base=True,
    mergekit=Mergekit("model_stock", base="base", weight=None, fixed={"filter_wise": False}),
    order=90))

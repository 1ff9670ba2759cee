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

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import Mergekit, MergeMethod, register

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob

    Tensor = torch.Tensor

NORM_FLOOR = 1e-6  # mergekit's floor of |d_i| |d_j| in the cosine
SINGULAR = 1e-6  # |1 + (N - 1) cos| below this keeps the base


def stock_ratio(tensors: Sequence[Tensor], base: Tensor) -> float:
    """t = N cos / (1 + (N - 1) cos), cos the mean pairwise cosine of the task vectors."""
    b = base.double().reshape(-1)
    ds = [t.double().reshape(-1) - b for t in tensors]
    cos = []
    for i, di in enumerate(ds):
        for dj in ds[i + 1:]:
            c = float(di @ dj) / max(float(di.norm()) * float(dj.norm()), NORM_FLOOR)
            cos.append(min(1.0, max(-1.0, c)))
    mean_cos = sum(cos) / len(cos)
    n = len(ds)
    den = 1.0 + (n - 1) * mean_cos
    return 0.0 if abs(den) < SINGULAR else n * mean_cos / den


def model_stock(tensors: Sequence[Tensor], base: Tensor,
                weights: Sequence[float] | None = None) -> Tensor:
    """Model Stock of one tensor, in float64, cast to the base's dtype."""
    ws = [1.0] * len(tensors) if weights is None else [float(w) for w in weights]
    total = sum(ws)
    mean = sum(w / total * t.double() for w, t in zip(ws, tensors, strict=True))
    t = stock_ratio(tensors, base)
    return (t * mean + (1.0 - t) * base.double()).to(base.dtype)


def _combine(job: MergeJob, name: str, tensors: Sequence[Tensor],
             base: Tensor | None) -> Tensor:
    return model_stock(tensors, base, job.weights)


MODEL_STOCK = register(MergeMethod(
    "model_stock", "Model Stock",
    "the fine-tunes' mean pulled toward the base by a ratio from the angle between their task "
    "vectors (Jang et al., 2024)",
    _combine, at_size=True, needs_base=True,
    mergekit=Mergekit("model_stock", base="base", weight=None, fixed={"filter_wise": False})))

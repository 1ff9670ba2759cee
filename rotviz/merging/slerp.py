"""Spherical linear interpolation (SLERP) of two models, tensor by tensor, as mergekit
defines it: each tensor of the anchor (v0) and the source (v1) is flattened, the angle
theta = arccos <v0/|v0|, v1/|v1|> between them is measured (a norm at most `EPS` counts as 1,
the cosine is clipped to [-1, 1]), and

    theta_t = sin((1 - t) theta) / sin(theta) v0 + sin(t theta) / sin(theta) v1,

with t the weight of the source. Where the two are nearly colinear or opposite
(|cos| > `DOT_THRESHOLD`) the sines are ill-conditioned, and the linear (1 - t) v0 + t v1 is
taken instead. It combines two models only and takes no base (mergekit's base is the anchor:
t = 0 gives it back), and runs at size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import Mergekit, MergeMethod, register

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob

    Tensor = torch.Tensor

DOT_THRESHOLD = 0.9995  # mergekit's: |cos| above this interpolates linearly
EPS = 1e-8  # mergekit's: a norm at most this is taken as 1


def slerp(v0: Tensor, v1: Tensor, t: float, dot_threshold: float = DOT_THRESHOLD,
          eps: float = EPS) -> Tensor:
    """SLERP of one tensor from `v0` (t = 0) to `v1` (t = 1), in float64, cast to v0's dtype."""
    import math

    a, b = v0.double().reshape(-1), v1.double().reshape(-1)
    if a.numel() == 0:
        return v0.clone()
    na, nb = float(a.norm()), float(b.norm())
    na, nb = (na if na > eps else 1.0), (nb if nb > eps else 1.0)
    dot = min(1.0, max(-1.0, float((a / na) @ (b / nb))))
    if abs(dot) > dot_threshold:
        ca, cb = 1.0 - t, t
    else:
        theta = math.acos(dot)
        ca = math.sin((1.0 - t) * theta) / math.sin(theta)
        cb = math.sin(t * theta) / math.sin(theta)
    return (ca * a + cb * b).reshape(v0.shape).to(v0.dtype)


def _combine(job: MergeJob, name: str, tensors: Sequence[Tensor],
             base: Tensor | None) -> Tensor:
    w0, w1 = job.weights
    return slerp(tensors[0], tensors[1], float(w1) / (float(w0) + float(w1)))


SLERP = register(MergeMethod(
    "slerp", "SLERP",
    "each tensor interpolated along the great circle from the anchor to the source, t = the "
    "weight (linear where they are colinear)",
    _combine, at_size=True, max_models=2, mergekit=Mergekit("slerp", base="anchor", weight="t")))

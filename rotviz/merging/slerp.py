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

from collections.abc import Iterator
from typing import TYPE_CHECKING

from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor

DOT_THRESHOLD = 0.9995  # mergekit's: |cos| above this interpolates linearly
EPS = 1e-8  # mergekit's: a norm at most this is taken as 1


def slerp_rows(src: RowSource, t: float, dot_threshold: float = DOT_THRESHOLD,
               eps: float = EPS) -> Iterator[Tensor]:
    """SLERP of one tensor of two models from the first (t = 0) to the second (t = 1), slice
    by slice in float64: the norms and the angle of the whole tensors first (a pass)."""
    import math

    aa = bb = ab = 0.0
    for (a, b), _ in src.slices():
        a, b = a.reshape(-1), b.reshape(-1)
        aa, bb, ab = aa + float(a @ a), bb + float(b @ b), ab + float(a @ b)
    na, nb = math.sqrt(aa), math.sqrt(bb)
    na, nb = (na if na > eps else 1.0), (nb if nb > eps else 1.0)
    dot = min(1.0, max(-1.0, ab / (na * nb)))
    if abs(dot) > dot_threshold:
        ca, cb = 1.0 - t, t
    else:
        theta = math.acos(dot)
        ca = math.sin((1.0 - t) * theta) / math.sin(theta)
        cb = math.sin(t * theta) / math.sin(theta)
    for (a, b), _ in src.slices():
        yield ca * a + cb * b


def slerp(v0: Tensor, v1: Tensor, t: float, dot_threshold: float = DOT_THRESHOLD,
          eps: float = EPS) -> Tensor:
    """SLERP of one tensor from `v0` (t = 0) to `v1` (t = 1), in float64, cast to v0's dtype."""
    return whole(lambda src: slerp_rows(src, t, dot_threshold, eps), [v0, v1], None)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    w0, w1 = job.weights
    return slerp_rows(src, float(w1) / (float(w0) + float(w1)))


SLERP = register(MergeMethod(
    "slerp", "SLERP",
    "each tensor interpolated along the great circle from the anchor to the source, t = the "
    "weight (linear where they are colinear)",
    rows=_rows, max_models=2, mergekit=Mergekit("slerp", base="anchor", weight="t"), order=80))

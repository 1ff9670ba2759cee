"""NuSLERP (mergekit 0.1.5's `nuslerp`): SLERP of two models with a choice of which vectors
are interpolated, and an optional base. With a base the task vectors d_i = theta_i - base are
interpolated and the base added back. Each vector pair (v0, v1) is normalised (a norm under
`NORM_FLOOR` counts as that floor), cos = <v0/|v0|, v1/|v1|> clipped to [-1, 1], and

    v = (sin((1 - t) theta) v0 + sin(t theta) v1) / sin(theta),   theta = arccos cos,

taken linear, (1 - t) v0 + t v1, where the pair is colinear (1 - cos^2 <= EPS^2; rotviz also
where that is float64 rounding, `ROUNDING`, which mergekit leaves to blow up). The vectors:
the whole flattened tensor (`nuslerp_flatten yes`, mergekit's default; it wins over
row-wise), else the columns (vectors along the first dimension: mergekit's
`nuslerp_row_wise: true` transposes dim 0 to the last), else the rows (along the last
dimension). A tensor of at most one dimension is one vector. t = w1 / (w0 + w1) (0.5 when the
weights sum to about 0): rotviz's weight w of the source. Runs at size: rows need nothing of
the whole tensor; columns and the flattened tensor need their norms first (a pass).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.merging.spherical import vectors
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor

EPS = 1e-8  # mergekit's: colinear where 1 - cos^2 <= EPS^2
NORM_FLOOR = 1e-7  # mergekit's: a norm under this is taken as this when normalising
# rotviz's: 1 - cos^2 under this is rounding (cos within ~4 float64 ulps of +-1) and counts as
# colinear too; mergekit's EPS^2 catches exact +-1 only, and there its sin(theta) ~ 1e-8 turns
# the rounding of colinear or opposite vectors into results of size 1e7
ROUNDING = 2e-15
YES_NO = ("no", "yes")


def mode(shape: Sequence[int], row_wise: bool, flatten: bool) -> str:
    """Which vectors are interpolated: "flat" (the whole tensor), "columns" (along dim 0) or
    "rows" (along the last dim)."""
    if flatten or len(shape) <= 1:
        return "flat"
    return "columns" if row_wise else "rows"


def coefficients(aa: Tensor, bb: Tensor, ab: Tensor, t: float) -> tuple[Tensor, Tensor]:
    """The weights (c0, c1) of v0 and v1 from their squared norms and dot product."""
    import torch

    na, nb = aa.sqrt().clamp(min=NORM_FLOOR), bb.sqrt().clamp(min=NORM_FLOOR)
    cos = (ab / (na * nb)).clamp(-1.0, 1.0)
    colinear = (1.0 - cos.square()) <= max(EPS ** 2, ROUNDING)
    theta = torch.acos(torch.where(colinear, torch.zeros_like(cos), cos))
    s = torch.sin(theta)
    c0 = torch.where(colinear, torch.full_like(cos, 1.0 - t), torch.sin((1.0 - t) * theta) / s)
    c1 = torch.where(colinear, torch.full_like(cos, t), torch.sin(t * theta) / s)
    return c0, c1


def _stats(src: RowSource, how: str) -> tuple[Tensor, Tensor, Tensor] | None:
    """The squared norms and dot of the whole tensor ("flat") or of each column (a pass);
    None for rows, whose statistics each slice holds."""
    if how == "rows":
        return None
    total = None
    for models, base in src.slices():
        a, b = vectors(models, base)
        prods = (a * a, b * b, a * b)
        part = [p.sum() if how == "flat" else p.sum(0) for p in prods]
        total = part if total is None else [x + y for x, y in zip(total, part, strict=True)]
    assert total is not None
    return total[0], total[1], total[2]


def nuslerp_rows(src: RowSource, t: float, row_wise: bool = False, flatten: bool = True
                 ) -> Iterator[Tensor]:
    """NuSLERP of one tensor of two models (about their base, where `src` has one), slice by
    slice in float64."""
    how = mode(src.shape, row_wise, flatten)
    stats = _stats(src, how)
    coef = None if stats is None else coefficients(*stats, t)
    for models, base in src.slices():
        a, b = vectors(models, base)
        if coef is None:
            c0, c1 = coefficients((a * a).sum(-1, keepdim=True), (b * b).sum(-1, keepdim=True),
                                  (a * b).sum(-1, keepdim=True), t)
        else:
            c0, c1 = coef
        out = c0 * a + c1 * b
        yield out if base is None else base + out


def interpolation(weights: Sequence[float]) -> float:
    """mergekit's t: the second weight's share (0.5 where the weights sum to about 0)."""
    total = float(weights[0]) + float(weights[1])
    return 0.5 if abs(total) < 1e-6 else float(weights[1]) / total


def nuslerp(v0: Tensor, v1: Tensor, t: float, base: Tensor | None = None,
            row_wise: bool = False, flatten: bool = True) -> Tensor:
    """NuSLERP of one tensor from `v0` (t = 0) to `v1` (t = 1), about `base` if given, in
    float64, cast to the base's dtype (else v0's)."""
    return whole(lambda src: nuslerp_rows(src, t, row_wise, flatten), [v0, v1], base)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    p = job.params
    return nuslerp_rows(src, interpolation(job.weights), p["nuslerp_row_wise"] == "yes",
                        p["nuslerp_flatten"] == "yes")


NUSLERP = register(MergeMethod(
    "nuslerp", "NuSLERP",
    "SLERP of the whole tensors, their rows or their columns, about a base where one is "
    "given (mergekit's nuslerp)",
    rows=_rows,
    params=(Param("nuslerp_flatten", "yes", "yes: interpolate each whole tensor flattened "
                  "(default; wins over --nuslerp-row-wise); no: row by row or column by column",
                  choices=YES_NO, label="NuSLERP: whole tensors"),
            Param("nuslerp_row_wise", "no", "with --nuslerp-flatten no: yes interpolates the "
                  "columns (vectors along the first dimension, mergekit's row-wise), no the rows "
                  "(along the last; default)", choices=YES_NO, label="NuSLERP: columns")),
    max_models=2, base_optional=True, extra=("nuslerp_flatten", "nuslerp_row_wise"),
    mergekit=Mergekit("nuslerp", base="given",
                      shared={"nuslerp_flatten": "nuslerp_flatten",
                              "nuslerp_row_wise": "nuslerp_row_wise"},
                      values={"nuslerp_flatten": {"yes": True, "no": False},
                              "nuslerp_row_wise": {"yes": True, "no": False}}),
    order=82))

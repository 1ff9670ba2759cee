"""The Karcher mean (mergekit 0.1.5's `karcher`): the weighted Riemannian mean of N models'
directions on the unit sphere, each tensor flattened, scaled by their weighted mean norm.
Units u_i = x_i / |x_i| (a zero tensor's unit is zero); models with |x_i| <= tol are left out
of the mean (all left out: the merge is zero) and the others' weights renormalised. The mean
starts at the normalised weighted mean of the units (the first kept unit where that is under
tol) and takes at most `karcher_max_iter` steps: the tangent sum_i a_i theta_i / sin theta_i
(u_i - cos theta_i m) (units within tol of m skipped), stopping when its norm is under tol,
else m <- m cos|v| + v sin|v| / |v|, renormalised. The result is (sum_i w_i |x_i|) m with the
models' own weights. mergekit weighs the models equally (rotviz's --weight 0.5) and takes no
base. One model is returned as it is.
The mean stays a combination of the units, so it runs at size: the Gram matrix first (a pass,
rotviz.merging.spherical), N x N numbers for the iterations, then the combination. Cosines
within SNAP of +-1 are taken as +-1, and a unit at +-m adds nothing to the tangent (as in
exact arithmetic, where u_i -+ m = 0), so colinear or opposite models stop as mergekit's do
where its rounding is exact. Antipodal models have no unique Karcher mean (a whole sphere of
minimisers): there mergekit's result is its rounding noise amplified by theta / sin theta ~
1e16, and rotviz's the deterministic exact-arithmetic one (the mean direction it starts
from, scaled by the mean norm).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.limits import KARCHER_MAX_ITER, KARCHER_TOL
from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.merging.spherical import combination_rows, gram, quad
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor

MAX_ITER, TOL = 10, 1e-5  # mergekit's defaults
SNAP = 1e-13  # cosines this close to +-1 are +-1 (exact in the tensors, rounded in the Gram)


def _units_gram(g: Sequence[Sequence[float]], norms: Sequence[float]) -> list[list[float]]:
    n = len(norms)
    u = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if norms[i] > 0.0 and norms[j] > 0.0:
                c = 1.0 if i == j else g[i][j] / (norms[i] * norms[j])
                u[i][j] = math.copysign(1.0, c) if abs(abs(c) - 1.0) < SNAP else c
    return u


def karcher_coefficients(g: Sequence[Sequence[float]], weights: Sequence[float],
                         max_iter: int = MAX_ITER, tol: float = TOL) -> list[float]:
    """The Karcher mean as sum_i c_i x_i, from the Gram matrix of the x_i."""
    n = len(weights)
    norms = [math.sqrt(max(0.0, g[i][i])) for i in range(n)]
    u = _units_gram(g, norms)
    valid = [i for i in range(n) if norms[i] > tol]
    if not valid:
        return [0.0] * n
    total = sum(float(weights[i]) for i in valid)
    alpha = {i: float(weights[i]) / total for i in valid}
    m = [alpha.get(i, 0.0) for i in range(n)]  # coefficients of the units
    mn = math.sqrt(max(0.0, quad(u, m, m)))
    m = [float(i == valid[0]) for i in range(n)] if mn < tol else [c / mn for c in m]
    for _ in range(max_iter):
        um = [sum(u[i][j] * m[j] for j in range(n)) for i in range(n)]
        v = [0.0] * n
        for i in valid:
            dot = min(1.0, max(-1.0, um[i]))
            theta = math.acos(dot)
            if theta < tol or abs(abs(dot) - 1.0) < SNAP:  # u_i = +-m: its tangent is 0
                continue
            k = alpha[i] * theta / math.sin(theta)
            v = [v[j] + k * (float(j == i) - dot * m[j]) for j in range(n)]
        vn = math.sqrt(max(0.0, quad(u, v, v)))
        if vn < tol:
            break
        m = [math.cos(vn) * m[j] + math.sin(vn) * v[j] / vn for j in range(n)]
        un = math.sqrt(max(0.0, quad(u, m, m)))
        if un > tol:
            m = [c / un for c in m]
    scale = sum(float(w) * x for w, x in zip(weights, norms, strict=True))
    return [scale * m[i] / norms[i] if norms[i] > 0.0 else 0.0 for i in range(n)]


def karcher_rows(src: RowSource, weights: Sequence[float], max_iter: int = MAX_ITER,
                 tol: float = TOL) -> Iterator[Tensor]:
    """The Karcher mean of one tensor of N models, slice by slice in float64: the Gram matrix
    first (a pass)."""
    if src.n == 1:
        for models, _ in src.slices():
            yield models[0]
        return
    coefs = karcher_coefficients(gram(src), weights, max_iter, tol)
    yield from combination_rows(src, coefs)


def karcher(tensors: Sequence[Tensor], weights: Sequence[float] | None = None,
            max_iter: int = MAX_ITER, tol: float = TOL) -> Tensor:
    """The Karcher mean of one tensor (equal weights by default, as mergekit's), in float64,
    cast to the first tensor's dtype."""
    ws = [1.0 / len(tensors)] * len(tensors) if weights is None else weights
    return whole(lambda src: karcher_rows(src, ws, max_iter, tol), tensors, None)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    p = job.params
    return karcher_rows(src, job.weights, p["karcher_max_iter"], p["karcher_tol"])


KARCHER = register(MergeMethod(
    "karcher", "Karcher mean",
    "the weighted Riemannian mean of the models' directions on the sphere, scaled by their "
    "mean norm (mergekit's karcher)",
    rows=_rows,
    params=(Param("karcher_max_iter", MAX_ITER, "Karcher mean: steps at most (default 10)",
                  KARCHER_MAX_ITER, label="Karcher: steps at most"),
            Param("karcher_tol", TOL, "Karcher mean: stop when the tangent's norm is under this "
                  "(radians); norms at most this leave a model out (default 1e-5)", KARCHER_TOL,
                  label="Karcher: tolerance")),
    extra=("karcher_max_iter", "karcher_tol"),
    mergekit=Mergekit("karcher", weight=None,
                      shared={"karcher_max_iter": "max_iter", "karcher_tol": "tol"}),
    order=86))

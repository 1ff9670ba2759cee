"""Multi-SLERP (mergekit 0.1.5's `multislerp`): barycentric interpolation of N models on the
sphere, each tensor flattened. With a base the task vectors x_i = theta_i - base are
interpolated and the base added back. With weights w_i normalised to sum 1, n_i = |x_i| and
u_i = x_i / (n_i + EPS): the weighted mean m = sum w_i u_i, normalised; the tangent vectors
u_i - <u_i, m> m averaged with the weights to v; the exponential map back,
m cos|v| + v sin|v| / |v| (|v| + EPS), scaled by the weighted mean norm sum w_i n_i.
Where |m| < EPS (antipodal models balanced by their weights) two models are averaged
linearly and more are refused, as in mergekit; one model is returned as it is.
Every quantity is a combination of the x_i, so it runs at size: their Gram matrix first (a
pass, rotviz.merging.spherical), then the combination.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.errors import RotvizError
from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.merging.spherical import combination_rows, gram, quad

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor

EPS = 1e-8  # mergekit's eps (norm offset, degenerate mean)


def multislerp_coefficients(g: Sequence[Sequence[float]], weights: Sequence[float]
                            ) -> list[float]:
    """The merged vector as sum_i c_i x_i, from the Gram matrix of the x_i."""
    n = len(weights)
    total = sum(float(w) for w in weights)
    w = [float(x) / total for x in weights]
    norms = [math.sqrt(max(0.0, g[i][i])) for i in range(n)]
    unit = [1.0 / (norms[i] + EPS) for i in range(n)]  # u_i = unit[i] x_i
    mean = [w[i] * unit[i] for i in range(n)]
    mean_norm = math.sqrt(max(0.0, quad(g, mean, mean)))
    if mean_norm < EPS:
        if n == 2:
            return w
        raise RotvizError("multislerp: the weighted mean of the models' directions is zero "
                          "(antipodal models balanced by their weights); change the weights")
    mean = [c / mean_norm for c in mean]
    gm = [sum(g[i][j] * mean[j] for j in range(n)) for i in range(n)]
    dots = [unit[i] * gm[i] for i in range(n)]  # <u_i, m>
    tangent = [w[i] * unit[i] - sum(w[k] * dots[k] for k in range(n)) * mean[i]
               for i in range(n)]
    tn = math.sqrt(max(0.0, quad(g, tangent, tangent))) + EPS
    scale = sum(norms[i] * w[i] for i in range(n))
    return [scale * (mean[i] * math.cos(tn) + tangent[i] * math.sin(tn) / tn)
            for i in range(n)]


def multislerp_rows(src: RowSource, weights: Sequence[float]) -> Iterator[Tensor]:
    """Multi-SLERP of one tensor of N models (about their base, where `src` has one), slice
    by slice in float64: the Gram matrix first (a pass)."""
    if src.n == 1:  # mergekit returns the one model as it is (not about the base)
        for models, _ in src.slices():
            yield models[0]
        return
    coefs = multislerp_coefficients(gram(src), weights)
    yield from combination_rows(src, coefs)


def multislerp(tensors: Sequence[Tensor], weights: Sequence[float],
               base: Tensor | None = None) -> Tensor:
    """Multi-SLERP of one tensor, in float64, cast to the base's dtype (else the first's)."""
    return whole(lambda src: multislerp_rows(src, weights), tensors, base)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    return multislerp_rows(src, job.weights)


MULTISLERP = register(MergeMethod(
    "multislerp", "Multi-SLERP",
    "N models interpolated on the sphere: the weighted mean direction, the tangent average "
    "mapped back, scaled by the mean norm, about a base where one is given (mergekit's "
    "multislerp)",
    rows=_rows, base_optional=True,
    mergekit=Mergekit("multislerp", base="given", fixed={"normalize_weights": True}),
    order=84))

"""Similarities and shape distances between two representations of the same n examples.

X is (n, p) and Y is (n, q): row i is example i (or token i) seen by two layers, of two
models or of one. Every function here works in float64 on whole representations: statistics
gathered over batches are concatenated first and computed once, so a result never depends
on the batch size (averaging per-batch CKA would: a model against itself would not score 1).

- Linear CKA (Kornblith et al., ICML 2019), the biased HSIC estimator: with column-centred
  X, Y, ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F). Computed in feature space (p x q
  products), never as n x n Gram matrices.
- Unbiased linear CKA (Song et al. 2012's unbiased HSIC, as Nguyen, Raghu and Kornblith 2021
  use): Gram matrices K = X X^T, L = Y Y^T with zeroed diagonals,
  HSIC_u = [tr(K L) + 1'K1 1'L1 / ((n-1)(n-2)) - 2/(n-2) 1'K L1] / (n (n-3)),
  CKA_u = HSIC_u(K, L) / sqrt(HSIC_u(K, K) HSIC_u(L, L)). Also computed from features in
  O(n (p + q)) memory.
- RBF CKA (Kornblith et al.): K_ij = exp(-||x_i - x_j||^2 / (2 sigma^2)), sigma a fraction
  (default 0.5) of the median distance between distinct examples; biased HSIC of the
  centred Gram matrices (n x n: at most RBF_ROWS rows).
- Shape metrics (Williams et al., NeurIPS 2021; github williamslab/netrep): centre, scale
  to unit Frobenius norm, zero-pad to equal width, then the angle between the two points
  modulo a group G: arccos(max_{T in G} tr(X^T Y T)).
    permutation: G the permutations of Y's columns (linear_sum_assignment on X^T Y);
    procrustes: G the orthogonal maps, max = nuclear norm of X^T Y;
    linear (netrep's alpha = 0, CCA-style): both whitened first (X (X^T X)^{-1/2}), then
      Procrustes: the mean canonical correlation.
  Each is a metric on the representations modulo its group (0 for a transformed copy,
  symmetric, triangle inequality). Permutation >= Procrustes always (a permutation is a
  rotation); the linear rung whitens first, which weighs every direction alike, so on real
  layers (a few strong directions and many faint ones) it may exceed Procrustes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rotviz.errors import RotvizError

if TYPE_CHECKING:
    from torch import Tensor

# RBF CKA holds an n x n Gram matrix of each representation (n rows: examples, or tokens with
# --tokens all): 20,000 rows are 3.2 GB per matrix in float64
RBF_ROWS = 20_000
SIGMA = 0.5  # RBF bandwidth: this fraction of the median pairwise distance (Kornblith et al.)
# whitening (linear shape metric): singular values below this fraction of the largest are
# dropped. Whitening blows every direction up to unit variance, roundoff included: a direction
# 1e-6 as strong as the largest is float32 noise in a hidden state (and a LayerNorm stream's
# all-ones direction is exactly null), and kept it would move the distance by 1e-2 under a
# rotation that cannot change it
RANK_TOL = 1e-6


def _wide(x: Tensor) -> Tensor:
    return x.detach().double()


def centred(x: Tensor) -> Tensor:
    """Columns of `x` (float64) with their mean removed."""
    x = _wide(x)
    return x - x.mean(0, keepdim=True)


def _ratio(num: float, den: float) -> float:
    """num / den, 0 where a representation is constant (no variance to compare)."""
    return float(num / den) if den > 0 else 0.0


def linear_cka(x: Tensor, y: Tensor) -> float:
    """Linear CKA with the biased HSIC estimator (1: equal up to an orthogonal map and a
    scale; 0: no linear relation)."""
    x, y = centred(x), centred(y)
    num = float((y.T @ x).square().sum())
    den = float(math.sqrt(float((x.T @ x).square().sum()) * float((y.T @ y).square().sum())))
    return _ratio(num, den)


def unbiased_hsic(x: Tensor, y: Tensor) -> float:
    """Song et al.'s unbiased HSIC of the linear kernels of x and y (diagonals zeroed),
    from the features: tr(K~L~) = ||X^T Y||^2 - sum_i k_ii l_ii, K~1 = X (X^T 1) - diag K."""
    x, y = _wide(x), _wide(y)
    n = x.shape[0]
    if n < 4:
        raise RotvizError(f"unbiased CKA needs at least 4 examples, got {n}; use more data")
    kd, ld = x.square().sum(1), y.square().sum(1)  # diagonals of K and L
    k1 = x @ x.sum(0) - kd  # K~ 1
    l1 = y @ y.sum(0) - ld
    trace = float((x.T @ y).square().sum() - (kd * ld).sum())
    total = float(k1.sum()) * float(l1.sum()) / ((n - 1) * (n - 2))
    cross = 2.0 / (n - 2) * float(k1 @ l1)
    return (trace + total - cross) / (n * (n - 3))


def unbiased_cka(x: Tensor, y: Tensor) -> float:
    """Linear CKA with the unbiased HSIC estimator (Nguyen et al. 2021). Features are
    centred first (the estimator does not change; the products lose less to roundoff)."""
    x, y = centred(x), centred(y)
    kk, ll = unbiased_hsic(x, x), unbiased_hsic(y, y)
    return _ratio(unbiased_hsic(x, y), math.sqrt(max(kk * ll, 0.0)))


def rbf_gram(x: Tensor, sigma: float = SIGMA) -> Tensor:
    """exp(-d_ij^2 / (2 s^2)), s = sigma x the median distance between distinct rows."""
    import torch

    x = _wide(x)
    n = x.shape[0]
    if n > RBF_ROWS:
        raise RotvizError(f"cka-rbf holds an {n} x {n} Gram matrix (more than {RBF_ROWS} rows);"
                          " use --tokens mean or cls, or a smaller split")
    sq = x.square().sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2 * x @ x.T).clamp_min(0)
    d2.fill_diagonal_(0)
    iu = torch.triu_indices(n, n, 1)
    med = float(d2[iu[0], iu[1]].sqrt().median()) if n > 1 else 0.0
    if med == 0:
        return torch.ones_like(d2)
    return torch.exp(-d2 / (2 * (sigma * med) ** 2))


def _centre_gram(k: Tensor) -> Tensor:
    """H K H with H = I - 11'/n."""
    return k - k.mean(0, keepdim=True) - k.mean(1, keepdim=True) + k.mean()


def rbf_cka(x: Tensor, y: Tensor, sigma: float = SIGMA) -> float:
    """CKA of RBF kernels (biased HSIC): <HKH, HLH> / (||HKH|| ||HLH||)."""
    k, lg = _centre_gram(rbf_gram(x, sigma)), _centre_gram(rbf_gram(y, sigma))
    num = float((k * lg).sum())
    return _ratio(num, float(k.norm() * lg.norm()))


def normalised(x: Tensor) -> Tensor:
    """Centred, unit Frobenius norm (a point on the sphere of shapes)."""
    x = centred(x)
    norm = x.norm()
    return x / norm if norm > 0 else x


def _angle(cos: float) -> float:
    return float(math.acos(min(1.0, max(-1.0, cos))))


def cross_singular_values(x: Tensor, y: Tensor) -> Tensor:
    """Singular values of X^T Y (p x q). With fewer rows n than columns, from the n x n
    product R_x R_y^T of the thin QR factors of X^T and Y^T (X^T Y = Q_x R_x R_y^T Q_y^T,
    Q orthonormal): the same non-zero values at a fraction of the cost (32 examples of a
    768-wide layer: 32 x 32, not 768 x 768)."""
    import torch

    if x.shape[0] >= min(x.shape[1], y.shape[1]):
        return torch.linalg.svdvals(x.T @ y)
    _, rx = torch.linalg.qr(x.T)
    _, ry = torch.linalg.qr(y.T)
    return torch.linalg.svdvals(rx @ ry.T)


def procrustes(x: Tensor, y: Tensor) -> float:
    """Angular Procrustes distance (radians, 0 to pi/2): arccos ||X^T Y||_* of the normalised
    representations (zero padding to equal width leaves the nuclear norm unchanged)."""
    return _angle(float(cross_singular_values(normalised(x), normalised(y)).sum()))


def permutation(x: Tensor, y: Tensor) -> float:
    """Angular distance modulo permutations of Y's columns (zero-padded to X's width or
    X's to Y's): arccos max_P tr(X^T Y P), the best P from linear_sum_assignment."""
    from scipy.optimize import linear_sum_assignment

    c = (normalised(x).T @ normalised(y)).cpu().numpy()  # (p, q); padding adds zeros only
    rows, cols = linear_sum_assignment(c, maximize=True)
    return _angle(float(c[rows, cols].sum()))


def whitened(x: Tensor) -> tuple[Tensor, int]:
    """An orthonormal basis of x's centred column space (X (X^T X)^{-1/2} = U V^T spans the
    same; U suffices, as Procrustes is blind to the rotation V) and its rank."""
    import torch

    u, s, _ = torch.linalg.svd(centred(x), full_matrices=False)
    rank = int((s > s[0] * RANK_TOL).sum()) if s.numel() and s[0] > 0 else 0
    return u[:, :rank], rank


def linear_shape(x: Tensor, y: Tensor) -> float:
    """Angular distance modulo invertible linear maps (netrep's alpha = 0): Procrustes of the
    whitened representations, each of norm sqrt(rank) scaled to 1: arccos of the sum of the
    canonical correlations over sqrt(rank_x rank_y)."""
    ux, rx = whitened(x)
    uy, ry = whitened(y)
    if rx == 0 or ry == 0:
        return _angle(0.0)
    return _angle(float(cross_singular_values(ux, uy).sum()) / math.sqrt(rx * ry))


METRICS = {
    "cka": linear_cka,
    "cka-unbiased": unbiased_cka,
    "cka-rbf": rbf_cka,
    "procrustes": procrustes,
    "permutation": permutation,
}
SIMILARITIES = ("cka", "cka-unbiased", "cka-rbf")  # 1 = alike; the rest are distances (0)
# the ladder in function space: the distance modulo each group, the smallest group first
LADDER = (("permutation", permutation), ("rotation", procrustes), ("linear", linear_shape))


def compare(metric: str, x: Tensor, y: Tensor, sigma: float = SIGMA) -> float:
    """One value of `metric` between two representations."""
    if metric == "cka-rbf":
        return rbf_cka(x, y, sigma)
    return METRICS[metric](x, y)

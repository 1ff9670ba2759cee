"""Lanczos on a symmetric operator given as a product (a flat vector -> H v): the top
eigenvalues and eigenvectors (Ritz pairs, with their residuals), the trace (Hutchinson) and
the eigenvalue density (stochastic Lanczos quadrature). The operator is any `Hvp`; the
Hessian of a model's loss is rotviz.analysis.hvp.Curvature's.

Every routine takes a seeded torch.Generator, so the same call gives the same numbers, and
an optional boolean `mask`: the operator restricted to those coordinates (its principal
sub-matrix), the vectors zero outside them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from rotviz.types import Progress

Tensor = torch.Tensor
Hvp = Callable[[Tensor], Tensor]  # flat vector -> flat H v
# Unit vectors per batched pass of an exact trace (Curvature.hvp_rows): 64 rows of a small
# model's parameters cost a few MB and one double backward, where 64 passes cost 64.
EXACT_ROWS = 64

# a Ritz value counts as converged when its residual ||H y - theta y|| (which bounds its
# distance to an eigenvalue of H) is at most this times the largest |Ritz value|
CONVERGED = 1e-4

# ---- Lanczos, Hutchinson, density ----------------------------------------------------------

def lanczos(hvp: Hvp, v0: Tensor, steps: int, mask: Tensor | None = None,
            top: int | None = None, tol: float = 1e-7,
            progress: Progress | None = None, keep: list[Tensor] | None = None,
            info: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The tridiagonal matrix of `steps` Lanczos steps from v0, with full
    reorthogonalisation (every new vector is made orthogonal to all earlier ones, twice, so
    no spurious copies of converged eigenvalues appear). Returns (alpha, beta).

    With `top`, it stops early once the `top` largest Ritz values have residual
    beta_m |s_m| below `tol` times the largest |Ritz value|; it stops too when the Krylov
    space is exhausted (beta ~ 0). With a list `keep`, the Lanczos vectors (one per alpha)
    are put in it, for Ritz vectors (`top_eigenvectors`). With a dict `info`, info["beta"]
    is the norm of the last step's remainder, beta_m: Ritz pair i's residual
    ||H y_i - theta_i y_i|| is beta_m |s_mi| (`ritz_residuals`)."""
    q = v0 / v0.norm()
    basis = [] if keep is None else keep
    basis.append(q)
    alphas: list[float] = []
    betas: list[float] = []
    for j in range(steps):
        w = hvp(q)
        a = float(w @ q)
        alphas.append(a)
        for _ in range(2):
            qs = torch.stack(basis)
            w = w - qs.T @ (qs @ w)
        if mask is not None:
            w = w * mask
        b = float(w.norm())
        if progress is not None:
            progress(j + 1, steps, f"Lanczos step {j + 1} (of at most {steps})")
        if top is not None and len(alphas) >= top:
            theta, s = ritz(alphas, betas)
            scale = max(float(np.abs(theta).max()), 1e-30)
            res = np.abs(b * s[-1, -top:])
            if np.all(res <= tol * scale):
                break
        if b <= 1e-10 * max(1.0, abs(a)) or j == steps - 1:
            break
        betas.append(b)
        q = w / b
        basis.append(q)
    if info is not None:
        info["beta"] = b
    return np.asarray(alphas), np.asarray(betas[:len(alphas) - 1])


def ritz(alphas: list[float], betas: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """The eigenvalues (ascending) and eigenvectors of the Lanczos tridiagonal matrix."""
    t = np.diag(np.asarray(alphas, dtype=np.float64))
    if betas:
        b = np.asarray(betas[:len(alphas) - 1], dtype=np.float64)
        t += np.diag(b, 1) + np.diag(b, -1)
    return np.linalg.eigh(t)


def ritz_residuals(s: np.ndarray, beta: float, k: int) -> list[float]:
    """||H y - theta y|| of the k largest Ritz pairs (largest first): beta_m |s_mi|, the
    standard Lanczos bound, which also bounds each Ritz value's distance to an eigenvalue
    of H (exact arithmetic; full reorthogonalisation keeps it so)."""
    return [float(abs(beta * s[-1, i])) for i in range(s.shape[1] - 1, -1, -1)][:k]


def rademacher(n: int, gen: torch.Generator, dtype, device) -> Tensor:
    return (torch.randint(0, 2, (n,), generator=gen, dtype=torch.int64) * 2 - 1).to(
        dtype=dtype, device=device)


def hutchinson(hvp: Hvp, n: int, probes: int, gen: torch.Generator, dtype, device,
               mask: Tensor | None = None, progress: Progress | None = None,
               rows: Hvp | None = None) -> tuple[float, float | None]:
    """tr(H) ~ mean over Rademacher probes z of z^T H z, with the standard error of that mean
    (sample standard deviation / sqrt(probes)). A single probe has no spread, so its error is
    undefined: None, never NaN (a NaN would reach the JSON, which is strict, and print as a
    number).

    When `probes` is at least the number of parameters, the n unit vectors are exact and no
    more work: the trace is then sum_i e_i^T H e_i, with standard error 0. `rows` (H V for
    the rows of V: Curvature.hvp_rows) takes EXACT_ROWS unit vectors per pass."""
    idx = torch.arange(n, device=device) if mask is None else mask.nonzero().flatten()
    m = int(idx.numel())
    if probes >= m and rows is not None:
        total = 0.0
        for chunk in idx.split(EXACT_ROWS):
            k = torch.arange(len(chunk), device=device)
            e = torch.zeros(len(chunk), n, dtype=dtype, device=device)
            e[k, chunk] = 1.0
            total += float(rows(e)[k, chunk].sum())
        return total, 0.0
    if probes >= m:
        total = 0.0
        for i in idx.tolist():
            e = torch.zeros(n, dtype=dtype, device=device)
            e[i] = 1.0
            total += float(hvp(e)[i])
        return total, 0.0
    vals = []
    for i in range(probes):
        z = rademacher(n, gen, dtype, device)
        if mask is not None:
            z = z * mask
        vals.append(float(z @ hvp(z)))
        if progress is not None:
            progress(i + 1, probes, f"trace probe {i + 1} of {probes}")
    arr = np.asarray(vals)
    se = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else None
    return float(arr.mean()), se


def density(hvp: Hvp, n: int, probes: int, steps: int, gen: torch.Generator, dtype, device,
            mask: Tensor | None = None, points: int = 201, width: float | None = None
            ) -> dict:
    """The eigenvalue density by stochastic Lanczos quadrature: for each Rademacher probe z,
    Lanczos's tridiagonal T gives nodes theta_k (its eigenvalues) and weights tau_k^2 (the
    squared first components of its eigenvectors): the Gauss quadrature of the spectral
    measure of H seen from z. The density is the average over probes of the nodes, each
    spread as a Gaussian of `width` (default 1/100 of the span), and normalised to
    integrate to 1 (its mass at a value is the fraction of eigenvalues near it)."""
    nodes, weights = [], []
    for _ in range(probes):
        z = rademacher(n, gen, dtype, device)
        if mask is not None:
            z = z * mask
        a, b = lanczos(hvp, z, steps, mask)
        theta, s = ritz(list(a), list(b))
        nodes.append(theta)
        weights.append(s[0] ** 2 / probes)
    th, wt = np.concatenate(nodes), np.concatenate(weights)
    lo, hi = float(th.min()), float(th.max())
    span = max(hi - lo, 1e-12)
    sigma = width or span / 100
    grid = np.linspace(lo - 0.05 * span, hi + 0.05 * span, points)
    dens = (wt[None, :] * np.exp(-((grid[:, None] - th[None, :]) ** 2) / (2 * sigma**2))
            ).sum(1) / (sigma * math.sqrt(2 * math.pi))
    return {"grid": grid.tolist(), "density": dens.tolist(), "nodes": th.tolist(),
            "weights": wt.tolist(), "sigma": sigma}

def top_eigenvalues(hvp: Hvp, n: int, k: int, gen: torch.Generator, dtype, device,
                    mask: Tensor | None = None, steps: int = 100, tol: float = CONVERGED,
                    progress: Progress | None = None) -> list[float]:
    """The k largest eigenvalues (largest first) by Lanczos with full reorthogonalisation
    from a seeded Gaussian start (restricted to `mask` when given)."""
    return top_ritz(hvp, n, k, gen, dtype, device, mask, steps, tol, progress)[0]


def top_ritz(hvp: Hvp, n: int, k: int, gen: torch.Generator, dtype, device,
             mask: Tensor | None = None, steps: int = 100, tol: float = CONVERGED,
             progress: Progress | None = None, v0: Tensor | None = None
             ) -> tuple[list[float], list[float]]:
    """`top_eigenvalues` and each one's residual ||H y - theta y|| (`ritz_residuals`), so a
    caller can say when the steps allowed did not make them converge.

    It stops as soon as the k top Ritz pairs' residuals are at most `tol` times the largest
    |Ritz value| (by default CONVERGED, the bar `converged` reports against): a Ritz
    value's error is at most its residual and, once the residual is below its gap to the
    rest of the spectrum, about residual^2 / gap (Kato-Temple), so stopping there rather
    than at 1e-7 saves steps while the values stay at float precision (the digits ViT: 10
    products instead of 14, the same top eigenvalue to 2e-7; docs/landscape.md). `v0`: the
    start vector instead of a seeded Gaussian one (a warm start, e.g. the top eigenvector
    at the previous point of a path: near it, one or two products converge); the
    generator is then left untouched."""
    m = n if mask is None else int(mask.sum())
    if v0 is None:
        v0 = torch.randn(n, generator=gen, dtype=torch.float64)
    v0 = v0.to(dtype=dtype, device=device)
    if mask is not None:
        v0 = v0 * mask
    info: dict = {}
    a, b = lanczos(hvp, v0, min(steps, m), mask, top=min(k, m), tol=tol, progress=progress,
                   info=info)
    theta, s = ritz(list(a), list(b))
    return [float(t) for t in theta[::-1][:k]], ritz_residuals(s, info["beta"], k)


def converged(eigenvalues: list[float], residuals: list[float], want: int = 0) -> bool:
    """Every residual at most CONVERGED times the largest |eigenvalue|, and at least `want`
    eigenvalues (as many as asked, where the space allows)."""
    scale = max((abs(e) for e in eigenvalues), default=0.0)
    return len(eigenvalues) >= want and all(r <= CONVERGED * max(scale, 1e-30)
                                            for r in residuals)


def top_eigenvectors(hvp: Hvp, n: int, k: int, gen: torch.Generator, dtype, device,
                     mask: Tensor | None = None, steps: int = 100, tol: float = 1e-7,
                     info: dict | None = None, v0: Tensor | None = None
                     ) -> tuple[list[float], list[Tensor]]:
    """The k largest eigenvalues (largest first) and their unit eigenvectors (flat, zero
    outside `mask`), as Ritz pairs of the same seeded Lanczos run as `top_eigenvalues`: the
    Ritz vector of Ritz value theta_i is sum_j s_ji q_j over the Lanczos vectors q_j. The
    vectors are orthonormal (full reorthogonalisation keeps the q_j so). With a dict `info`,
    info["residual"] and info["converged"] say how far the pairs are from converged (as
    `hessian` reports them), for a slice along them. `v0`: a warm start, as in `top_ritz`
    (e.g. the previous point's top eigenvector, which these vectors then give the next)."""
    m = n if mask is None else int(mask.sum())
    if v0 is None:
        v0 = torch.randn(n, generator=gen, dtype=torch.float64)
    v0 = v0.to(dtype=dtype, device=device)
    if mask is not None:
        v0 = v0 * mask
    basis: list[Tensor] = []
    last: dict = {}
    a, b = lanczos(hvp, v0, min(steps, m), mask, top=min(k, m), tol=tol, keep=basis,
                   info=last)
    theta, s = ritz(list(a), list(b))
    if info is not None:
        vals, res = [float(t) for t in theta[::-1][:k]], ritz_residuals(s, last["beta"], k)
        info["residual"], info["converged"] = max(res, default=0.0), converged(vals, res)
    qs = torch.stack(basis[:len(a)]).to(torch.float64)
    vecs = []
    for i in range(len(theta) - 1, max(len(theta) - 1 - k, -1), -1):
        v = qs.T @ torch.as_tensor(s[:, i], dtype=torch.float64, device=qs.device)
        vecs.append((v / v.norm()).to(dtype))
    return [float(t) for t in theta[::-1][:k]], vecs

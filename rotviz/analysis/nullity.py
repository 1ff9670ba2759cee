"""How many near-zero Hessian eigenvalues each block has, against how many the symmetry group
explains (docs/landscape.md, "Dimension against near-zero eigenvalues").

Every tangent t of the group satisfies grad L . t = 0 everywhere on the orbit, so H t =
-(Dt)^T grad L: at a critical point (grad L = 0) every tangent is a null vector of the Hessian.
A block's tangents are zero outside the block's parameters G, so they are null vectors of the
principal sub-matrix H_GG too, and (being linearly independent) the nullity of H_GG is at
least the block's group dimension. Other invariances (a key bias under the softmax, writer
means under a LayerNorm, dead units) add null directions the group does not count, so the
count may be higher; away from a critical point the tangents' curvature is O(|grad L|) and
the count may be lower. The residual map's tangents move every block at once, so they are
counted against the whole Hessian (the row 'model': every block's group and the residual
one together).

Near zero means |lambda| <= tol * lambda_max, lambda_max the largest |eigenvalue| of that
sub-matrix. A block of at most `exact_max` parameters is counted exactly: H_GG from
Hessian-vector products against the identity's columns, then eigvalsh. A larger one is
estimated by stochastic Lanczos quadrature: for each Rademacher probe z (on G), Lanczos gives
nodes theta_k and weights tau_k^2 (summing to 1) of the spectral measure seen from z; the
mass of the nodes within the tolerance, times |G|, estimates the count, and the standard
error of that over probes is its error. The quadrature has `steps` nodes per probe, so
eigenvalues closer to zero than the spectrum's resolution are lumped with the null ones.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from rotviz.analysis.hessian import Curvature, _ritz, lanczos, rademacher, restricted
from rotviz.types import Progress

Tensor = torch.Tensor
CHUNK = 64  # unit vectors per batched Hessian-vector product


def dense_block(cur: Curvature, mask: Tensor) -> Tensor:
    """H_GG (m x m, symmetrised) for the coordinates in `mask`: one column per unit vector,
    CHUNK columns per batched product."""
    idx = mask.nonzero().flatten()
    m = int(idx.numel())
    out = torch.empty(m, m, dtype=cur.dtype, device=cur.device)
    for start in range(0, m, CHUNK):
        cols = idx[start:start + CHUNK]
        e = torch.zeros(len(cols), cur.n, dtype=cur.dtype, device=cur.device)
        e[torch.arange(len(cols)), cols] = 1.0
        out[start:start + len(cols)] = cur.hvp_rows(e)[:, idx]
    return (out + out.T) / 2


def count_exact(h: Tensor, tol: float) -> tuple[int, float]:
    """(the number of eigenvalues with |lambda| <= tol * max |lambda|, max |lambda|)."""
    eig = torch.linalg.eigvalsh(h.to(torch.float64))
    top = float(eig.abs().max()) if eig.numel() else 0.0
    return int((eig.abs() <= tol * top).sum()), top


def count_slq(cur: Curvature, mask: Tensor, tol: float, probes: int, steps: int,
              gen: torch.Generator) -> tuple[float, float | None, float]:
    """(count, its standard error over probes, lambda_max), estimated by stochastic Lanczos
    quadrature on the sub-matrix of `mask`. One probe has no spread: its error is None, never
    NaN, so the JSON stays strict and the text can say why there is none."""
    m = int(mask.sum())
    h = restricted(cur.hvp, mask)
    nodes, weights = [], []
    for _ in range(probes):
        z = rademacher(cur.n, gen, cur.dtype, cur.device) * mask
        a, b = lanczos(h, z, min(steps, m), mask)
        theta, s = _ritz(list(a), list(b))
        nodes.append(theta)
        weights.append(s[0] ** 2)
    top = max(float(np.abs(t).max()) for t in nodes)
    mass = np.asarray([float(w[np.abs(t) <= tol * top].sum())
                       for t, w in zip(nodes, weights, strict=True)])
    se = float(mass.std(ddof=1) / math.sqrt(probes)) * m if probes > 1 else None
    return float(mass.mean()) * m, se, top


def nullity(cur: Curvature, loaded, dimension: list[dict], tol: float, exact_max: int,
            probes: int, steps: int, seed: int = 0, progress: Progress | None = None
            ) -> list[dict]:
    """One row per block ('block i'), for the parameters outside the blocks ('outside') and
    for the whole model ('model'): the group dimension it holds (`dimension` as
    rotviz.analysis.tangents.group_dimension gives it; the model's row counts every block
    and the residual map), the parameters, the near-zero count, its error (0 when exact),
    the method (exact or slq), the tolerance and lambda_max. The error is None for an slq
    count from one probe (undefined)."""
    masks = cur.masks("block", loaded)
    masks["model"] = torch.ones(cur.n, dtype=torch.bool, device=cur.device)
    per_block = {f"block {d['layer']}": d["total"] for d in dimension
                 if isinstance(d["layer"], int)}
    gen = torch.Generator().manual_seed(int(seed))
    rows = []
    for i, (name, mask) in enumerate(masks.items()):
        if progress is not None:
            progress(i, len(masks), f"near-zero eigenvalues of {name}")
        m = int(mask.sum())
        dim = sum(d["total"] for d in dimension) if name == "model" else per_block.get(name, 0)
        if m <= exact_max:
            count, top = count_exact(dense_block(cur, mask), tol)
            err, method = 0.0, "exact"
        else:
            count, err, top = count_slq(cur, mask, tol, probes, steps, gen)
            method = "slq"
        rows.append({"block": name, "params": m, "dimension": dim, "near_zero": count,
                     "error": err, "method": method, "tolerance": tol, "lambda_max": top})
    return rows

"""The train loss's gradient graph at one parameter set, kept for several products (the
teleport record's path points, rotviz.measures.teleport): each Hessian-vector product is
then one more backward pass through the kept graph, where rotviz.analysis.hvp.Curvature.hvp
rebuilds the forward and the first backward for each (it holds no graph between calls, so
it scales to models whose graph would not stay in memory); and the top eigenpair by Lanczos
on those products, from a warm start."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rotviz.analysis.hvp import Curvature

Tensor = torch.Tensor


class LossGraph:
    """The loss's gradient graph at `cur`'s point (its split's mean loss, the formula
    Curvature uses), kept: `hvp(v)` is one more backward pass, `third(v)` the gradient of
    v^T H v (v fixed) one more on top; `loss` and `grad` (flat) come with it."""

    def __init__(self, cur: Curvature):
        self.cur = cur
        self.ps = [p.clone().requires_grad_(True) for p in cur.point]
        with torch.enable_grad():
            loss = sum(cur._loss(self.ps, x, y) for x, y in cur.ev.batches)
            self.g = cur._grads(loss, self.ps)
        self.loss = float(loss.detach())
        self.grad = cur.flat([gi.detach() for gi in self.g])
        self.live = [i for i, gi in enumerate(self.g) if gi.requires_grad]

    def _flat(self, parts) -> Tensor:
        return self.cur.flat([h if h is not None else torch.zeros_like(p)
                              for h, p in zip(parts, self.ps, strict=True)]).detach()

    def _hv(self, v: Tensor, create_graph: bool):
        vs = self.cur.unflat(v.to(self.cur.dtype))
        dot = sum((self.g[i] * vs[i]).sum() for i in self.live)
        return vs, torch.autograd.grad(dot, self.ps, retain_graph=True,
                                       create_graph=create_graph, allow_unused=True)

    def hvp(self, v: Tensor) -> Tensor:
        if not self.live:
            return torch.zeros_like(self.grad)
        with torch.enable_grad():
            return self._flat(self._hv(v, False)[1])

    def third(self, v: Tensor) -> Tensor:
        """d(v^T H v)/dtheta with v held fixed (Hellmann-Feynman's d lambda)."""
        if not self.live:
            return torch.zeros_like(self.grad)
        with torch.enable_grad():
            vs, hv = self._hv(v, True)
            f = sum((h * vi).sum() for h, vi in zip(hv, vs, strict=True) if h is not None)
            if not f.requires_grad:  # a model linear in every parameter: no third order
                return torch.zeros_like(self.grad)
            return self._flat(torch.autograd.grad(f, self.ps, retain_graph=True,
                                                  allow_unused=True))


def top_pair(graph: LossGraph, v0: Tensor, steps: int, tol: float) -> tuple[float, Tensor]:
    """The top eigenvalue and its unit eigenvector by Lanczos from v0 (a warm start)."""
    import numpy as np

    from rotviz.analysis.lanczos import lanczos, ritz

    basis: list[Tensor] = []
    a, b = lanczos(graph.hvp, v0, min(steps, graph.cur.n), top=1, tol=tol, keep=basis)
    theta, s = ritz(list(a), list(b))
    qs = torch.stack(basis[:len(a)])
    vec = qs.T @ torch.as_tensor(np.ascontiguousarray(s[:, -1]), dtype=qs.dtype)
    return float(theta[-1]), vec / vec.norm()

"""Quasi-Newton steps for the residual map of a rotation stream, with the per-layer maps
solved again at every point (docs/solvers.md, "Joint steps on a rotation stream").

With the discrete maps held (FFN units, head order), the alternation's continuous block is
phi(D) = max over the per-head Q-K and V-O maps of the objective at residual map D. The
per-head maps are solved exactly given D, so by the envelope theorem the gradient of phi at
the current point is the skew part of the residual cross matrix M computed *after* that
solve, the very matrix the plain alternation hands to Procrustes. The plain step (Procrustes
on M) is Newton's step for D alone: it sees the curvature of the residual map's own term, not
the coupling with the per-head maps, which flattens phi along a long valley; so its steps
shrink by a nearly constant ratio and creep. L-BFGS on phi learns that flatter curvature from
successive gradients and takes the long steps. Its initial inverse Hessian is the plain
step's own (a Lyapunov solve with the symmetric part of M), so its first step is the plain
one to first order.

Everything here works on (k x k) skew generators in reduced coordinates: k = d for an
orthogonal stream; for a centred stream (Q 1 = 1) the d - 1 coordinates orthogonal to all-ones
(`groups.ones_complement`), lifted back by `groups.centred_lift`. A generator A stands for the
map exp(A), applied as the Cayley transform of A / 2 (orthogonal to rounding, agreeing with
exp(A) to second order, and cheaper).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rotviz.groups import centred_lift, ones_complement

Tensor = torch.Tensor

MEMORY = 8  # L-BFGS pairs kept


@dataclass
class Frame:
    """The reduced coordinates of a residual group: `basis` (d, k), or None for all of R^d."""

    basis: Tensor | None

    @classmethod
    def of(cls, group: str, d: int, device: torch.device | str) -> Frame:
        return cls(ones_complement(d, device=device) if group == "centred" else None)

    def reduce(self, m: Tensor) -> Tensor:
        return m if self.basis is None else self.basis.t() @ m @ self.basis

    def lift(self, r: Tensor) -> Tensor:
        return r if self.basis is None else centred_lift(r, self.basis)


def skew(m: Tensor) -> Tensor:
    return 0.5 * (m - m.t())


def cayley(a: Tensor) -> Tensor:
    """The rotation (I - A / 2)^-1 (I + A / 2) of a skew generator A (about exp(A))."""
    eye = torch.eye(len(a), dtype=a.dtype, device=a.device)
    return torch.linalg.solve(eye - 0.5 * a, eye + 0.5 * a)


@dataclass
class Preconditioner:
    """The plain step's inverse Hessian at a point: for the term tr(Q^T M) alone, with S the
    symmetric part of M, the step A that maximises <A, K> - <A, A S> / 2 over skew A solves
    A S + S A = 2 K, i.e. A_ij = 2 K_ij / (s_i + s_j) in S's eigenbasis. Sums that are not
    positive (far from alignment) are floored at a small share of the largest."""

    vectors: Tensor
    scale: Tensor  # 2 / (s_i + s_j), (k, k)

    @classmethod
    def of(cls, m: Tensor) -> Preconditioner:
        s, v = torch.linalg.eigh(0.5 * (m + m.t()))
        pair = s[:, None] + s[None, :]
        floor = 1e-3 * float(pair.abs().max().clamp_min(1e-300))
        return cls(v, 2.0 / pair.clamp_min(floor))

    def __call__(self, k: Tensor) -> Tensor:
        v = self.vectors
        return v @ ((v.t() @ k @ v) * self.scale) @ v.t()


@dataclass
class LBFGS:
    """Limited-memory BFGS on phi, to be maximised: pairs (s, y) of accepted steps and the
    changes of minus the gradient, in the current reduced coordinates (the frame moves with
    each step; steps are small enough late in a valley that the transport is left out).

    Steps and gradients are skew, so a pair is kept as the strict upper triangles (`pack`):
    half the memory (at d 2048 the full pairs are 0.54 GB in float64, part of a streamed
    run's peak). Every quantity the recursion takes is a ratio of inner products, and the
    packed inner product is exactly half the full one, so the directions are the same."""

    pairs: list[tuple[Tensor, Tensor, float]] = field(default_factory=list)
    _upper: Tensor | None = None

    def _mask(self, like: Tensor) -> Tensor:
        k = len(like)
        if self._upper is None or len(self._upper) != k or self._upper.device != like.device:
            self._upper = torch.ones(k, k, dtype=torch.bool, device=like.device).triu(1)
        return self._upper

    def pack(self, a: Tensor) -> Tensor:
        """The strict upper triangle of a skew (k x k) matrix, as a vector."""
        return a[self._mask(a)]

    def unpack(self, v: Tensor, like: Tensor) -> Tensor:
        """The skew (k x k) matrix whose strict upper triangle is `v`."""
        out = torch.zeros_like(like)
        out[self._mask(like)] = v
        return out - out.t()

    def push(self, step: Tensor, grad_before: Tensor, grad_after: Tensor) -> None:
        """Remember an accepted step (generator) and the gradients of phi around it; pairs
        without positive curvature are skipped (they would break the inverse Hessian)."""
        s, y = self.pack(step), self.pack(grad_before - grad_after)  # y: of -phi's gradient
        sy = float(s @ y)
        if sy <= 1e-12 * float(s.norm() * y.norm()):
            return
        self.pairs.append((s, y, 1.0 / sy))
        del self.pairs[:-MEMORY]

    def direction(self, grad: Tensor, h0: Preconditioner) -> Tensor:
        """The quasi-Newton step (a skew generator) from the gradient of phi: the two-loop
        recursion with `h0` as the initial inverse Hessian."""
        q = self.pack(grad)
        alphas = []
        for s, y, rho in reversed(self.pairs):
            a = rho * float(s @ q)
            alphas.append(a)
            q -= a * y
        r = self.pack(skew(h0(self.unpack(q, grad))))
        for (s, y, rho), a in zip(self.pairs, reversed(alphas), strict=True):
            b = rho * float(y @ r)
            r += (a - b) * s
        return self.unpack(r, grad)

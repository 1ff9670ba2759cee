"""rotviz.match.joint's quasi-Newton memory keeps skew pairs packed (strict upper triangles,
half the memory); its directions must equal the textbook two-loop recursion on the full
matrices, written here on its own."""

from __future__ import annotations

import torch

from rotviz.match import joint as jn


def _skew(g: torch.Generator, k: int) -> torch.Tensor:
    m = torch.randn(k, k, dtype=torch.float64, generator=g)
    return m - m.t()


def _full_two_loop(pairs, grad, h0):
    """L-BFGS's two-loop recursion (Nocedal and Wright, Algorithm 7.4) on full matrices with
    the Frobenius inner product, then the skew part of h0's step, as rotviz does."""
    q = grad.clone()
    alphas = []
    for s, y in reversed(pairs):
        rho = 1.0 / float((s * y).sum())
        a = rho * float((s * q).sum())
        alphas.append(a)
        q = q - a * y
    r = h0(q)
    r = 0.5 * (r - r.t())
    for (s, y), a in zip(pairs, reversed(alphas), strict=True):
        rho = 1.0 / float((s * y).sum())
        b = rho * float((y * r).sum())
        r = r + (a - b) * s
    return r


def test_packed_directions_equal_the_full_recursion():
    g = torch.Generator().manual_seed(0)
    k = 40
    m = torch.randn(k, k, dtype=torch.float64, generator=g) + 5.0 * torch.eye(k,
                                                                              dtype=torch.float64)
    h0 = jn.Preconditioner.of(m)
    memory = jn.LBFGS()
    kept = []
    for _ in range(jn.MEMORY + 3):  # more than the memory: the oldest pairs drop out
        step = _skew(g, k)
        before = _skew(g, k)
        after = before - (step + 0.1 * _skew(g, k))  # positive curvature: y = step + noise
        memory.push(step, before, after)
        kept.append((step, before - after))
    kept = kept[-jn.MEMORY:]
    assert len(memory.pairs) == jn.MEMORY
    assert all(s.numel() == k * (k - 1) // 2 for s, _, _ in memory.pairs)  # packed
    grad = _skew(g, k)
    kept_grad = grad.clone()
    got = memory.direction(grad, h0)
    want = _full_two_loop(kept, grad, h0)
    assert torch.equal(got, -got.t())  # exactly skew
    assert float((got - want).norm() / want.norm()) < 1e-12
    assert torch.equal(grad, kept_grad)  # the caller's gradient is read, not changed


def test_pairs_without_positive_curvature_are_skipped():
    g = torch.Generator().manual_seed(1)
    memory = jn.LBFGS()
    step, before = _skew(g, 12), _skew(g, 12)
    memory.push(step, before, before + step)  # y = -step: negative curvature
    assert memory.pairs == []
    memory.push(step, before, before - step)
    assert len(memory.pairs) == 1
    s, y, rho = memory.pairs[0]
    assert abs(rho * float(s @ y) - 1.0) < 1e-15
    assert torch.equal(memory.unpack(s, step), step)  # packing is lossless for a skew step

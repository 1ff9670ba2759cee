"""The groups rotviz works in, and their generic solvers and random draws: linear assignment
(permutations), orthogonal Procrustes, rotations per rotary frequency pair, the centred
orthogonal maps (Q 1 = 1) and the per-head scale quartic. Nothing here knows a model: it takes
and returns tensors, batched over a leading dimension where it can.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from rotviz.errors import RotvizError

Tensor = torch.Tensor


@cache
def _lsap():
    """scipy's exact linear-assignment solver, `scipy.optimize.linear_sum_assignment`.

    That function is the built-in of one small extension module, scipy.optimize._lsap; the
    package scipy.optimize around it imports linprog, scipy.special, scipy.linalg and the
    array-API layer first (about 0.5-0.8 s, a quarter of a command's start-up). The extension
    is loaded on its own from scipy's folder when it is there as expected; otherwise (another
    layout, a frozen install) through scipy.optimize, the same function either way
    (tests/test_auction.py compares them)."""
    import scipy

    folder = os.path.join(os.path.dirname(scipy.__file__), "optimize")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(folder, "_lsap" + suffix)
        if os.path.isfile(path):
            loader = importlib.machinery.ExtensionFileLoader("scipy.optimize._lsap", path)
            spec = importlib.util.spec_from_file_location("scipy.optimize._lsap", path,
                                                          loader=loader)
            if spec is None:
                break
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            solve = getattr(module, "linear_sum_assignment", None)
            if callable(solve):
                return solve
            break
    from scipy.optimize import linear_sum_assignment

    return linear_sum_assignment


def linear_sum_assignment(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """scipy.optimize.linear_sum_assignment (minimising), loaded on first use (`_lsap`)."""
    return _lsap()(cost)


# ---- permutations -------------------------------------------------------------------------


def assign(cost: np.ndarray) -> Tensor:
    """The permutation maximising sum_k cost[perm[k], k] (scipy's exact solver; it releases
    the GIL, so several layers can be solved in threads).

    Shortcut, still exact: when every row's best column is a different column, taking them
    reaches the sum of the row maxima, which no assignment can beat. Later rounds of the
    alternating weight matching meet this almost always (the units are already in place)."""
    best = cost.argmax(axis=1)
    if cost.shape[0] == cost.shape[1] and len(np.unique(best)) == len(best):
        perm = np.empty_like(best)
        perm[best] = np.arange(len(best))
        return torch.as_tensor(perm, dtype=torch.long)
    # scipy would negate a copy and convert another to float64: one float64 copy, negated
    # (the same numbers; 2/3 of the memory at 8192 units, 0.5 GB less)
    rows, cols = linear_sum_assignment(np.negative(cost, dtype=np.float64))
    perm = np.empty_like(rows)
    perm[cols] = rows
    return torch.as_tensor(perm, dtype=torch.long)


def inject(cost: np.ndarray) -> Tensor:
    """For a rectangular cost (m, n) with m <= n: the slots (m,) long, each row's own column,
    all distinct, maximising sum_j cost[j, slots[j]] (scipy's exact rectangular solver).

    This is how a narrower FFN's units go into a wider one's (rotviz.match.widths): source
    unit j takes anchor slot slots[j]; the n - m slots no row takes stay free. With m = n it
    is `assign`'s problem, the inverse way round (slots[perm[k]] = k)."""
    m, n = cost.shape
    if m > n:
        raise RotvizError(f"cannot put {m} units into {n} slots: the cost must have no more "
                          "rows than columns")
    rows, cols = linear_sum_assignment(np.negative(cost, dtype=np.float64))
    slots = np.empty(m, dtype=np.int64)
    slots[rows] = cols
    return torch.as_tensor(slots, dtype=torch.long)


@dataclass(frozen=True)
class Auction:
    """What `auction` found: the permutation (perm[k] = row of column k), its objective
    sum_k cost[perm[k], k], and the dual bound (prices and profits of the final round), which
    no assignment exceeds: `gap` = dual - objective is how far from exact it can be."""

    perm: Tensor
    objective: float
    dual: float
    rounds: int

    @property
    def gap(self) -> float:
        return max(0.0, self.dual - self.objective)


def auction(cost: Tensor | np.ndarray, gap: float = 1e-9, factor: float = 8.0) -> Auction:
    """The permutation maximising sum_k cost[perm[k], k], by Bertsekas' auction with
    epsilon scaling, in torch (on the cost's device; every bidding round is one batched step).

    Rows bid for columns at the price that keeps them epsilon-happy; epsilon shrinks by
    `factor` per phase, prices carry over. It ends when n epsilon, the bound on how far the
    assignment can be from optimal, is at most `gap` times the cost's spread. The returned
    dual bound makes the gap checkable: scipy's exact `assign` stays the reference."""
    a = torch.as_tensor(cost).double()
    n = a.shape[0]
    if a.dim() != 2 or a.shape[1] != n:
        raise RotvizError(f"the auction needs a square cost matrix, not {tuple(a.shape)}")
    idx = torch.arange(n, device=a.device)
    if n < 2:
        return Auction(idx.cpu(), float(a.sum()), float(a.sum()), 0)
    spread = float(a.max() - a.min()) or 1.0
    eps, final = spread / 4, spread * gap / n
    prices = torch.zeros(n, dtype=a.dtype, device=a.device)
    owner = torch.full((n,), -1, dtype=torch.long, device=a.device)  # column -> row
    rounds = 0
    while True:
        owner.fill_(-1)
        held = torch.full((n,), -1, dtype=torch.long, device=a.device)  # row -> column
        while True:
            free = (held < 0).nonzero().flatten()
            if not len(free):
                break
            rounds += 1
            top = (a[free] - prices).topk(2, dim=1)
            col = top.indices[:, 0]
            bid = prices[col] + (top.values[:, 0] - top.values[:, 1]) + eps
            best = torch.full((n,), -torch.inf, dtype=a.dtype, device=a.device)
            best.scatter_reduce_(0, col, bid, "amax")
            won = bid == best[col]
            first = torch.full((n,), len(free), dtype=torch.long, device=a.device)
            first.scatter_reduce_(0, col[won], won.nonzero().flatten(), "amin")
            cols = (first < len(free)).nonzero().flatten()
            rows = free[first[cols]]
            before = owner[cols]
            held[before[before >= 0]] = -1
            owner[cols], held[rows], prices[cols] = rows, cols, best[cols]
        if eps <= final:
            break
        eps = max(eps / factor, final)
    objective = float(a[owner, idx].sum())
    dual = float((a - prices).amax(dim=1).sum() + prices.sum())
    return Auction(owner.cpu(), objective, dual, rounds)


def permutation_matrix(perm: Tensor, dtype=torch.float64) -> Tensor:
    """The matrix Q with Q[perm[k], k] = 1: x Q moves coordinate perm[k] to k."""
    d = len(perm)
    q = torch.zeros(d, d, dtype=dtype)
    q[perm, torch.arange(d)] = 1.0
    return q


# ---- orthogonal maps ----------------------------------------------------------------------


def procrustes(m: Tensor) -> tuple[Tensor, Tensor]:
    """argmax_R tr(R^T M) over orthogonal R, for a batch of M: R = U V^T. Returns (R, S)."""
    u, s, vh = torch.linalg.svd(m)
    return u @ vh, s


def rotation_angles(r: Tensor) -> tuple[Tensor, Tensor]:
    """Eigen-angles of each orthogonal map in degrees (sorted, largest first), and det(R).

    The eigenvalues of an orthogonal R are e^{+-i theta}; its symmetric part (R + R^T) / 2
    has eigenvalues cos theta, and a symmetric eigensolver is several times faster than a
    general one."""
    cos = torch.linalg.eigvalsh((r + r.transpose(-1, -2)) / 2).clamp(-1.0, 1.0)
    ang = torch.rad2deg(torch.arccos(cos))
    return torch.sort(ang, dim=-1, descending=True).values, torch.linalg.det(r)


def ones_complement(d: int, dtype=torch.float64, device=None) -> Tensor:
    """A fixed orthonormal basis (d, d - 1) of the vectors orthogonal to all-ones."""
    a = torch.eye(d, dtype=torch.float64)
    a[:, 0] = 1.0
    q, _ = torch.linalg.qr(a)
    return q[:, 1:].to(dtype=dtype, device=device)


def centred_lift(r: Tensor, bz: Tensor) -> Tensor:
    """The centred orthogonal map (Q 1 = 1) that acts as `r` on the complement of all-ones
    (`bz`, from `ones_complement`) and keeps the all-ones axis."""
    d = bz.shape[0]
    return bz @ r @ bz.t() + torch.full((d, d), 1.0 / d, dtype=r.dtype, device=r.device)


# ---- rotary embeddings: maps per frequency pair -------------------------------------------


def rope_rotary(d_head: int, rope: str) -> int:
    """How many of a head's dims rotary embeddings turn. A layout names it after a colon when
    it is not all of them (partial rotary, as GPT-NeoX's: "rotate_half:16" turns the first 16
    dims, in rotate_half layout among themselves, and leaves the rest of the head alone)."""
    _, _, n = rope.partition(":")
    rotary = int(n) if n else d_head
    if rotary % 2 or not 0 < rotary <= d_head:
        raise RotvizError(f"rotary embeddings need an even number of dims, at most the head "
                          f"size {d_head}, not {rotary}")
    return rotary


def rope_pairs(d_head: int, rope: str) -> tuple[Tensor, Tensor]:
    """The frequency pairs (i, j) of a head of size d_head that rotary embeddings rotate
    together: `rotate_half` (Hugging Face) pairs i with i + r/2, `interleaved` pairs 2j
    with 2j + 1, among the r rotated dims (`rope_rotary`: all of them unless the layout
    says). Returns the first and second members, each (r/2,) long."""
    if d_head % 2:
        raise RotvizError(f"rotary embeddings need an even head size, not {d_head}")
    layout = rope.partition(":")[0]
    rotary = rope_rotary(d_head, rope)
    half = rotary // 2
    if layout == "rotate_half":
        first = torch.arange(half)
        return first, first + half
    if layout == "interleaved":
        first = torch.arange(0, rotary, 2)
        return first, first + 1
    raise RotvizError(f"unknown rotary layout '{layout}': use rotate_half or interleaved")


def rope_free(d_head: int, rope: str) -> Tensor:
    """The dims of a head that rotary embeddings leave alone (partial rotary; else none):
    any orthogonal map of them commutes with the position rotations."""
    return torch.arange(rope_rotary(d_head, rope), d_head)


def rope_maps(x: Tensor, y: Tensor, rope: str, free: Tensor | None = None) -> Tensor:
    """Assemble (..., d_h, d_h) maps from per-pair blocks [[x, -y], [y, x]] (x, y: (..., r/2))
    on the frequency pairs of `rope`, and `free` (..., f, f) on the dims it does not turn
    (partial rotary: d_h = r + f)."""
    half = x.shape[-1]
    dh = 2 * half + (0 if free is None else free.shape[-1])
    i, j = rope_pairs(dh, rope)
    out = x.new_zeros(*x.shape[:-1], dh, dh)
    out[..., i, i] = x
    out[..., j, j] = x
    out[..., i, j] = -y
    out[..., j, i] = y
    if free is not None:
        k = rope_free(dh, rope)
        out[..., k[:, None], k] = free.to(out)
    return out


def rope_procrustes(m: Tensor, rope: str, fixed: Tensor | None = None
                    ) -> tuple[Tensor, Tensor]:
    """argmax_R tr(R^T M) over maps that commute with rotary embeddings and are orthogonal:
    per frequency pair (i, j) the rotation by atan2(M_ji - M_ij, M_ii + M_jj), and on the
    dims rotary embeddings leave alone (partial rotary) the orthogonal Procrustes map. For a
    batch of M (..., d_h, d_h); returns R and the gain of each pair (..., r / 2), followed by
    the free block's (its nuclear norm) when there is one, all pairs and heads at once.

    `fixed` (bool, (r / 2,)) marks pairs that may only turn by 0 or pi (Qwen3's q/k norms:
    see rotviz.symmetry.actions.qk_fixed_pairs): tr(R^T M) is then +-(M_ii + M_jj), and the
    better sign wins."""
    dh = m.shape[-1]
    i, j = rope_pairs(dh, rope)
    x = m[..., i, i] + m[..., j, j]
    y = m[..., j, i] - m[..., i, j]
    theta = torch.atan2(y, x)
    cos, sin, gain = torch.cos(theta), torch.sin(theta), torch.hypot(x, y)
    if fixed is not None:  # exactly +-1 and 0: the map must commute with the gains
        fixed = fixed.to(x.device)
        cos = torch.where(fixed, torch.where(x < 0, -1.0, 1.0).to(x), cos)
        sin = torch.where(fixed, torch.zeros_like(sin), sin)
        gain = torch.where(fixed, x.abs(), gain)
    k = rope_free(dh, rope)
    if not len(k):
        return rope_maps(cos, sin, rope), gain
    free, sv = procrustes(m[..., k[:, None], k])
    return (rope_maps(cos, sin, rope, free=free),
            torch.cat([gain, sv.sum(dim=-1, keepdim=True).to(gain)], dim=-1))


# ---- per-head scales ----------------------------------------------------------------------


def best_scale(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> Tensor:
    """Per head, the real non-zero root of A s^4 - B s^3 + D s - C minimising the objective
    f(s) = A s^2 - 2 B s + C / s^2 - 2 D / s. All heads' quartics are solved at once, as the
    eigenvalues of their companion matrices (what np.roots does for one)."""
    big_a, big_b, big_c, big_d = (t.detach().cpu().double().numpy() for t in (a, b, c, d))
    out = np.ones(len(big_a))
    ok = (big_a > 0) & (big_c > 0)  # else a zero block: any scale is optimal, keep 1
    if not ok.any():
        return torch.as_tensor(out, dtype=torch.float64)
    qa, qb, qc, qd = big_a[ok], big_b[ok], big_c[ok], big_d[ok]
    comp = np.zeros((len(qa), 4, 4))
    comp[:, 0] = np.stack([qb, np.zeros_like(qa), -qd, qc], axis=-1) / qa[:, None]
    comp[:, 1, 0] = comp[:, 2, 1] = comp[:, 3, 2] = 1.0
    roots = np.linalg.eigvals(comp)
    s = roots.real
    valid = (np.abs(roots.imag) <= 1e-9 * np.maximum(1.0, np.abs(roots))) & (s != 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = (qa[:, None] * s**2 - 2 * qb[:, None] * s + qc[:, None] / s**2
             - 2 * qd[:, None] / s)
    f = np.where(valid, f, np.inf)
    pick = np.argmin(f, axis=1)
    found = np.isfinite(f[np.arange(len(f)), pick])
    out[np.flatnonzero(ok)[found]] = s[np.arange(len(s)), pick][found]
    return torch.as_tensor(out, dtype=torch.float64)


# ---- random draws, for tests, demos and the Learn page ------------------------------------


def random_orthogonal(n_heads: int, d: int, gen: torch.Generator, dtype=torch.float64) -> Tensor:
    """Haar-random orthogonal matrices (H, d, d): QR of a Gaussian with the sign fix."""
    g = torch.randn(n_heads, d, d, generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return q.to(dtype)


def random_rope_maps(n: int, d_head: int, rope: str, gen: torch.Generator, rotate: bool = True,
                     scale_range: tuple[float, float] | None = None,
                     dtype=torch.float64) -> Tensor:
    """Random maps (n, d_h, d_h) that commute with rotary embeddings: per frequency pair a
    rotation by a uniform angle (if `rotate`) times a scale drawn from `scale_range` (if
    given), zero elsewhere; on the dims rotary embeddings leave alone (partial rotary) a
    random orthogonal map (if `rotate`) times one scale per map, drawn after the pairs'."""
    i, j = rope_pairs(d_head, rope)
    half = len(i)
    theta = (2 * torch.pi * torch.rand(n, half, generator=gen, dtype=torch.float64) if rotate
             else torch.zeros(n, half, dtype=torch.float64))
    scale = torch.ones(n, half, dtype=torch.float64)
    if scale_range is not None:
        lo, hi = scale_range
        scale = lo + (hi - lo) * torch.rand(n, half, generator=gen, dtype=torch.float64)
    free = None
    f = len(rope_free(d_head, rope))
    if f:
        free = (random_orthogonal(n, f, gen) if rotate
                else torch.eye(f, dtype=torch.float64).expand(n, f, f).clone())
        if scale_range is not None:
            lo, hi = scale_range
            free = free * (lo + (hi - lo) * torch.rand(n, 1, 1, generator=gen,
                                                       dtype=torch.float64))
    return rope_maps(torch.cos(theta) * scale, torch.sin(theta) * scale, rope,
                     free=free).to(dtype)

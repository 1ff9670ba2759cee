"""The auction solver for FFN assignments: it reaches scipy's exact optimum,
its dual bound is never below the optimum, and the gap it reports is within its promise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rotviz.errors import RotvizError
from rotviz.groups import assign, auction


def _cost(n: int, seed: int, planted: float = 0.0) -> torch.Tensor:
    """Cross products of two random FFN layers (the cost of rotviz's FFN matching), the second
    a noisy permuted copy of the first when `planted` > 0."""
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(n, 48, generator=g, dtype=torch.float64)
    w2 = torch.randn(n, 48, generator=g, dtype=torch.float64)
    if planted:
        w2 = planted * w1[torch.randperm(n, generator=g)] + w2
    return w1 @ w2.T


@pytest.mark.parametrize(("n", "seed", "planted"), [(2, 0, 0.0), (17, 1, 0.0), (300, 2, 0.0),
                                                    (300, 3, 2.0), (512, 4, 0.5)])
def test_the_auction_reaches_the_exact_optimum_within_its_bound(n, seed, planted):
    c = _cost(n, seed, planted)
    exact = assign(c.numpy())
    opt = float(c[exact, torch.arange(n)].sum())
    got = auction(c)
    assert sorted(got.perm.tolist()) == list(range(n))
    assert got.objective == pytest.approx(float(c[got.perm, torch.arange(n)].sum()), rel=1e-12)
    spread = float(c.max() - c.min())
    assert got.dual >= opt - 1e-9 * abs(opt)  # a true upper bound
    assert got.objective <= opt + 1e-9 * abs(opt)
    assert got.gap <= 1e-9 * spread * 1.001 + 1e-9 * abs(opt)  # n eps, as promised
    assert opt - got.objective <= got.gap + 1e-9 * abs(opt)


def test_a_looser_gap_is_reported_honestly():
    c = _cost(400, 5)
    exact = assign(c.numpy())
    opt = float(c[exact, torch.arange(400)].sum())
    loose = auction(c, gap=1e-2)
    assert opt - loose.objective <= loose.gap + 1e-9 * abs(opt)
    assert loose.gap <= 1e-2 * float(c.max() - c.min()) * 1.001
    assert loose.rounds < auction(c).rounds  # fewer phases


def test_a_planted_permutation_is_recovered_exactly():
    g = torch.Generator().manual_seed(6)
    perm = torch.randperm(256, generator=g)
    w = torch.randn(256, 32, generator=g, dtype=torch.float64)
    c = w @ w[perm].T  # column k is row perm[k]'s unit
    assert torch.equal(auction(c).perm, perm)
    assert torch.equal(auction(c.numpy()).perm, assign(c.numpy()))


def test_a_non_square_cost_is_refused_in_one_line():
    with pytest.raises(RotvizError, match="square") as e:
        auction(np.zeros((3, 4)))
    assert "\n" not in str(e.value)


def test_the_solver_loaded_on_its_own_is_scipys():
    """rotviz.groups loads scipy's assignment extension without scipy.optimize (start-up):
    it is scipy.optimize.linear_sum_assignment itself (the built-in of scipy.optimize._lsap),
    and it reaches the optimum of every assignment, square with ties and rectangular (checked
    against all of them: no scipy.optimize import in the test either)."""
    from itertools import permutations

    from rotviz.groups import _lsap, linear_sum_assignment

    solve = _lsap()
    assert (solve.__module__, solve.__name__) == ("scipy.optimize._lsap",
                                                  "linear_sum_assignment")
    rng = np.random.default_rng(0)
    for cost in (rng.integers(0, 3, (6, 6)).astype(np.float64),  # many ties
                 rng.standard_normal((4, 6)), rng.standard_normal((6, 4))):
        rows, cols = linear_sum_assignment(cost)
        n = min(cost.shape)
        assert len(set(rows)) == len(set(cols)) == n
        flip = cost.shape[0] > cost.shape[1]
        c = cost.T if flip else cost
        best = min(sum(c[i, p[i]] for i in range(n)) for p in permutations(range(c.shape[1]), n))
        assert cost[rows, cols].sum() == pytest.approx(best, abs=1e-12)

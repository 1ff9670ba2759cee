"""DELLA (rotviz.merging.della) against mergekit 0.1.5's `della`: the keep probabilities by
magnitude rank equal mergekit's (captured from its torch.bernoulli call), and with the same
uniform numbers behind both masks the merges are equal (1e-6 relative: mergekit drops
in float32), with density 0 and 1, all-zero
task vectors and ties in sign; the random part is tested against the definition over many
seeds; a seed reproduces; a bad epsilon is one line."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import refused

from rotviz.errors import RotvizError
from rotviz.merging import della as della_module
from rotviz.merging.della import check_epsilon, della, della_rows, keep_probabilities
from rotviz.merging.rows import whole
from tests.merging.mergekit_reference import mergekit_merge

pytest.importorskip("mergekit", reason="mergekit==0.1.5 (the dev extra)")

TOL = 1e-6
WEIGHTS = (0.6, 0.5, 0.3)
# |z| bound of each binomial keep rate: two-sided 2e-7 per rank, so a family of up to 5 ranks
# (Bonferroni) raises a false alarm with probability below 1e-6
Z = 5.2


def _models(seed: int = 0, shape=(16, 24), n: int = 3):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=g, dtype=torch.float64)
    return [base + torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(n)], base


def _off(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """The largest difference relative to 1 + |mergekit's|: mergekit drops and rescales a
    CPU task vector in float32 (its della_magprune's work dtype), 6e-8 of each entry."""
    return ((ours - theirs).abs() / (1 + theirs.abs())).max().item()


def same_draws(monkeypatch, shape, n: int, seed: int = 7):
    """mergekit's torch.bernoulli and rotviz's uniform numbers made one: model i's mask is
    U_i < p on both sides (U fixed per model); returns the probabilities mergekit asked for."""
    g = torch.Generator().manual_seed(seed)
    u = [torch.rand(shape, generator=g, dtype=torch.float64) for _ in range(n)]
    asked: list[torch.Tensor] = []

    def bernoulli(p, *a, **k):
        i = len(asked) % n
        asked.append(p.clone())
        return (u[i].reshape(p.shape) < p.double()).to(p.dtype)

    monkeypatch.setattr(torch, "bernoulli", bernoulli)
    monkeypatch.setattr(della_module.MagPrune, "uniform",
                        lambda self, i, d: u[i].reshape(d.shape))
    return asked


CASES = [(0.5, 0.15, True), (0.7, 0.1, False), (0.3, 0.0, True), (0.0, 0.15, True),
         (1.0, 0.15, True), (0.9, 0.05, True)]  # density, epsilon, rescale (mergekit's)


@pytest.mark.parametrize("density,epsilon,rescale", CASES)
def test_della_equals_mergekit_with_the_same_draws(monkeypatch, density, epsilon, rescale,
                                                  method="della", consensus="sum"):
    models, base = _models()
    asked = same_draws(monkeypatch, base.shape, len(models))
    theirs = mergekit_merge(method, models, base, WEIGHTS, density=density, epsilon=epsilon,
                            rescale=rescale, **{"lambda": 1.2})
    ours = della(models, base, WEIGHTS, "w", density, epsilon, 0,
                 "l1" if rescale else "none", 1.2, consensus)
    assert _off(ours, theirs) < TOL
    if 0 < density < 1:  # the probabilities themselves, model by model
        assert len(asked) == len(models)
        for m, p in zip(models, asked, strict=True):
            mine = keep_probabilities(m - base, density, epsilon)
            assert (mine - p.double()).abs().max().item() < TOL


def test_all_zero_task_vectors_and_ties_in_sign_as_mergekit(monkeypatch):
    """Opposite task vectors of equal weight (exact eighths about an integer base) tie in
    every sign, which goes to +; an all-zero one carries nothing and is not rescaled."""
    g = torch.Generator().manual_seed(3)
    base = torch.randint(-4, 5, (6, 10), generator=g).double()
    sign = torch.randint(0, 2, (6, 10), generator=g).double() * 2 - 1
    d = sign * (torch.randperm(60, generator=g).double() + 1).reshape(6, 10) / 8
    models = [base + d, base - d, base.clone()]
    ws = (0.5, 0.5, 0.5)
    same_draws(monkeypatch, base.shape, 3)
    for method, consensus in (("della", "sum"), ("della_linear", None)):
        theirs = mergekit_merge(method, models, base, ws, density=0.6, epsilon=0.2)
        ours = della(models, base, ws, "w", 0.6, 0.2, rescale="l1", consensus=consensus)
        assert _off(ours, theirs) < TOL
    zero = [base.clone(), base.clone()]
    theirs = mergekit_merge("della", zero, base, ws[:2], density=0.6, epsilon=0.2)
    assert torch.equal(della(zero, base, ws[:2], "w", 0.6, 0.2), base)
    assert torch.equal(theirs, base)


def test_keep_rate_per_rank_and_rescaling_over_many_seeds():
    """One model, weight 1, about a zero base, rows of 5: over 40 seeds x 400 rows each rank
    r = 1..5 is kept at rate density - eps + 2 eps (r - 1) / 4 (|z| < 5.2 each: a false alarm
    below 1e-6 for the five), a kept entry is d / p under the paper's rescaling (exactly),
    and the L1 rescaling gives back the task vector's L1 norm."""
    density, eps, n = 0.5, 0.2, 5
    g = torch.Generator().manual_seed(0)
    d = torch.randn(400, n, generator=g, dtype=torch.float64)
    rank = d.abs().argsort(1).argsort(1)
    zero = torch.zeros_like(d)
    kept = torch.zeros(n, dtype=torch.float64)
    seeds = 40
    for s in range(seeds):
        out = della([d], zero, (1.0,), "w", density, eps, s, "density", consensus=None)
        p = density - eps + 2 * eps * rank.double() / (n - 1)
        on = out != 0
        assert torch.allclose(out[on], d[on] / p[on], rtol=0, atol=1e-12)
        kept += torch.stack([on[rank == r].double().sum() for r in range(n)])
        l1 = della([d], zero, (1.0,), "w", density, eps, s, "l1", consensus=None)
        assert abs(l1.abs().sum().item() - d.abs().sum().item()) < 1e-9
    trials = seeds * d.shape[0]
    for r in range(n):
        want = density - eps + 2 * eps * r / (n - 1)
        z = (kept[r].item() - trials * want) / math.sqrt(trials * want * (1 - want))
        assert abs(z) < Z, (r, kept[r].item() / trials, want, z)


def test_a_seed_reproduces_and_another_differs_and_slices_equal_the_whole():
    models, base = _models(2, (30, 11))
    a = della(models, base, WEIGHTS, "w", 0.5, 0.1, 3, "l1")
    assert torch.equal(a, della(models, base, WEIGHTS, "w", 0.5, 0.1, 3, "l1"))
    assert not torch.equal(a, della(models, base, WEIGHTS, "w", 0.5, 0.1, 4, "l1"))
    assert not torch.equal(a, della(models, base, WEIGHTS, "x", 0.5, 0.1, 3, "l1"))  # per name
    # read 23 entries at a time: the same masks (the draws run in row order), so the same
    # bits but for the L1 norms, summed by slices in another order (float64 rounding)
    def rows(src, rescale="l1"):
        return della_rows(src, WEIGHTS, "w", 0.5, 0.1, 3, rescale)
    assert (whole(rows, models, base, chunk=23) - a).abs().max().item() < 1e-12
    def plain(src):
        return rows(src, "density")
    assert torch.equal(whole(plain, models, base, chunk=23), whole(plain, models, base))
    vec = [m[0] for m in models]  # a vector is one row, ranked whole even in slices
    def vrows(src):
        return della_rows(src, WEIGHTS, "v", 0.5, 0.1, 3)
    assert torch.equal(whole(vrows, vec, base[0], chunk=4), whole(vrows, vec, base[0]))


def test_one_entry_rows_keep_at_the_density():
    assert torch.equal(keep_probabilities(torch.ones(3, 1), 0.4, 0.1),
                       torch.full((3, 1), 0.4, dtype=torch.float64))


@pytest.mark.parametrize("density,epsilon", [(0.5, 0.5), (0.9, 0.1), (0.2, 0.3), (0.5, -0.1)])
def test_epsilon_outside_its_range_is_one_line(density, epsilon):
    with pytest.raises(RotvizError) as e:
        check_epsilon(density, epsilon)
    msg = str(e.value)
    assert "\n" not in msg and "--epsilon must be in [0, " in msg
    check_epsilon(1.0, 0.5)  # unused where nothing or everything is kept
    check_epsilon(0.5, 0.49)


def test_the_command_line_refuses_a_bad_epsilon_and_a_missing_base(ws, capfd):
    """One line, exit 2, nothing written: epsilon beyond min(density, 1 - density) (its range
    said), beyond its bound, and DELLA (or Breadcrumbs) without a base."""
    a, b, base = (f"zoo:vit-digits-{n}" for n in ("ft-a", "ft-b", "base"))
    cmd = ["merge", a, b, "--data", "digits", "--match", "none", "--out", "m"]
    refused([*cmd, "--method", "della", "--base", base, "--density", "0.9", "--epsilon", "0.2"],
            capfd, ws, "--epsilon must be in [0, 0.1) at --density 0.9", "got 0.2")
    refused([*cmd, "--method", "della_linear", "--base", base, "--epsilon", "0.7"], capfd, ws,
            "--epsilon must be a number from 0 to 0.5, got 0.7")
    for name in ("della", "della_linear", "breadcrumbs", "breadcrumbs_ties"):
        refused([*cmd, "--method", name], capfd, ws, f"--method {name} needs --base MODEL")


@pytest.mark.parametrize("name,kw", [
    ("della", {"density": 0.5, "epsilon": 0.1, "seed": 5, "rescale": "l1"}),
    ("della_linear", {"density": 0.6, "epsilon": 0.2, "seed": 2})])
def test_at_size_equals_in_memory(name, kw, tmp_path):
    """The fine-tuned demo merged at size (block by block, the same seeded masks) equals the
    in-memory merge (1e-6) and its evaluation (tests/test_merge_methods.py's check)."""
    from tests.test_merge_methods import test_streamed_merge_equals_the_in_memory_one as sized

    sized(name, kw, tmp_path)


def test_a_four_dimensional_tensor_is_ranked_along_its_second_dimension(monkeypatch):
    """A convolution's weight (out, in, h, w), as mergekit ranks it: along dimension 1."""
    models, base = _models(6, (4, 6, 3, 3))
    asked = same_draws(monkeypatch, base.shape, len(models))
    theirs = mergekit_merge("della", models, base, WEIGHTS, density=0.5, epsilon=0.2)
    ours = della(models, base, WEIGHTS, "w", 0.5, 0.2, rescale="l1")
    assert _off(ours, theirs) < TOL
    for m, p in zip(models, asked, strict=True):
        assert (keep_probabilities(m - base, 0.5, 0.2) - p.double()).abs().max().item() < TOL

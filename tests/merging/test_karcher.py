"""The Karcher mean equals mergekit 0.1.5's own karcher (1e-6) on random float64 tensors: N
models with equal weights (mergekit's method) and with weights (its karcher_merge_tensors),
one model, colinear, opposite and zero models, all zero, the iteration cap and tolerance; in
small slices (as at size) as whole; its parameters' bounds."""

from __future__ import annotations

import pytest
import torch

from rotviz.errors import RotvizError
from rotviz.merging import method
from rotviz.merging.karcher import karcher_rows
from rotviz.merging.rows import whole

from .mergekit_refs import mk_karcher

pytest.importorskip("mergekit")
TOL = 1e-6


def _rand(*shape, seed=0, n=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(n)]


def ours(tensors, weights=None, max_iter=10, tol=1e-5, chunk=7):
    ws = [1.0 / len(tensors)] * len(tensors) if weights is None else weights
    return whole(lambda src: karcher_rows(src, ws, max_iter, tol), tensors, None, chunk=chunk)


def _diff(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(6, 5), (4, 3, 2), (9,), ()])
def test_equals_mergekit(n, shape):
    ts = _rand(*shape, seed=n, n=n)
    assert _diff(ours(ts), mk_karcher(ts)) < TOL
    ws = [0.1 + 0.2 * i for i in range(n)]
    assert _diff(ours(ts, ws), mk_karcher(ts, ws)) < TOL


@pytest.mark.parametrize("max_iter,tol", [(0, 1e-5), (1, 1e-5), (3, 0.0), (50, 1e-12),
                                          (10, 0.5)])
def test_iterations_and_tolerance(max_iter, tol):
    ts = _rand(7, 3, seed=4, n=4)
    got = ours(ts, max_iter=max_iter, tol=tol)
    assert _diff(got, mk_karcher(ts, max_iter=max_iter, tol=tol)) < TOL


def test_converged_mean_is_a_stationary_point():
    """At convergence the weighted tangent sum of the log maps at the mean vanishes."""
    ts = _rand(20, seed=5, n=3)
    got = ours(ts, max_iter=100, tol=1e-12)
    m = got / got.norm()
    tangent = torch.zeros_like(m)
    for t in ts:
        u = t / t.norm()
        c = torch.clamp(u @ m, -1, 1)
        th = torch.arccos(c)
        tangent += th / torch.sin(th) * (u - c * m) / 3
    assert tangent.norm().item() < 1e-9
    assert abs(got.norm().item() - sum(t.norm().item() for t in ts) / 3) < 1e-9


@pytest.mark.parametrize("case", ["colinear", "opposite", "opposite-odd", "zero", "all-zero"])
def test_edge_cases_equal_mergekit(case):
    """Entries +-1 on 4 x 4 (norms and units exact), so colinear and opposite models have
    cosines exactly +-1 in both tools."""
    a, c = _rand(4, 4, seed=2, n=2)
    a = a.sign()
    z = torch.zeros_like(a)
    b = {"colinear": 2.5 * a, "opposite": -a, "opposite-odd": -3.0 * a, "zero": z,
         "all-zero": z}[case]
    if case == "all-zero":
        a = z
    for ws in (None, [0.7, 0.3]):
        assert _diff(ours([a, b], ws), mk_karcher([a, b], ws)) < TOL, (case, ws)
    assert _diff(ours([a, b, c]), mk_karcher([a, b, c])) < TOL, case


def test_the_record_runs_as_its_definition():
    from rotviz.merging.combine import merge_job

    m = method("karcher")
    assert m.at_size and not m.needs_base and not m.base_optional
    a, b = _rand(6, 5, seed=9, n=2)
    job = merge_job(None, m, (0.5, 0.5), None, {"karcher_max_iter": 20, "karcher_tol": 1e-7})
    got = m.merge(job, "w", [a.float(), b.float()], None)
    assert got.dtype == torch.float32
    assert _diff(got, mk_karcher([a, b], max_iter=20, tol=1e-7)) < 1e-5


def test_bad_values_are_one_line():
    flag = {p.name: p for p in method("karcher").params}
    with pytest.raises(RotvizError, match="--karcher-max-iter must be an integer from 0 to"):
        flag["karcher_max_iter"].parse("-1")
    with pytest.raises(RotvizError, match="--karcher-tol must be a number from 0 to 1"):
        flag["karcher_tol"].parse("2")


def test_rounded_antipodes_give_the_exact_arithmetic_mean():
    """Random models and their negative multiples: no unique mean; rotviz's is the first
    model's direction scaled by the mean norm (mergekit's, its amplified rounding)."""
    (a,) = _rand(5, 4, seed=2, n=1)
    for k, ws in ((-1.0, [0.7, 0.3]), (-3.0, [0.5, 0.5])):
        got = ours([a, k * a], ws)
        scale = ws[0] * a.norm() + ws[1] * abs(k) * a.norm()
        assert _diff(got, scale * a / a.norm()) < TOL


def test_cli_refusals_are_one_line(ws, capfd):
    from conftest import refused

    a, b, base = (f"zoo:vit-digits-{n}" for n in ("ft-a", "ft-b", "base"))
    cmd = ["merge", a, b, "--data", "digits", "--match", "none", "--out", "m"]
    refused([*cmd, "--method", "karcher", "--base", base], capfd, ws,
            "--method karcher takes no --base")
    refused([*cmd, "--method", "karcher", "--karcher-tol", "2"], capfd, ws,
            "--karcher-tol must be a number from 0 to 1, got 2")
    refused([*cmd, "--method", "karcher", "--karcher-max-iter", "-1"], capfd, ws,
            "--karcher-max-iter must be an integer from 0 to 10000")
    refused([*cmd, "--method", "simple", "--karcher-tol", "0.1"], capfd, ws,
            "--karcher-tol needs --method karcher")
    refused([*cmd, "--method", "nuslerp", "--nuslerp-flatten", "maybe"], capfd, ws,
            "unknown --nuslerp-flatten 'maybe'")

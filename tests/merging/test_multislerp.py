"""Multi-SLERP equals mergekit 0.1.5's own multislerp (1e-6) on random float64 tensors: N
models with and without a base, one model, colinear and opposite models, a zero model, the
weights at their ends; in small slices (as at size) as whole; antipodal balance refused."""

from __future__ import annotations

import pytest
import torch

from rotviz.errors import RotvizError
from rotviz.merging import method
from rotviz.merging.multislerp import multislerp_rows
from rotviz.merging.rows import whole

from .mergekit_refs import mk_multislerp

pytest.importorskip("mergekit")
TOL = 1e-6


def _rand(*shape, seed=0, n=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(n)]


def ours(tensors, weights, base=None, chunk=7):
    return whole(lambda src: multislerp_rows(src, weights), tensors, base, chunk=chunk)


def _diff(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("based", [False, True])
@pytest.mark.parametrize("shape", [(6, 5), (4, 3, 2), (9,), ()])
def test_equals_mergekit(n, based, shape):
    *ts, base = _rand(*shape, seed=n, n=n + 1)
    weights = [0.2 + 0.3 * i for i in range(n)]
    base = base if based else None
    assert _diff(ours(ts, weights, base), mk_multislerp(ts, weights, base)) < TOL


@pytest.mark.parametrize("w", [0.0, 1.0, 0.25])
def test_pair_weights_at_their_ends(w):
    a, b = _rand(5, 4, seed=1, n=2)
    got = ours([a, b], [1 - w, w])
    assert _diff(got, mk_multislerp([a, b], [1 - w, w])) < TOL
    if w in (0.0, 1.0):
        assert _diff(got, (a, b)[int(w)]) < TOL


@pytest.mark.parametrize("case", ["colinear", "opposite-unequal", "opposite-equal", "zero"])
def test_edge_cases_equal_mergekit(case):
    a, c = _rand(5, 4, seed=2, n=2)
    b, ws = {"colinear": (2.5 * a, [0.3, 0.7]), "opposite-unequal": (-0.5 * a, [0.7, 0.3]),
             "opposite-equal": (-a, [0.5, 0.5]), "zero": (torch.zeros_like(a), [0.4, 0.6])}[case]
    assert _diff(ours([a, b], ws), mk_multislerp([a, b], ws)) < TOL
    if case == "opposite-equal":  # the weighted mean direction is zero: linear, as mergekit
        assert _diff(ours([a, b], ws), 0.5 * a - 0.5 * a) < TOL
    three = [a, b, c]
    assert _diff(ours(three, [*ws, 0.5]), mk_multislerp(three, [*ws, 0.5])) < TOL


def test_balanced_antipodes_of_three_are_refused():
    a, c = _rand(5, 4, seed=3, n=2)
    with pytest.raises(ValueError):
        mk_multislerp([a, -a, c], [0.5, 0.5, 0.0])
    with pytest.raises(RotvizError, match="weighted mean of the models' directions is zero"):
        ours([a, -a, c], [0.5, 0.5, 0.0])


def test_the_record_runs_as_its_definition():
    from rotviz.merging.combine import merge_job

    m = method("multislerp")
    assert m.at_size and m.base_optional and not m.needs_base and m.max_models is None
    a, b, base = _rand(6, 5, seed=9)
    job = merge_job(None, m, (0.6, 0.4), None, {})
    got = m.merge(job, "w", [a.float(), b.float()], base.float())
    assert got.dtype == torch.float32
    assert _diff(got, mk_multislerp([a, b], (0.6, 0.4), base)) < 1e-5


def test_the_default_pair_merged_on_the_sphere():
    """zoo:vit-digits-s3 and -s6 matched (seed), weight 0.5, digits test (397 images): two
    models at equal weights have one spherical mean, so Multi-SLERP and the Karcher mean give
    the same merge (0.3854; the simple average 0.3375); flattened NuSLERP is SLERP (0.3602)."""
    from pairs import default_pair, digits

    from rotviz.measures.merge import merge

    a, b = default_pair()
    r = {m: merge(a, b, m, "seed", digits()) for m in ("multislerp", "karcher", "nuslerp",
                                                       "slerp")}
    for name, other in (("karcher", "multislerp"), ("nuslerp", "slerp")):
        worst = max((r[name].state[k].double() - r[other].state[k].double()).abs().max().item()
                    for k in r[name].state)
        assert worst < 1e-5, (name, worst)
    assert r["multislerp"].acc == pytest.approx(0.3854, abs=1e-4)
    assert r["karcher"].acc == pytest.approx(0.3854, abs=1e-4)
    assert r["nuslerp"].acc == r["slerp"].acc == pytest.approx(0.3602, abs=1e-4)

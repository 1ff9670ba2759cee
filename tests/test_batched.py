"""Several points a pass (rotviz.evaluation.Evaluator.per_sample_many, torch.func.vmap over
stacked parameter sets): the same losses as one point at a time on every family, the same
planes, slices, paths and layer-wise barriers through the records' own code, and the rule that
picks how many points a pass takes (the model's work and the memory budget)."""

from __future__ import annotations

import numpy as np
import pytest
from pairs import default_pair, digits, synthetic_split

import rotviz.evaluation as evaluation
from rotviz.analysis.loss_grid import slice_at
from rotviz.analysis.paths import path_curve, path_point
from rotviz.evaluation import Evaluator, points_per_pass
from rotviz.match.endpoints import match_endpoints
from rotviz.measures.layerwise import layerwise_on
from rotviz.measures.plane import plane_on

ALPHAS = (0.25, 0.5, 0.9)


def test_a_batch_of_points_equals_one_at_a_time(family, loaded):
    """One small batch per family: three points of the path between two seeds, per sample
    (losses, correct, counts) and their task metrics, to 1e-6."""
    a, b = loaded(family, 0), loaded(family, 1)
    ev = Evaluator(a, synthetic_split(a, 6))
    pa, pb = ev.params(a.state), ev.params(b.state)
    sets = [path_point(pa, pb, al) for al in ALPHAS]
    scored_one: list = []
    one = [ev.per_sample(s, scored_one) for s in sets]
    scored_many: list = []
    many = ev.per_sample_many(sets, scored_many)
    assert not ev.unbatchable, f"{family}: vmap could not run the module"
    losses = [p[0].sum() / p[2].sum() for p in one]
    assert len(set(np.round(losses, 6))) == len(ALPHAS)  # three different points
    for (lo, co, no), (lm, cm, nm) in zip(one, many, strict=True):
        assert np.abs(lo - lm).max() <= 1e-6 * max(1.0, np.abs(lo).max())
        assert abs(lo.sum() / no.sum() - lm.sum() / nm.sum()) <= 1e-6
        assert np.array_equal(no, nm)
        assert np.array_equal(co, cm)
    for s1, s2 in zip(scored_one, scored_many, strict=True):  # F1 and the like
        assert s1.keys() == s2.keys()
        assert all(abs(s1[m] - s2[m]) <= 1e-6 for m in s1)


@pytest.fixture(scope="module")
def vit_pair(loaded):
    a, b = loaded("vit", 0), loaded("vit", 1)
    return match_endpoints(a, b, "seed"), synthetic_split(a, 8)


def _one_at_a_time(monkeypatch) -> None:
    monkeypatch.setattr(evaluation, "MAX_POINTS_PER_PASS", 1)


def test_the_records_evaluate_several_points_a_pass_alike(vit_pair, monkeypatch):
    """The plane, a slice, a path and the layer-wise barriers of a tiny ViT pair, batched
    (points_per_pass > 1 for it on the CPU) and one point at a time: the same losses (1e-6)."""
    ends, split = vit_pair
    ev = Evaluator(ends.anchor, split)
    assert points_per_pass(ev, 9) == 9

    def run() -> list:
        pl = plane_on(ends, split, grid=3)
        sl = slice_at(ends.anchor, split, dims=2, grid=3)
        pa, pm = ev.params(ends.anchor.state), ev.params(ends.matched)
        curve = path_curve(ev, pa, pm, np.linspace(0, 1, 5))
        lw = layerwise_on(ends, split, points=3, compare=False)
        return [pl.loss, pl.point_loss["AB'"], sl.loss, curve["loss"], curve["barrier"],
                lw.loss, lw.cum_barrier]

    batched = run()
    _one_at_a_time(monkeypatch)
    assert points_per_pass(ev, 9) == 1
    alone = run()
    for got, want in zip(batched, alone, strict=True):
        if isinstance(want, dict):
            got, want = list(got.values()), list(want.values())
        np.testing.assert_allclose(np.asarray(got, float), np.asarray(want, float), rtol=0,
                                   atol=1e-6)
    assert np.ptp(np.asarray(batched[0])) > 1e-3  # the plane is not flat: points differ


def test_how_many_points_a_pass_takes(vit_pair):
    """1 for the default pair on the CPU (its pass over the digits is bound by arithmetic);
    for a tiny model as many as the memory budget holds, at most MAX_POINTS_PER_PASS."""
    a, _ = default_pair()
    assert points_per_pass(Evaluator(a, digits()), 441) == 1
    ends, split = vit_pair
    ev = Evaluator(ends.anchor, split)
    params = sum(v.numel() for k, v in ev.params(ends.anchor.state).items())
    rows = split.n * 17  # the tiny ViT's 16 patches and class token, one batch
    config = ends.anchor.config
    widest = max(config["intermediate_size"], 4 * config["hidden_size"])
    per_point = 4 * (params + 4 * rows * widest)
    share = evaluation.POINTS_MEMORY_SHARE
    assert points_per_pass(ev, 100, free=int(5 * per_point / share)) == 5
    assert points_per_pass(ev, 100, free=int(0.5 * per_point / share)) == 1
    assert points_per_pass(ev, 3, free=10**12) == 3
    assert points_per_pass(ev, 100, free=10**12) == evaluation.MAX_POINTS_PER_PASS
    assert points_per_pass(ev, 1, free=10**12) == 1

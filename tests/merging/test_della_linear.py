"""DELLA-linear (rotviz.merging.della_linear) against mergekit 0.1.5's `della_linear`: the
same drop as DELLA's (tests/merging/test_della.py tests its keep rates per rank and its
rescaling over many seeds, in this linear form), then the weighted sum, not divided by the
weights: equal to mergekit's with the same uniform numbers behind both masks (1e-6 relative),
density 0 and 1 and all-zero task vectors included."""

from __future__ import annotations

import pytest
import torch

from rotviz.merging.della import della
from rotviz.merging.registry import method
from tests.merging.mergekit_reference import mergekit_merge
from tests.merging.test_della import CASES, _models, _off, same_draws
from tests.merging.test_della import test_della_equals_mergekit_with_the_same_draws as _same

pytest.importorskip("mergekit", reason="mergekit==0.1.5 (the dev extra)")

TOL = 1e-6


@pytest.mark.parametrize("density,epsilon,rescale", CASES)
def test_della_linear_equals_mergekit_with_the_same_draws(monkeypatch, density, epsilon,
                                                         rescale):
    _same(monkeypatch, density, epsilon, rescale, method="della_linear", consensus=None)


def test_all_zero_task_vectors_give_the_base_and_weights_are_not_normalised(monkeypatch):
    models, base = _models(1)
    zero = [base.clone(), base.clone()]
    assert torch.equal(della(zero, base, (0.4, 0.9), "w", 0.5, 0.2, consensus=None), base)
    same_draws(monkeypatch, base.shape, 3)
    ws = (2.0, 1.0, 1.0)  # summed as given (mergekit's normalize off)
    theirs = mergekit_merge("della_linear", models, base, ws, density=1.0)
    ours = della(models, base, ws, "w", 1.0, consensus=None)
    assert _off(ours, theirs) < TOL
    plain = base + sum(w * (m - base) for w, m in zip(ws, models, strict=True))
    assert _off(ours, plain) < TOL


def test_record_says_mergekit_name_defaults_and_runs_at_size():
    m = method("della_linear")
    assert (m.needs_base, m.at_size, m.mergekit.method) == (True, True, "della_linear")
    defaults = {p.name: p.default for p in m.params}
    assert defaults == {"density": 1.0, "epsilon": 0.15, "seed": 0, "rescale": "l1",
                        "scale": 1.0}
    assert dict(m.mergekit.fixed) == {"normalize": False}
    assert dict(method("della").mergekit.fixed) == {"normalize": True}

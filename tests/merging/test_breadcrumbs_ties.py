"""Breadcrumbs with TIES (rotviz.merging.breadcrumbs_ties) equals mergekit 0.1.5's
`breadcrumbs_ties` on the same random tensors (1e-6), with ties in sign and zero entries."""

from __future__ import annotations

import pytest
import torch

from rotviz.merging.breadcrumbs import breadcrumbs, breadcrumbs_rows
from rotviz.merging.registry import method
from rotviz.merging.rows import whole
from tests.merging.mergekit_reference import mergekit_merge
from tests.merging.test_breadcrumbs import TOL, WEIGHTS, _models

pytest.importorskip("mergekit", reason="mergekit==0.1.5 (the dev extra)")


@pytest.mark.parametrize("density,gamma", [(0.5, 0.01), (0.9, 0.05), (0.0, 0.01), (1.0, 0.1),
                                           (0.7, 0.4)])
@pytest.mark.parametrize("lam", [1.0, 1.5])
def test_breadcrumbs_ties_equals_mergekit(density, gamma, lam):
    models, base = _models(3)
    ours = breadcrumbs(models, base, WEIGHTS, density, gamma, lam, consensus="sum")
    theirs = mergekit_merge("breadcrumbs_ties", models, base, WEIGHTS, density=density,
                            gamma=gamma, **{"lambda": lam})
    assert (ours - theirs).abs().max().item() < TOL


def test_ties_in_sign_and_zero_task_vectors_as_mergekit():
    """Two opposite task vectors of equal weight (exact in float64: distinct eighths about
    an integer base): every elected sign is a tie, which goes to +, so the merge is the base
    plus half the kept magnitudes; an all-zero third carries nothing."""
    g = torch.Generator().manual_seed(4)
    base = torch.randint(-4, 5, (12, 9), generator=g).double()
    sign = torch.randint(0, 2, (12, 9), generator=g).double() * 2 - 1
    d = sign * (torch.randperm(108, generator=g).double() + 1).reshape(12, 9) / 8
    models = [base + d, base - d, base.clone()]
    ws = (0.5, 0.5, 0.5)
    ours = breadcrumbs(models, base, ws, 0.8, 0.05, consensus="sum")
    theirs = mergekit_merge("breadcrumbs_ties", models, base, ws, density=0.8, gamma=0.05)
    assert (ours - theirs).abs().max().item() < TOL
    moved = ours - base
    assert int((moved != 0).sum()) == int(0.8 * 108)  # both kept the same entries
    assert (moved >= 0).all()  # the + vector's entries won every tie


def test_record_says_mergekit_name_and_runs_at_size():
    m = method("breadcrumbs_ties")
    assert (m.needs_base, m.at_size, m.mergekit.method) == (True, True, "breadcrumbs_ties")
    models, base = _models(5, (20, 13))
    def rows(src):
        return breadcrumbs_rows(src, WEIGHTS, 0.6, 0.02, consensus="sum")
    assert torch.equal(whole(rows, models, base, chunk=29), whole(rows, models, base))

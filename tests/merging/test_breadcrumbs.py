"""Model Breadcrumbs (rotviz.merging.breadcrumbs) equals mergekit 0.1.5's `breadcrumbs` on the
same random tensors (1e-6): outliers and small entries cut by magnitude, the edge cases
(density 0 and 1, gamma 0, more outliers than entries leave, all-zero task vectors) and the
slices of rows at size."""

from __future__ import annotations

import pytest
import torch

from rotviz.merging.breadcrumbs import breadcrumbs, breadcrumbs_rows
from rotviz.merging.rows import whole
from tests.merging.mergekit_reference import mergekit_merge

pytest.importorskip("mergekit", reason="mergekit==0.1.5 (the dev extra)")

TOL = 1e-6
WEIGHTS = (0.7, 0.5, 0.4)


def _models(seed: int = 0, shape=(24, 40), n: int = 3):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=g, dtype=torch.float64)
    return [base + torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(n)], base


@pytest.mark.parametrize("density,gamma", [(0.5, 0.01), (0.9, 0.05), (0.3, 0.0), (0.0, 0.01),
                                           (1.0, 0.2), (0.8, 0.5), (0.99, 0.02)])
@pytest.mark.parametrize("lam", [1.0, 0.7])
def test_breadcrumbs_equals_mergekit(density, gamma, lam):
    models, base = _models()
    ours = breadcrumbs(models, base, WEIGHTS, density, gamma, lam)
    theirs = mergekit_merge("breadcrumbs", models, base, WEIGHTS, density=density,
                            gamma=gamma, **{"lambda": lam})
    assert (ours - theirs).abs().max().item() < TOL


def test_breadcrumbs_keeps_the_middle_of_the_ranking():
    """One model, weight 1, about a zero base: the merge is the task vector with its top
    int(gamma n) and its bottom n - int(density n) - int(gamma n) entries set to zero."""
    d = torch.randperm(100, generator=torch.Generator().manual_seed(1)).double() + 1.0
    out = breadcrumbs([d], torch.zeros(100, dtype=torch.float64), (1.0,), 0.6, 0.1)
    kept = out != 0
    assert int(kept.sum()) == 60
    assert d[kept].min().item() == 31.0 and d[kept].max().item() == 90.0


def test_all_zero_task_vectors_and_vectors_and_numbers_give_what_mergekit_gives():
    models, base = _models(shape=(7,))
    zero = [base.clone() for _ in models]
    for tensors in (zero, models, [m[:1] for m in models]):
        b = base[: tensors[0].numel()]
        ours = breadcrumbs(tensors, b, WEIGHTS, 0.5, 0.2)
        theirs = mergekit_merge("breadcrumbs", tensors, b, WEIGHTS, density=0.5, gamma=0.2)
        assert (ours - theirs).abs().max().item() < TOL


def test_slices_of_rows_equal_the_whole_tensor():
    """The cuts are of the whole tensor, found in passes over slices (as TIES's threshold): a
    merge read 37 entries at a time equals the merge of the tensor at once, bit for bit."""
    models, base = _models(2, (30, 11))
    def rows(src):
        return breadcrumbs_rows(src, WEIGHTS, 0.4, 0.05, 1.3)
    assert torch.equal(whole(rows, models, base, chunk=37), whole(rows, models, base))


@pytest.mark.parametrize("name,kw", [("breadcrumbs", {"density": 0.6, "gamma": 0.05}),
                                     ("breadcrumbs_ties", {"density": 0.4, "gamma": 0.1})])
def test_at_size_equals_in_memory(name, kw, tmp_path):
    """The fine-tuned demo merged at size (rotviz.atsize.merge, block by block) equals the
    in-memory merge (1e-6) and its evaluation (tests/test_merge_methods.py's check)."""
    from tests.test_merge_methods import test_streamed_merge_equals_the_in_memory_one as sized

    sized(name, kw, tmp_path)

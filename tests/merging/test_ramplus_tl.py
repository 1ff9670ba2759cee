"""RAM+ (tensor-local) equals mergekit 0.1.5's `ramplus_tl` on random tensors (1e-6), with
sparse task vectors (unique entries scaled by each model's gain), all-zero task vectors,
identical models and the ends of its parameters."""

from __future__ import annotations

import pytest
import torch

from rotviz.merging import method
from rotviz.merging.ram import ram
from rotviz.merging.ramplus_tl import ramplus_rows, ramplus_tl
from rotviz.merging.rows import held
from tests.merging.reference import BASE, SHAPES, TOL, randoms, refused, theirs, worst


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("r, alpha, epsilon", [(0.1, 0.2, 1e-5), (2.0, 5.0, 0.05),
                                               (0.5, 0.0, 0.0), (1.0, 1.0, 1.0)])
def test_ramplus_equals_mergekit(shape, r, alpha, epsilon):
    base, models = randoms(1, shape, n=3)
    ours = ramplus_tl(models, base, r, alpha, epsilon)
    assert worst(ours, theirs("ramplus_tl", models, base, r=r, alpha=alpha,
                              epsilon=epsilon)) < TOL


def test_unique_entries_are_scaled_by_the_gain_and_shared_ones_averaged():
    """Model 1 changes entries 0 (alone) and 2 (shared): rho = 1 / 1, capped at alpha 0.5,
    gain 1 + 2 x 0.5 = 2; model 2 changes 1 (alone) and 2: the same gain."""
    base = torch.zeros(5, dtype=torch.float64)
    m1 = torch.tensor([0.4, 0.0, 0.2, 1e-6, 0.0], dtype=torch.float64)
    m2 = torch.tensor([0.0, -0.3, 0.6, 0.0, 0.0], dtype=torch.float64)
    out = ramplus_tl([m1, m2], base, r=2.0, alpha=0.5)
    assert out.tolist() == pytest.approx([0.8, -0.6, 0.4, 0.0, 0.0], abs=1e-15)
    assert worst(out, theirs("ramplus_tl", [m1, m2], base, r=2.0, alpha=0.5)) < TOL
    assert worst(ramplus_tl([m1, m2], base, r=0.0), ram([m1, m2], base)) == 0.0  # r 0: RAM


def test_all_zero_task_vectors_identical_models_and_the_gain_over_slices():
    base, (m, n) = randoms(2, (40, 3), n=2)
    assert worst(ramplus_tl([base.clone(), base.clone()], base), base) == 0.0
    same = [m, m.clone(), m.clone()]
    assert worst(ramplus_tl(same, base), m) < 1e-12  # all shared: the mean, no gain
    assert worst(ramplus_tl(same, base), theirs("ramplus_tl", same, base)) < TOL
    # the counts span the whole tensor, not a slice: 4 rows a slice give the same merge
    sparse = [torch.where(torch.rand(40, 3, generator=torch.Generator().manual_seed(k),
                                     dtype=torch.float64) < 0.5, x, base) for k, x in
              enumerate((m, n))]
    sliced = torch.cat(list(ramplus_rows(held(sparse, base, chunk=12), 1.0, 0.7)))
    assert worst(sliced, theirs("ramplus_tl", sparse, base, r=1.0, alpha=0.7)) < TOL


def test_the_record():
    m = method("ramplus_tl")
    assert m.needs_base and m.at_size and m.mergekit.weight is None
    assert [(p.name, p.default, p.bound.lo, p.bound.hi) for p in m.params] == \
        [("ramplus_r", 0.1, 0.0, 10.0), ("ramplus_alpha", 0.2, 0.0, 10.0),
         ("ram_epsilon", 1e-5, 0.0, 1.0)]


@pytest.mark.parametrize("argv, text", [
    (["--method", "ramplus_tl"], "--method ramplus_tl needs --base MODEL"),
    (["--method", "ramplus_tl", "--ramplus-r=-1", *BASE], "--ramplus-r must be"),
])
def test_bad_input_is_one_line(capsys, argv, text):
    refused(argv, capsys, text)


def test_the_yaml(tmp_path):
    import yaml

    from rotviz.merging.mergekit import mergekit_config

    a, b, base = tmp_path / "a", tmp_path / "b", tmp_path / "base"
    cfg = yaml.safe_load(mergekit_config("ramplus_tl", {"ramplus_r": 0.3, "ramplus_alpha": 0.4,
                                                        "ram_epsilon": 0.01}, 0.5, a, b,
                                         base=base))
    assert cfg["merge_method"] == "ramplus_tl" and cfg["base_model"] == str(base)
    assert cfg["parameters"] == {"r": 0.3, "alpha": 0.4, "epsilon": 0.01}

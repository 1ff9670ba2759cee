"""RAM equals mergekit 0.1.5's `ram` on random tensors (1e-6), with sparse task vectors
(entries only one model changes kept whole), all-zero task vectors, identical models and the
ends of epsilon."""

from __future__ import annotations

import pytest
import torch

from rotviz.merging import method
from rotviz.merging.ram import ram
from tests.merging.reference import BASE, SHAPES, TOL, randoms, refused, theirs, worst


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("epsilon", [0.0, 1e-5, 0.05, 1.0])
def test_ram_equals_mergekit(shape, epsilon):
    base, models = randoms(1, shape, n=3)
    assert worst(ram(models, base, epsilon), theirs("ram", models, base, epsilon=epsilon)) < TOL


def test_unique_entries_are_kept_whole_and_shared_ones_averaged():
    base = torch.zeros(5, dtype=torch.float64)
    m1 = torch.tensor([0.4, 0.0, 0.2, 1e-6, 0.0], dtype=torch.float64)
    m2 = torch.tensor([0.0, -0.3, 0.6, 0.0, 0.0], dtype=torch.float64)
    out = ram([m1, m2], base)
    assert out.tolist() == pytest.approx([0.4, -0.3, 0.4, 0.0, 0.0], abs=1e-15)
    assert worst(out, theirs("ram", [m1, m2], base)) < TOL


def test_all_zero_task_vectors_and_identical_models():
    base, (m,) = randoms(2, (8, 3), n=1)
    assert worst(ram([base.clone(), base.clone()], base), base) == 0.0
    same = [m, m.clone(), m.clone()]
    assert worst(ram(same, base), m) < 1e-12
    assert worst(ram(same, base), theirs("ram", same, base)) < TOL


def test_the_record():
    m = method("ram")
    assert m.needs_base and m.at_size and m.mergekit.shared == {"ram_epsilon": "epsilon"}
    assert [(p.name, p.default, p.bound.lo, p.bound.hi) for p in m.params] == \
        [("ram_epsilon", 1e-5, 0.0, 1.0)]


@pytest.mark.parametrize("argv, text", [
    (["--method", "ram"], "--method ram needs --base MODEL"),
    (["--method", "ram", "--ram-epsilon", "2", *BASE],
     "--ram-epsilon must be a number from 0 to 1"),
    (["--method", "ram", "--ram-epsilon=-1e-5", *BASE], "--ram-epsilon must be"),
])
def test_bad_input_is_one_line(capsys, argv, text):
    refused(argv, capsys, text)


def test_the_yaml(tmp_path):
    import yaml

    from rotviz.merging.mergekit import mergekit_config

    a, b, base = tmp_path / "a", tmp_path / "b", tmp_path / "base"
    cfg = yaml.safe_load(mergekit_config("ram", {"ram_epsilon": 0.01}, 0.5, a, b, base=base))
    assert cfg["merge_method"] == "ram" and cfg["base_model"] == str(base)
    assert cfg["parameters"] == {"epsilon": 0.01}

"""SCE equals mergekit 0.1.5's `sce` on random tensors (1e-6), at the ends of select_topk,
with all-zero task vectors, ties in sign and in variance, identical models and tiny task
vectors (equal weights), whole and a slice of rows at a time."""

from __future__ import annotations

import pytest
import torch

from rotviz.merging import method
from rotviz.merging.rows import whole
from rotviz.merging.sce import sce, sce_rows
from tests.merging.reference import BASE, SHAPES, TOL, randoms, refused, theirs, worst


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("topk", [0.0, 0.01, 0.3, 0.5, 0.999, 1.0])
def test_sce_equals_mergekit(shape, topk):
    base, models = randoms(1, shape, n=3)
    assert worst(sce(models, base, topk), theirs("sce", models, base, select_topk=topk)) < TOL


def test_two_models_and_a_slice_at_a_time():
    base, models = randoms(2, (64, 40), n=2)
    ref = theirs("sce", models, base, select_topk=0.4)
    assert worst(sce(models, base, 0.4), ref) < TOL
    sliced = whole(lambda src: sce_rows(src, 0.4), models, base, chunk=100)  # 2 rows a slice
    assert worst(sliced, ref) < TOL


@pytest.mark.parametrize("topk", [0.0, 0.5, 1.0])
def test_all_zero_task_vectors_give_the_base(topk):
    base, _ = randoms(3, (9, 8))
    models = [base.clone(), base.clone()]
    out = sce(models, base, topk)
    assert worst(out, base) == 0.0
    assert worst(out, theirs("sce", models, base, select_topk=topk)) < TOL


def test_identical_models():
    """No entry varies: select_topk < 1 selects none (the base); 1 keeps the common vector."""
    base, (m,) = randoms(4, (6, 5), n=1)
    models = [m, m.clone(), m.clone()]
    assert worst(sce(models, base, 0.5), base) == 0.0
    assert worst(sce(models, base, 1.0), m) < 1e-12
    for k in (0.5, 1.0):
        assert worst(sce(models, base, k), theirs("sce", models, base, select_topk=k)) < TOL


def test_ties_in_sign_go_to_plus():
    """d1 = -d2 at an entry: the elected sign is + and d1 (positive) alone is taken there."""
    base = torch.zeros(4, dtype=torch.float64)
    d = torch.tensor([0.5, -0.5, 0.25, 0.0], dtype=torch.float64)
    models = [base + d, base - d]
    out = sce(models, base, 1.0)
    assert out.tolist() == [0.5, 0.5, 0.25, 0.0]
    assert worst(out, theirs("sce", models, base, select_topk=1.0)) < TOL


def test_tiny_task_vectors_weigh_equally():
    """Mean squares summing below 1e-6: weights 1/N (mergekit's), here the plain mean of
    the agreeing entries."""
    base, models = randoms(5, (20, 10), n=3, spread=1e-4)
    out = sce(models, base, 1.0)
    assert worst(out, theirs("sce", models, base, select_topk=1.0)) < TOL
    d = torch.stack([m - base for m in models])
    elected = torch.where(d.sum(0) >= 0, 1.0, -1.0)
    carry = (d.sign() == elected).double()
    plain = base + (d * carry).sum(0) / carry.sum(0).clamp(min=1e-6)
    assert worst(out, plain) < 1e-15


def test_ties_in_variance_keep_the_first_entries():
    """Equal variances at the threshold: exactly k entries are kept, the first ones."""
    base = torch.zeros(10, dtype=torch.float64)
    a = torch.tensor([1.0, 1, 1, 1, 2, 2, 2, 2, 3, 3], dtype=torch.float64)
    models = [base + a, base - a]  # variance a^2; k = floor(10 x 0.5) = 5
    out = sce(models, base, 0.5)
    # selected: both 3s (largest), then the first three 2s; then + elected (sum 0): d1 taken
    assert out.tolist() == [0, 0, 0, 0, 2, 2, 2, 0, 3, 3]


def test_the_record():
    m = method("sce")
    assert m.needs_base and m.at_size and m.mergekit.method == "sce"
    assert m.mergekit.shared == {"select_topk": "select_topk"} and m.mergekit.weight is None
    assert [(p.name, p.default, p.bound.lo, p.bound.hi) for p in m.params] == \
        [("select_topk", 1.0, 0.0, 1.0)]


@pytest.mark.parametrize("argv, text", [
    (["--method", "sce"], "--method sce needs --base MODEL"),
    (["--method", "sce", "--select-topk", "1.5", *BASE],
     "--select-topk must be a number from 0 to 1"),
    (["--method", "sce", "--select-topk", "-0.1", *BASE], "--select-topk must be"),
    (["--method", "ties", "--select-topk", "0.5", *BASE], "--select-topk needs --method sce"),
])
def test_bad_input_is_one_line(capsys, argv, text):
    refused(argv, capsys, text)


def test_the_yaml(tmp_path):
    """About the base, select_topk shared, no weights; another --weight than 0.5 refused."""
    import yaml

    from rotviz.errors import RotvizError
    from rotviz.merging.mergekit import mergekit_config

    a, b, base = tmp_path / "a", tmp_path / "b", tmp_path / "base"
    cfg = yaml.safe_load(mergekit_config("sce", {"select_topk": 0.3}, 0.5, a, b, base=base))
    assert cfg["merge_method"] == "sce" and cfg["base_model"] == str(base)
    assert cfg["parameters"] == {"select_topk": 0.3}
    assert cfg["models"] == [{"model": str(a)}, {"model": str(b)}]
    with pytest.raises(RotvizError, match="takes no weights"):
        mergekit_config("sce", {"select_topk": 0.3}, 0.3, a, b, base=base)
    with pytest.raises(RotvizError, match="give --base"):
        mergekit_config("sce", {"select_topk": 0.3}, 0.5, a, b)


def test_the_threshold_found_in_histogram_passes(monkeypatch):
    """A tensor too large to rank at once is ranked in passes over its bits (as the
    embedding of a 1B model is); made small here by lowering the limit."""
    import rotviz.merging.task_vectors as tv

    monkeypatch.setattr(tv, "COLLECT", 16)
    base, models = randoms(7, (60, 30), n=3)
    sliced = whole(lambda src: sce_rows(src, 0.37), models, base, chunk=90)
    assert worst(sliced, theirs("sce", models, base, select_topk=0.37)) < TOL

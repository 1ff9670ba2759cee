"""Arcee Fusion equals mergekit 0.1.5's `arcee_fusion` (the anchor its base) on random
tensors of at most a million entries (1e-6), matrices, vectors and scalars, with identical
models, and whole = a slice of rows at a time; the share of entries taken is the outliers'."""

from __future__ import annotations

import pytest
import torch

from rotviz.merging import method
from rotviz.merging.arcee_fusion import arcee_fusion, arcee_fusion_rows, importance, threshold
from rotviz.merging.rows import held, whole
from tests.merging.reference import BASE, SHAPES, TOL, randoms, refused, theirs, worst


@pytest.mark.parametrize("shape", [*SHAPES, (200, 64), (3, 1)])
@pytest.mark.parametrize("seed", [0, 1])
def test_arcee_fusion_equals_mergekit(shape, seed):
    _, (a, b) = randoms(seed, shape, n=2, spread=0.5)
    assert worst(arcee_fusion(a, b), theirs("arcee_fusion", [a, b])) < TOL


def test_slices_give_the_same_merge():
    _, (a, b) = randoms(3, (96, 50), n=2, spread=0.5)
    sliced = whole(arcee_fusion_rows, [a, b], None, chunk=120)  # 2 rows a slice
    assert worst(sliced, arcee_fusion(a, b)) == 0.0


def test_the_threshold_is_median_plus_one_and_a_half_iqr():
    _, (a, b) = randoms(4, (41, 30), n=2, spread=0.5)
    s = importance(a, b).expand_as(a).reshape(-1).sort().values
    n = s.numel()
    q1, med, q3 = (s[int(q * (n - 1))].item() for q in (0.25, 0.5, 0.75))
    t = threshold(held([a, b]))
    assert t == pytest.approx(med + 1.5 * (q3 - q1), rel=1e-15)
    taken = (arcee_fusion(a, b) != a).double().mean().item()
    assert taken == pytest.approx((s >= t).double().mean().item())
    assert 0.05 < taken < 0.12  # outliers only: 8.6% here


def test_identical_models_and_a_scalar():
    _, (a,) = randoms(5, (12, 9), n=1)
    assert worst(arcee_fusion(a, a.clone()), a) == 0.0
    x, y = torch.tensor(0.3, dtype=torch.float64), torch.tensor(-1.0, dtype=torch.float64)
    assert arcee_fusion(x, y).item() == -1.0 == theirs("arcee_fusion", [x, y]).item()


def test_the_record():
    m = method("arcee_fusion")
    assert not m.needs_base and m.at_size and m.max_models == 2 and m.params == ()
    assert m.mergekit.method == "arcee_fusion" and m.mergekit.base == "anchor"


def test_bad_input_is_one_line(capsys):
    refused(["--method", "arcee_fusion", *BASE], capsys, "--method arcee_fusion takes no --base")


def test_the_yaml(tmp_path):
    import yaml

    from rotviz.merging.mergekit import mergekit_config

    a, b = tmp_path / "a", tmp_path / "b"
    cfg = yaml.safe_load(mergekit_config("arcee_fusion", {}, 0.5, a, b))
    assert cfg["merge_method"] == "arcee_fusion" and cfg["base_model"] == str(a)
    assert "parameters" not in cfg and cfg["models"] == [{"model": str(a)}, {"model": str(b)}]


def test_slices_come_in_the_shapes_read():
    """The at-size writer takes each slice in the shape it was read in (rows), a vector's
    too, even one read in several slices."""
    for shape, chunk in (((30, 8), 40), ((100,), 32), ((), 8)):
        _, (a, b) = randoms(6, shape, n=2, spread=0.5)
        src = held([a, b], chunk=chunk)
        got = [s.shape for s in arcee_fusion_rows(src)]
        assert got == [m[0].shape for m, _ in src.slices()]
        assert worst(whole(arcee_fusion_rows, [a, b], None, chunk=chunk),
                     theirs("arcee_fusion", [a, b])) < TOL


def test_the_quartiles_found_in_histogram_passes(monkeypatch):
    import rotviz.merging.task_vectors as tv

    monkeypatch.setattr(tv, "COLLECT", 16)
    _, (a, b) = randoms(8, (60, 30), n=2, spread=0.5)
    sliced = whole(arcee_fusion_rows, [a, b], None, chunk=90)
    assert worst(sliced, theirs("arcee_fusion", [a, b])) < TOL


@pytest.mark.parametrize("tied", [False, True])
def test_the_quartiles_found_in_passes_are_exact(monkeypatch, tied):
    """With few entries gathered at once, the quartiles take histogram passes (shared by the
    three, then refined apart) before their bins' entries are ranked; with half the rows
    unchanged (s = 0 there), two quartiles share their bin in every pass."""
    import rotviz.merging.task_vectors as tv

    monkeypatch.setattr(tv, "COLLECT", 64)
    _, (a, b) = randoms(7, (300, 40), n=2, spread=0.5)
    if tied:
        b[::2] = a[::2]
    s = importance(a, b).reshape(-1).sort().values
    n = s.numel()
    q1, med, q3 = (s[int(q * (n - 1))].item() for q in (0.25, 0.5, 0.75))
    assert threshold(held([a, b], chunk=400)) == med + 1.5 * (q3 - q1)


def _counted(src):
    """`src` with its reads counted, and the passes they make."""
    from dataclasses import replace

    reads: list[tuple[int, int]] = []

    def read(lo, hi):
        reads.append((lo, hi))
        return src.read(lo, hi)

    return replace(src, read=read), reads


@pytest.mark.parametrize("tied", [False, True])
def test_a_sampled_guess_saves_the_gathering_pass_with_the_same_bits(monkeypatch, tied):
    """Where a sample of rows puts each quartile's bin, the first pass gathers those bins
    and the quartiles are ranked there: the threshold is one pass over the slices, not two,
    and equals the sorted importances' formula; with a third of the rows unchanged, the
    first quartile is 0, found by counting zeros. A guess that is wrong (a sample 1000x off)
    or whose entries outgrow its buffer leaves the quartiles to their passes: the same
    threshold, and the same merged bits."""
    import rotviz.merging.arcee_fusion as af
    import rotviz.merging.task_vectors as tv

    monkeypatch.setattr(tv, "COLLECT", 64)
    monkeypatch.setattr(af, "SAMPLE", 9600)  # one row in each of 32 runs: 1.6% of the rows
    monkeypatch.setattr(af, "GUESS_SHARE", 1)  # this small tensor's bins are wide (1/16)
    _, (a, b) = randoms(9, (2000, 300), n=2, spread=0.5)
    if tied:  # a third of the entries, spread over every row, as a fine-tune leaves them
        same = torch.rand(a.shape, generator=torch.Generator().manual_seed(9)) < 1 / 3
        b[same] = a[same]
    s = importance(a, b).reshape(-1).sort().values
    n = s.numel()
    q1, med, q3 = (s[int(q * (n - 1))].item() for q in (0.25, 0.5, 0.75))
    assert (q1 == 0.0) is tied
    src, reads = _counted(held([a, b], chunk=7500))  # 25 rows a slice: 80 slices
    assert threshold(src) == med + 1.5 * (q3 - q1)
    assert len(reads) == 32 + 80  # the sample's runs, then one pass
    want = whole(arcee_fusion_rows, [a, b], None, chunk=7500)

    sample = af._sample
    monkeypatch.setattr(af, "_sample", lambda src: [r * 1000 for r in sample(src)])
    src, reads = _counted(held([a, b], chunk=7500))
    assert threshold(src) == med + 1.5 * (q3 - q1)
    assert len(reads) >= 32 + 2 * 80
    assert torch.equal(whole(arcee_fusion_rows, [a, b], None, chunk=7500), want)

    monkeypatch.setattr(af, "_sample", sample)
    of = af._Guess.of.__func__

    def cramped(cls, *args):
        guess = of(cls, *args)
        guess.room = 1
        return guess

    monkeypatch.setattr(af._Guess, "of", classmethod(cramped))
    src, reads = _counted(held([a, b], chunk=7500))
    assert threshold(src) == med + 1.5 * (q3 - q1)
    assert len(reads) >= 32 + 2 * 80
    assert torch.equal(whole(arcee_fusion_rows, [a, b], None, chunk=7500), want)

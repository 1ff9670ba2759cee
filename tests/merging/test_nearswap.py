"""NearSwap equals mergekit 0.1.5's `nearswap` (the anchor its base) on random tensors
(1e-6), at t = 0 (the anchor), a t above every distance (the source), with equal entries
(|a - b| = 0) and identical models."""

from __future__ import annotations

import pytest
import torch

from rotviz.merging import method
from rotviz.merging.nearswap import nearswap
from tests.merging.reference import BASE, SHAPES, TOL, randoms, refused, theirs, worst


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("t", [0.0, 1e-4, 0.05, 0.2, 100.0])
def test_nearswap_equals_mergekit(shape, t):
    _, (a, b) = randoms(1, shape, n=2)
    assert worst(nearswap(a, b, t), theirs("nearswap", [a, b], t=t)) < TOL


def test_the_ends_and_equal_entries():
    _, (a, b) = randoms(2, (30, 7), n=2)
    assert worst(nearswap(a, b, 0.0), a) == 0.0
    assert worst(nearswap(a, b, 100.0), b) < 1e-15
    b2 = b.clone()
    b2[0] = a[0]  # equal entries: weight t / 1e-6 clipped to 1, either way the anchor's
    out = nearswap(a, b2, 0.05)
    assert worst(out[0], a[0]) == 0.0 and worst(out, theirs("nearswap", [a, b2], t=0.05)) < TOL
    assert worst(nearswap(a, a.clone(), 0.05), a) == 0.0
    # one entry by hand: |a - b| = 0.4, t = 0.1: a quarter of the way to b
    x = nearswap(torch.tensor([1.0]), torch.tensor([1.4]), 0.1)
    assert x.item() == pytest.approx(1.1, abs=1e-7)


def test_the_record():
    m = method("nearswap")
    assert not m.needs_base and m.at_size and m.max_models == 2
    assert m.mergekit.base == "anchor" and m.mergekit.shared == {"nearswap_t": "t"}
    assert [(p.name, p.default, p.bound.lo, p.bound.hi) for p in m.params] == \
        [("nearswap_t", 1e-4, 0.0, 100.0)]


@pytest.mark.parametrize("argv, text", [
    (["--method", "nearswap", "--nearswap-t", "-1"], "--nearswap-t must be a number from 0 to 100"),
    (["--method", "nearswap", *BASE], "--method nearswap takes no --base"),
])
def test_bad_input_is_one_line(capsys, argv, text):
    refused(argv, capsys, text)


def test_the_yaml(tmp_path):
    """mergekit's base model is the anchor, t shared, no weights."""
    import yaml

    from rotviz.merging.mergekit import mergekit_config

    a, b = tmp_path / "a", tmp_path / "b"
    cfg = yaml.safe_load(mergekit_config("nearswap", {"nearswap_t": 0.05}, 0.5, a, b))
    assert cfg["merge_method"] == "nearswap" and cfg["base_model"] == str(a)
    assert cfg["parameters"] == {"t": 0.05}
    assert cfg["models"] == [{"model": str(a)}, {"model": str(b)}]

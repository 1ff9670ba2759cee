"""Curves of models held in their stored dtype and interpolated block by block
(rotviz.analysis.sized) give the in-memory curve (rotviz.analysis.landscape.interpolate)."""

from __future__ import annotations

import shutil

import pytest

from rotviz.analysis.landscape import interpolate
from rotviz.analysis.sized import sized_curve, sized_loaded
from rotviz.checkpoint import Checkpoint, save_sharded
from rotviz.evaluation import split_for
from rotviz.match.streaming import open_streamed
from rotviz.models import load_model
from rotviz.zoo import registry as zoo


def _bf16_shards(name: str, dst):
    """The zoo model `name` in bfloat16, cut into 3 shards, with its other files."""
    src = zoo.path_of(name)
    ck = Checkpoint(src)
    state = {k: v.bfloat16() if v.is_floating_point() else v
             for k, v in ck.read(ck.keys()).items()}
    dst.mkdir()
    save_sharded(state, dst, sum(v.numel() * v.element_size() for v in state.values()) // 3)
    for f in src.iterdir():
        if f.is_file() and f.name not in ck.files and not f.name.endswith(".json.index"):
            shutil.copyfile(f, dst / f.name)
    return dst


@pytest.mark.parametrize("bf16", [False, True], ids=["f32", "bf16-shards"])
def test_sized_curve_equals_in_memory(bf16, tmp_path):
    refs = ([str(_bf16_shards(n, tmp_path / n)) for n in ("vit-digits-s3", "vit-digits-s6")]
            if bf16 else ["zoo:vit-digits-s3", "zoo:vit-digits-s6"])
    a, b = load_model(refs[0]), load_model(refs[1])
    ref = interpolate(a, b, split_for(a, "digits", "test"), None, 5)
    split = split_for(sized_loaded(open_streamed(refs[0])), "digits", "test")
    got = sized_curve(refs[0], refs[1], split, 5)
    assert max(abs(x - y) for x, y in zip(ref.loss, got.loss, strict=True)) <= 1e-5
    assert got.acc == ref.acc
    assert abs(got.barrier - ref.barrier) <= 1e-5 and got.barrier > 1.0  # a real ridge
    # both checkpoints held as stored: bf16 shards take half the bytes of float32 ones
    held = sum(open_streamed(r).checkpoint.nbytes for r in refs)
    assert got.held_bytes == held
    floats = sum(t.numel() for t in a.state.values() if t.is_floating_point())
    assert held <= (2 if bf16 else 4) * 2 * floats

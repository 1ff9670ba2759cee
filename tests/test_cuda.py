"""The same guarantees on a CUDA GPU: matching there keeps the function and reaches what the
CPU reaches, planted maps are recovered, and curves agree with the CPU's. Skipped without a
GPU (CI has none); run them on one with `pytest tests/test_cuda.py`."""

from __future__ import annotations

import pytest
import torch
from conftest import view_of

from rotviz.data.split import load_split
from rotviz.match.distances import distances, norm
from rotviz.match.engine import match
from rotviz.match.options import LearnOptions, MatchOptions
from rotviz.match.pipeline import match_models
from rotviz.measures.barrier import interpolate
from rotviz.sources.loading import load_model
from rotviz.symmetry import residual as rs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

F64 = torch.float64
WEIGHT = MatchOptions(heads=True, residual=True, rounds=6)


@pytest.fixture(scope="module")
def pair():
    return load_model("zoo:vit-digits-s3"), load_model("zoo:vit-digits-s6")


@pytest.mark.parametrize("options", [MatchOptions(), WEIGHT], ids=["seed", "weight"])
def test_matching_on_the_gpu_reaches_what_the_cpu_reaches(pair, options):
    a, b = pair
    cpu = match_models(a, b, options, "cpu")
    gpu = match_models(a, b, options, "cuda")
    assert gpu.report.max_output_diff <= 1e-4
    assert {v.device.type for v in gpu.state.values()} == {"cpu"}  # written back to the host
    assert abs(gpu.report.after.total - cpu.report.after.total) <= 1e-4 * cpu.report.after.total
    if options.residual:
        history = gpu.report.residual["objective"]
        assert all(y <= x * (1 + 1e-6) for x, y in zip(history, history[1:], strict=False))


@pytest.mark.parametrize("family", ["vit", "llama"])
def test_planted_residual_map_is_recovered_on_the_gpu(loaded, family):
    canon, _ = rs.canonicalise(view_of(loaded(family, 0, F64)).to(device="cuda"))
    image = rs.apply_residual(canon, rs.random_map(canon, seed=7).to("cuda"))
    out = match(canon, image, MatchOptions(ffn=False, attn=False, rescale=False,
                                           residual=True))
    assert distances(out.view, canon).total / norm(canon) <= 1e-5


def test_curves_on_the_gpu_agree_with_the_cpu(pair):
    a, b = pair
    test = load_split("digits", "test")
    cpu = interpolate(a, b, test, "seed", 11, device="cpu")
    gpu = interpolate(a, b, test, "seed", 11, device="cuda")
    assert max(abs(x - y) for x, y in zip(cpu.loss, gpu.loss, strict=True)) <= 1e-3
    assert abs(cpu.barrier - gpu.barrier) <= 1e-3


def test_learned_matching_on_the_gpu_keeps_the_function(pair):
    a, b = pair
    short = MatchOptions(residual=True, learned=True,
                         learn=LearnOptions(steps=20, eval_every=10))
    m = match_models(a, b, short, "cuda", data="digits")
    assert m.report.max_output_diff <= 1e-4
    info = m.report.learned
    assert info["val_barrier"] <= info["val_barrier_start"]


def test_streamed_matching_on_the_gpu_reaches_what_the_cpu_reaches(tmp_path):
    """Block by block from shards, solving on the GPU: the function kept, the same
    permutations and distances as on the CPU."""
    from rotviz.atsize.blocks import open_streamed
    from rotviz.match.at_size import match_streamed
    from rotviz.random_models import save_random_sharded
    from rotviz.sources.checkpoint import Checkpoint

    sizes = dict(layers=3, d=128, heads=8, kv_heads=2, ffn=384, vocab=300)
    a = save_random_sharded("llama", tmp_path / "a", seed=0, **sizes)
    b = save_random_sharded("llama", tmp_path / "b", seed=1, **sizes)
    reps = {}
    for dev in ("cpu", "cuda"):
        (tmp_path / dev).mkdir()
        reps[dev] = match_streamed(open_streamed(a), open_streamed(b), tmp_path / dev,
                                   MatchOptions(heads=True), dev)
    cpu, gpu = reps["cpu"], reps["cuda"]
    assert gpu.max_output_diff <= 1e-4 and gpu.stored_output_diff <= gpu.stored_tolerance
    assert [h.head_perm for h in gpu.layers] == [h.head_perm for h in cpu.layers]
    assert abs(gpu.after.total - cpu.after.total) <= 1e-5 * cpu.after.total
    assert len(Checkpoint(tmp_path / "cuda").files) >= 3

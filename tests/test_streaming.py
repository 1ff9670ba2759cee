"""Streamed matching (rotviz.match.at_size): checkpoints read block by block from safetensors
shards give what the in-memory path gives, on every family, in float32 and bfloat16; its
refusals are one line; an interrupted run leaves nothing behind; torchrun's processes give
what one process gives."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import forkserver
import numpy as np
import pytest
import torch
from conftest import DISTINCT
from safetensors.torch import load_file, save_file

from rotviz.arch import FAMILIES
from rotviz.atsize.blocks import open_streamed
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.match.at_size import match_streamed
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import match_models
from rotviz.random_models import save_random, save_random_sharded
from rotviz.sources.checkpoint import INDEX, Checkpoint
from rotviz.sources.loading import load_model
from rotviz.sources.running import stored_state
from rotviz.sources.shards import ShardWriter, copy_sharded, save_sharded

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """`sharded(family, seed, dtype)`: a tiny random model saved, then cut into 3+ shards."""
    root = tmp_path_factory.mktemp("sharded")
    cache: dict[tuple, Path] = {}

    def get(fam: str, seed: int, dtype: torch.dtype = torch.float32, **sizes) -> Path:
        key = (fam, seed, dtype, tuple(sorted(sizes.items())))
        if key not in cache:
            name = f"{fam}-{seed}-{str(dtype)[6:]}-{len(cache)}"
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            try:
                whole = save_random(fam, root / f"{name}-whole", seed=seed, layers=3, d=32,
                                    heads=4, ffn=64, dtype=dtype, **sizes)
            finally:
                hf_logging.enable_progress_bar()
            copy_sharded(whole, root / name, 3)
            cache[key] = root / name
        return cache[key]

    return get


# ---- the checkpoint reader and writer ----------------------------------------------------------


def test_shard_writer_round_trip(tmp_path):
    """Every dtype and shape (scalars, empty tensors) comes back bit for bit through shards
    that the safetensors library itself reads."""
    gen = torch.Generator().manual_seed(0)
    state = {
        "a": torch.randn(3, 4, generator=gen), "b": torch.randn(5, generator=gen).bfloat16(),
        "c": torch.arange(7), "d": torch.randn(100, 10, generator=gen).half(),
        "e": torch.tensor(1.5, dtype=torch.float64), "f": torch.zeros(0, 3),
        "g": torch.tensor([True, False]),
    }
    files = save_sharded(state, tmp_path, 1000)
    assert len([f for f in files if f.endswith(".safetensors")]) == 3
    index = json.loads((tmp_path / INDEX).read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size()
                                                  for t in state.values())
    back = {}
    for f in sorted(set(index["weight_map"].values())):
        back.update(load_file(str(tmp_path / f)))
    ck = Checkpoint(tmp_path)
    mine = ck.read(ck.keys())
    for k, t in state.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t), k
        assert mine[k].dtype == t.dtype and torch.equal(mine[k], t), k
    assert ck.read(["b"], torch.float32)["b"].dtype == torch.float32


def test_shard_writer_refuses_out_of_plan(tmp_path):
    w = ShardWriter(tmp_path, [("a", torch.float32, (2,)), ("b", torch.float32, (2,))], 100)
    with pytest.raises(RuntimeError, match="plan has a"):
        w.write("b", torch.zeros(2))
    w.write("a", torch.zeros(2))
    with pytest.raises(RuntimeError, match="never written"):
        w.close()


# ---- streaming equals in memory, on every family --------------------------------------------


def _close(x, y, path="", top=None):
    """Reports equal: the same keys, integers and strings; floats to 1e-5 (relative; most
    are bit-identical), singular values to 1e-5 of their head's largest (a small one is
    known to roundoff of the largest only). Why not bit for bit everywhere: BLAS rounds
    the last bit of a product by the memory alignment of its inputs, and transformers
    leaves some loaded tensors 4-byte aligned (ViT's, inside the mapped file) where tensors
    read by rotviz are 64-byte aligned; a float32 singular value then moves by ~1e-6 of
    itself. Eigen-angles are left out: near 180 degrees (a -1 eigenvalue pair) a
    1e-7 change of the rotation moves one by 0.05 degrees; the weights, which the rotations
    made, are compared to 1e-6 instead. The function checks' logit differences are roundoff
    themselves: compared to 1e-5 (float32) and a quarter of the tolerance (the stored
    dtype, whose rounding a last-bit change of a weight can flip)."""
    if top is None:
        top = {"tol": x.get("stored_tolerance") or 0.0}
    if isinstance(x, dict):
        assert set(x) == set(y), (path, set(x) ^ set(y))
        for k in x:
            if not str(k).endswith("_angles"):
                _close(x[k], y[k], f"{path}/{k}", top)
    elif isinstance(x, list) and x and "_singular" in path and isinstance(x[0], float):
        # one head's singular values: each known to roundoff of the largest
        scale = max(abs(v) for v in x)
        assert max(abs(u - v) for u, v in zip(x, y, strict=True)) <= 1e-5 * scale, path
    elif isinstance(x, list):
        assert len(x) == len(y), path
        for k, (u, v) in enumerate(zip(x, y, strict=True)):
            _close(u, v, f"{path}[{k}]", top)
    elif isinstance(x, float) and path.endswith("output_diff"):
        assert abs(x - y) <= (1e-5 if path == "/max_output_diff" else 0.25 * top["tol"]), \
            (path, x, y)
    elif isinstance(x, float):
        assert math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-9), (path, x, y)
    else:
        assert x == y, (path, x, y)


# Each family in one dtype, the two taking turns: the streamed reading, the casts and the
# writing in bfloat16 are the same code for every family, and each dtype still meets nine.
TURNS = [(f, (torch.float32, torch.bfloat16)[i % 2]) for i, f in enumerate(FAMILIES)]


@pytest.mark.parametrize(("family", "dtype"), TURNS,
                         ids=[f"{f}-{'bf16' if d == torch.bfloat16 else 'f32'}" for f, d in TURNS])
def test_streaming_equals_in_memory(family, dtype, sharded, tmp_path):
    a, s = sharded(family, 0, dtype), sharded(family, 1, dtype)
    assert len(Checkpoint(a).files) >= 3
    spec_heads = open_streamed(a).spec.inputs == "tokens"
    options = MatchOptions(heads=spec_heads)
    ref = match_models(load_model(a), load_model(s), options)
    out = tmp_path / "out"
    out.mkdir()
    rep = match_streamed(open_streamed(a), open_streamed(s), out, options)
    r1, r2 = ref.report.to_dict(), rep.to_dict()
    r1.pop("seconds"), r2.pop("seconds")
    _close(r1, r2)
    assert rep.max_output_diff < 1e-4
    if dtype == torch.bfloat16:
        assert r2["stored_dtype"] == "bfloat16"
        assert rep.stored_output_diff <= rep.stored_tolerance
    # the same permutations, exactly; the written weights are the in-memory ones, stored
    for h1, h2 in zip(ref.report.layers, rep.layers, strict=True):
        assert h1.head_perm == h2.head_perm and h1.ffn_moved == h2.ffn_moved
    written, stored = Checkpoint(out), Checkpoint(s)
    assert len(written.files) >= 3 and (out / "config.json").is_file()
    assert {k: e.dtype for k, e in written.entries.items()} == {
        k: e.dtype for k, e in stored.entries.items()}  # each tensor in its stored dtype
    want = stored_state(load_model(s), ref.state)
    got = load_model(out).state  # it loads as a model of its own, names as transformers'
    assert set(got) == set(want)
    for k, t in want.items():
        assert float((got[k].double() - t.double()).abs().max()) <= 1e-6 * max(
            1.0, float(t.double().abs().max())), k


def test_streaming_a_layer_subset_leaves_the_rest(sharded, tmp_path):
    a, s = sharded("llama", 0), sharded("llama", 1)
    out = tmp_path / "out"
    out.mkdir()
    rep = match_streamed(open_streamed(a), open_streamed(s), out, MatchOptions(layers=(1,)))
    assert [h.layer for h in rep.layers] == [1]
    src, got = Checkpoint(s), Checkpoint(out)
    for k in src.keys():
        same = torch.equal(src.read([k])[k], got.read([k])[k])
        assert same == (".layers.1." not in k or "norm" in k), k


# ---- weight matching (the residual map) streamed ------------------------------------------------

# tied by default; untied here
UNTIE = ("gpt2", "mistral", "qwen2", "gemma", "gemma2", "qwen3", "falcon")


def _weights_close(want: dict, got: dict, dtype: torch.dtype) -> float:
    """The largest difference of the written weights from the in-memory ones, relative to
    each tensor's scale. bfloat16: each value within one bfloat16 step (a 1e-7 change can
    round a weight the other way) or 1e-5 of the scale (values near zero)."""
    worst = 0.0
    for k, t in want.items():
        t, g = t.double(), got[k].double()
        err = (g - t).abs()
        scale = max(1.0, float(t.abs().max()))
        if dtype == torch.bfloat16:  # a step is 2^-8 to 2^-7 of the value
            assert bool((err <= 2.0 ** -7 * t.abs() + 1e-5 * scale).all()), k
        else:
            worst = max(worst, float(err.max()) / scale)
    return worst


@pytest.mark.parametrize("family, dtype", [
    *((f, torch.float32) for f in DISTINCT),  # mistral is llama under other names (ALIASES)
    *((f, torch.bfloat16) for f in ("llama", "gpt2", "bert")),  # one per residual group
], ids=lambda v: {torch.float32: "f32", torch.bfloat16: "bf16"}.get(v, v))
def test_streamed_weight_matching_equals_in_memory(family, dtype, sharded, tmp_path):
    """--residual streamed (one pass over the blocks per round) against the in-memory
    alternation, three rounds per phase, heads on where the model reads tokens: the same
    rounds, FFN and head permutations, objective history to 1e-6, report to 1e-5, function
    preserved, weights within 3e-5 of each tensor's scale (bfloat16: within one step).

    Why not 1e-6 as for the seed maps: the in-memory path turns its float32 tensors each
    round, the streamed one applies the composed maps (float64) to the stored weights; after
    a few rounds the per-head rotations solved on the two differ by roundoff amplified by
    nearly equal singular values. Measured: at most 2.5e-6 with the plain rounds (LLaMA, 17
    rounds); with joint steps on rotation streams, whose quasi-Newton updates carry such
    differences from step to step, 1.8e-5 (Qwen2, 3 rounds). Both paths now build their
    result from the composed maps (rotviz.match.residual._InMemory)."""
    sizes = {"tie": False} if family in UNTIE else {}
    a, s = sharded(family, 0, dtype, **sizes), sharded(family, 1, dtype, **sizes)
    options = MatchOptions(heads=open_streamed(a).spec.inputs == "tokens", residual=True,
                           rounds=3)
    out = tmp_path / "out"
    out.mkdir()
    try:
        ref = match_models(load_model(a), load_model(s), options)
    except RotvizError as e:  # a tied MLM head (RoBERTa's random model): both refuse alike
        with pytest.raises(RotvizError) as err:
            match_streamed(open_streamed(a), open_streamed(s), out, options)
        assert str(err.value) == str(e) and "tie_word_embeddings" in str(e)
        return
    rep = match_streamed(open_streamed(a), open_streamed(s), out, options)
    r1, r2 = ref.report.to_dict(), rep.to_dict()
    h1, h2 = r1["residual"].pop("objective"), r2["residual"].pop("objective")
    if len(h1) != len(h2):
        # a block's joint steps stop where a step's gain falls below a bar: objectives that
        # agree to 1e-10 (seen: Phi-3 on AVX-512, 29 steps in memory and 30 streamed) can
        # fall on either side of it; then one path takes a step more, and both end at the
        # same distance, with the function kept
        assert abs(len(h1) - len(h2)) == 1
        assert abs(h1[-1] - h2[-1]) / h1[-1] <= 1e-5, (h1[-1], h2[-1])
        assert rep.to_dict()["max_output_diff"] < 1e-4
        return
    assert max(abs(u - v) / u for u, v in zip(h1, h2, strict=True)) <= 1e-6
    for r in (r1, r2):  # the function checks' logit changes are roundoff of their own
        # (the last gain is a difference of nearly equal objectives: roundoff, amplified)
        r.pop("seconds"), r["residual"].pop("angles"), r["residual"].pop("last_gain")
        # the clock's, not the computation's; and the gains, differences of nearly equal
        # objectives (the objectives themselves are compared above)
        for k in ("seconds", "gain", "first_share"):
            r["residual"].pop(k)
        for x in r["residual"]["history"]:
            x.pop("seconds"), x.pop("gain"), x.pop("share")
        assert r.pop("max_output_diff") < 1e-4
        if dtype == torch.bfloat16:
            assert r.pop("stored_output_diff") <= r["stored_tolerance"]
    _close(r1, r2)
    assert r2["residual"]["group"] == r1["residual"]["group"]
    for x, y in zip(ref.report.layers, rep.layers, strict=True):
        assert x.head_perm == y.head_perm and x.ffn_moved == y.ffn_moved
    want = stored_state(load_model(s), ref.state)
    got = load_model(out).state
    assert set(got) == set(want)
    assert _weights_close(want, got, dtype) <= 3e-5


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_streamed_weight_matching_in_row_slices(family, sharded, tmp_path, monkeypatch):
    """Embeddings and output heads handled a few rows at a time (`SLICE` set to 100 elements
    here: each is read, canonicalised, measured, turned and written in slices of 3 rows,
    never whole) give the in-memory weight matching: orthogonal maps with the final norm
    folded into the head (LLaMA), centred maps with centred embeddings (GPT-2), permutations
    (BERT)."""
    import rotviz.match.at_size_residual as sr

    monkeypatch.setattr(sr, "SLICE", 100)
    sizes = {"tie": False} if family in UNTIE else {}
    a, s = sharded(family, 0, **sizes), sharded(family, 1, **sizes)
    assert sr.large_rest(open_streamed(s))  # the test's point: some tensors are sliced
    options = MatchOptions(residual=True, rounds=3)
    ref = match_models(load_model(a), load_model(s), options)
    out = tmp_path / "out"
    out.mkdir()
    rep = match_streamed(open_streamed(a), open_streamed(s), out, options)
    assert rep.residual["phase_rounds"] == ref.report.residual["phase_rounds"]
    h1, h2 = ref.report.residual["objective"], rep.residual["objective"]
    assert max(abs(u - v) / u for u, v in zip(h1, h2, strict=True)) <= 1e-6
    assert math.isclose(rep.after.total, ref.report.after.total, rel_tol=1e-6)
    assert rep.after.per_kind().keys() == ref.report.after.per_kind().keys()
    for k, v in ref.report.after.per_kind().items():
        assert math.isclose(rep.after.per_kind()[k], v, rel_tol=1e-5), k
    assert rep.max_output_diff < 1e-4
    want = stored_state(load_model(s), ref.state)
    assert _weights_close(want, load_model(out).state, torch.float32) <= 1e-5


def test_streamed_weight_matching_with_ffn_backoff(sharded, tmp_path):
    """--ffn-backoff streamed: the same rounds held and solved as in memory (where the FFN
    tensors lag behind the residual map; here every pass turns them), the same weights."""
    a, s = sharded("llama", 0), sharded("llama", 1)
    options = MatchOptions(residual=True, ffn_backoff=True)
    ref = match_models(load_model(a), load_model(s), options)
    out = tmp_path / "out"
    out.mkdir()
    rep = match_streamed(open_streamed(a), open_streamed(s), out, options)
    for key in ("phase_rounds", "ffn_held", "converged"):
        assert rep.residual[key] == ref.report.residual[key], key
    assert rep.residual["ffn_held"] > 0  # rounds held the FFN maps
    want = stored_state(load_model(s), ref.state)
    assert _weights_close(want, load_model(out).state, torch.float32) <= 1e-5


def test_streamed_weight_matching_to_convergence(sharded, tmp_path):
    """The default alternation (up to 50 rounds per phase, tol 1e-6) on LLaMA and on a layer
    subset of it: both paths converge in the same rounds to the same weights."""
    a, s = sharded("llama", 0), sharded("llama", 1)
    for layers in (None, (0, 2)):
        options = MatchOptions(heads=True, residual=True, layers=layers)
        ref = match_models(load_model(a), load_model(s), options)
        out = tmp_path / f"out-{layers}"
        out.mkdir()
        rep = match_streamed(open_streamed(a), open_streamed(s), out, options)
        assert rep.residual["phase_rounds"] == ref.report.residual["phase_rounds"]
        assert rep.residual["converged"] == ref.report.residual["converged"] == [True, True]
        assert sum(rep.residual["phase_rounds"]) > 4
        assert [h.layer for h in rep.layers] == [0, 1, 2] if layers is None else [0, 2]
        assert math.isclose(rep.after.total, ref.report.after.total, rel_tol=1e-6)
        want = stored_state(load_model(s), ref.state)
        assert _weights_close(want, load_model(out).state, torch.float32) <= 1e-5


# ---- refusals ------------------------------------------------------------------------------------


def _copy(folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(folder, dst)
    return dst


def test_refuses_missing_shard(sharded, tmp_path):
    m = _copy(sharded("llama", 0), tmp_path)
    (m / Checkpoint(m).files[1]).unlink()
    with pytest.raises(RotvizError, match="shard model-00002-of-0000.* is missing"):
        Checkpoint(m)


def test_refuses_index_that_does_not_match(sharded, tmp_path):
    m = _copy(sharded("llama", 0), tmp_path)
    index = json.loads((m / INDEX).read_text())
    name, first = next(iter(index["weight_map"].items()))
    other = next(f for f in index["weight_map"].values() if f != first)
    index["weight_map"][name] = other  # listed in a shard that does not hold it
    (m / INDEX).write_text(json.dumps(index))
    with pytest.raises(RotvizError, match="do not match their index"):
        Checkpoint(m)
    del index["weight_map"][name]  # held by a shard, listed nowhere
    (m / INDEX).write_text(json.dumps(index))
    with pytest.raises(RotvizError, match="does not list"):
        Checkpoint(m)


def test_refuses_mixed_dtypes_in_a_block(sharded, tmp_path):
    m = _copy(sharded("llama", 0), tmp_path)
    ck = Checkpoint(m)
    key = next(k for k in ck.keys() if k.endswith("layers.1.self_attn.k_proj.weight"))
    file = m / ck.entries[key].file
    tensors = load_file(str(file))
    tensors[key] = tensors[key].half()
    save_file(tensors, str(file))
    with pytest.raises(RotvizError, match="block model.layers.1 mix dtypes"):
        open_streamed(m)


def test_refuses_what_cannot_stream(sharded, saved, tmp_path, capsys):
    a, s = sharded("llama", 0), sharded("llama", 1)
    assert main(["match", str(a), str(s), "--out", str(tmp_path / "o"), "--act",
                 "--data", "pystdlib", "--max-memory", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "from data" in err and "--max-memory" in err
    bins = tmp_path / "bin"
    bins.mkdir()
    loaded = load_model(saved("llama", 0))
    shutil.copyfile(loaded.path / "config.json", bins / "config.json")
    torch.save(dict(loaded.state), bins / "pytorch_model.bin")
    assert main(["match", str(bins), str(bins), "--out", str(tmp_path / "o"),
                 "--max-memory", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "streaming reads safetensors only" in err
    assert not (tmp_path / "o").exists()


def test_cli_chooses_streaming_by_memory(sharded, tmp_path, capsys):
    a, s = sharded("gpt2", 0), sharded("gpt2", 1)
    assert main(["match", str(a), str(s), "--out", str(tmp_path / "mem")]) == 0
    assert "streamed" not in capsys.readouterr().out
    assert main(["match", str(a), str(s), "--out", str(tmp_path / "st"), "--max-memory",
                 "1MB"]) == 0
    assert "at size, a block at a time" in capsys.readouterr().out
    x, y = Checkpoint(tmp_path / "mem"), Checkpoint(tmp_path / "st")
    assert set(x.keys()) == set(y.keys())
    for k in x.keys():
        assert torch.allclose(x.read([k])[k], y.read([k])[k], atol=1e-6), k


# ---- interruption, processes, memory -------------------------------------------------------------


@pytest.fixture(scope="module")
def signal_pair(tmp_path_factory) -> tuple[Path, Path]:
    """A LLaMA-layout pair large enough for a signal to land while shards are written (read
    only: each signal's output goes to its own folder)."""
    root = tmp_path_factory.mktemp("signal-pair")
    return tuple(save_random_sharded("llama", root / n, seed=seed, layers=12, d=256, heads=8,
                                     ffn=1024, vocab=256) for n, seed in (("a", 0), ("s", 1)))


# What a streamed match uses, imported once by the fork server (tests/forkserver.py): torch,
# transformers and its LLaMA model, rotviz: about 4 CPU-s in each fresh interpreter.
IMPORTS = """
import torch, transformers  # noqa: F401
import transformers.models.llama.modeling_llama  # noqa: F401
import rotviz.cli, rotviz.match.at_size  # noqa: F401
"""


def test_a_signal_leaves_nothing(signal_pair, tmp_path):
    """Ctrl-C, or SIGTERM (what `timeout` and torchrun send), in the middle of a streamed
    match while it writes shards: exit 130 or 143, no output folder, no temporary sibling;
    the next run writes the output. Both signals in one test, their commands run by one
    interpreter (tests/forkserver.py; two tests would each start one)."""
    a, s = signal_pair
    with forkserver.serving(IMPORTS, _env()) as server:
        for sig, code, words in ((signal.SIGINT, 130, "interrupted; nothing was written"),
                                 (signal.SIGTERM, 143, "terminated; nothing was written")):
            folder = tmp_path / sig.name
            folder.mkdir()
            out = folder / "out"
            argv = ["match", str(a), str(s), "--out", str(out), "--max-memory", "0"]
            for attempt in range(3):  # on a busy machine the match may end before the signal
                err_file = tmp_path / f"{sig.name}-{attempt}.err"
                pid = forkserver.send(server, {"argv": argv, "err": str(err_file)})
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:  # wait until it is writing shards
                    tmp = [p for p in folder.iterdir() if p.name.startswith(".rotviz-tmp-")]
                    if tmp and any(f.suffix == ".safetensors" for d in tmp for f in d.rglob("*")):
                        break
                    time.sleep(0.05)
                else:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    pytest.fail("the streamed match never started writing")
                with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
                    os.kill(pid, sig)
                rc = forkserver.exit_code(server)
                err = err_file.read_text()
                if rc != 0:
                    break
                shutil.rmtree(out)  # it finished first (its output, written in its folder)
            assert rc == code, err
            assert words in err and "Traceback" not in err
            assert not out.exists()
            assert [p.name for p in folder.iterdir() if p.name.startswith(".rotviz")] == []
            if sig == signal.SIGINT:  # the rerun is the same for either signal
                assert main(argv) == 0  # the same command, in this process
                assert len(Checkpoint(out).files) >= 3


def test_torchrun_commands_equal_one_process_and_a_failing_rank_leaves_nothing(sharded,
                                                                             tmp_path):
    """Work dealt to 2 processes (gloo, CPU) gives one process's results, and a rank that
    fails stops the launch in one line per rank. The five commands share one torchrun launch
    (tests/torchrun_commands.py: each launch costs about 20 s of imports here); one process's
    side runs in this process.

    - A streamed match with weight matching: its blocks dealt by rank (each round's FFN and
      head solves; the residual map's cross terms are summed in block order on every rank and
      rank 0 solves the map, and decides every joint step): the shards and the report are bit
      for bit one process's, joint steps and stopping rule included (the clock aside).
    - The barrier curve in memory and at size (the match streamed too, the points built block
      by block), and a slice at size: the points shared by the ranks, gathered on rank 0,
      equal one process's to 1e-6.
    - Last, a match with a NaN in a block that rank 1 reads: rank 1 says so in the in-memory
      line and exits 2; rank 0 stops with one line too (torchrun's SIGTERM, or the collective
      whose peer has gone), and no output or temporary is left."""
    a, s = sharded("llama", 0, kv_heads=2), sharded("llama", 1, kv_heads=2)
    match = ["match", str(a), str(s), "--heads", "--residual", "--rounds", "3"]
    barrier = ["barrier", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
               "--match", "seed", "--points", "5"]
    runs = {"barrier": barrier, "barrier-at-size": [*barrier, "--max-memory", "0"],
            "slice-at-size": ["slice", "zoo:vit-digits-s3", "--data", "digits", "--dims", "1",
                              "--grid", "3", "--max-memory", "0"]}
    sizes = dict(layers=4, d=32, heads=4, ffn=64, kv_heads=2)
    bad_a = save_random_sharded("llama", tmp_path / "bad-a", seed=0, shards=2, **sizes)
    bad_s = save_random_sharded("llama", tmp_path / "bad-s", seed=1, shards=2, **sizes)
    bad = "model.layers.3.mlp.down_proj.weight"  # block 3: rank 1's share (1, 3)
    for f in sorted(bad_s.glob("*.safetensors")):
        state = load_file(str(f))
        if bad in state:
            state[bad][0, 0] = float("nan")
            save_file(state, str(f), metadata={"format": "pt"})
    logs = tmp_path / "logs"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node=2", "--log-dir", str(logs), "--redirects", "3",
              str(ROOT / "tests" / "torchrun_commands.py"),
              *match, "--out", str(tmp_path / "two"), "--report", str(tmp_path / "two.json"),
              "--then"]
    # several processes take the joint steps as one does (rotviz.match.at_size_residual)
    assert main([*match, "--out", str(tmp_path / "one"), "--report", str(tmp_path / "one.json"),
                 "--max-memory", "0"]) == 0
    for name, args in runs.items():
        assert main([*args, "--json", str(tmp_path / f"{name}-one.json")]) == 0
        launch += [*args, "--json", str(tmp_path / f"{name}-two.json"), "--then"]
    launch += ["match", str(bad_a), str(bad_s), "--out", str(tmp_path / "failed")]
    two = subprocess.run(launch, env=_env(), capture_output=True, text=True, timeout=600)
    assert two.returncode != 0
    out = {int(p.parent.name): p.read_text() for p in logs.rglob("stdout.log")}
    errs = {int(p.parent.name): p.read_text() for p in logs.rglob("stderr.log")}
    assert sorted(errs) == sorted(out) == [0, 1], errs
    # the failing command: one line on each rank, nothing written
    for rank, err in errs.items():
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rotviz: "), (rank, err)
    assert f"has NaN or Inf weights in {bad}" in errs[1]
    assert errs[1].startswith("rotviz: error: ")
    assert "nothing was written" in errs[0] or "NaN or Inf" in errs[0]
    assert not (tmp_path / "failed").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rotviz-")]
    # the commands before it: one process's results
    assert "2 processes" in out[0]
    x, y = Checkpoint(tmp_path / "one"), Checkpoint(tmp_path / "two")
    assert x.keys() == y.keys()
    for k in x.keys():  # bit-identical
        assert torch.equal(x.read([k])[k], y.read([k])[k]), k
    r1, r2 = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    for r in (r1, r2):
        r.pop("seconds"), r.pop("rotviz"), r["residual"].pop("seconds")
        for x in r["residual"]["history"]:
            x.pop("seconds")
    assert r1 == r2 and r1["residual"]["joint_steps"] > 0
    # rank 0 alone reports: two lone processes would each print every summary
    assert out[0].count("barrier [seed] on cpu") == 2 and out[1] == "", out
    assert out[0].count("slice of zoo:vit-digits-s3") == 1, out[0]
    keys = {"barrier": ("loss", "acc", "barrier"), "barrier-at-size": ("loss", "acc", "barrier"),
            "slice-at-size": ("loss", "acc", "centre_loss", "direction_norms")}
    for name, fields in keys.items():
        one, got = (json.loads((tmp_path / f"{name}-{w}.json").read_text())
                    for w in ("one", "two"))
        for k in fields:
            want, have = np.atleast_1d(one[k]), np.atleast_1d(got[k])
            assert want.shape == have.shape and want.size >= 1, (name, k)
            assert float(np.abs(want - have).max()) <= 1e-6, (name, k, one[k], got[k])
    assert len(json.loads((tmp_path / "barrier-one.json").read_text())["loss"]) == 5


# The peak is the kernel's high-water mark of the child's own address space (VmHWM):
# getrusage's ru_maxrss would also count this pytest process's resident memory, which the
# child inherits at the fork (3.4 GB reported for a 0.01 GB child of a 2.8 GB parent). BASE is
# the resident size once torch, transformers and rotviz are imported, before the match.
PEAK_SCRIPT = """
import sys
import torch, transformers  # noqa: F401
from rotviz.cli import main
from rotviz.memory import resident_now, resident_peak
base = resident_now()
rc = main(sys.argv[1:])
print("PEAK", resident_peak(), "BASE", base, flush=True)
sys.exit(rc)
"""


def _working_set(tmp_path, layers: int) -> tuple[int, int]:
    """(memory the streamed match of a random LLaMA-layout pair of `layers` layers used above
    its imports, what matching the pair in memory needs)."""
    from rotviz.atsize.need import pair_bytes_in_memory

    sizes = dict(layers=layers, d=1024, heads=16, ffn=2816, vocab=8000, kv_heads=4)
    a = save_random_sharded("llama", tmp_path / f"a{layers}", seed=0, shards=4, **sizes)
    s = save_random_sharded("llama", tmp_path / f"s{layers}", seed=1, shards=4, **sizes)
    out = tmp_path / f"out{layers}"
    res = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, "match", str(a), str(s),
                          "--out", str(out), "--max-memory", "0"],
                         env=_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "at size, a block at a time" in res.stdout
    assert Checkpoint(out).nbytes == Checkpoint(s).nbytes
    words = res.stdout.split()
    peak, base = (int(words[words.index(k) + 1]) for k in ("PEAK", "BASE"))
    return peak - base, pair_bytes_in_memory(str(a), str(s))


def test_streaming_memory_does_not_grow_with_depth(tmp_path):
    """Streamed matching holds a block at a time: a LLaMA-layout pair (d 1024, 16 heads in 4
    KV groups, FFN 2816, bfloat16 shards) of 5 layers needs 1.6 GB more than one of 1 layer
    when matched in memory, and its streamed match uses at most an eighth of that more memory
    above the imports (the kernel's high-water mark: 0.58-0.61 GB for 1 or 2 layers; for 4
    layers more, 0.02 GB more, and once, on a busy machine, 0.15 GB more: about one block of
    the pair in float32, the allocator's slack, while holding all the layers would add 1.6 GB).
    Why 1 and 5 layers (2 and 6 before): the same four layers apart, so the same need apart
    and bound, and one layer's peak is two layers' (measured 0.595 and 0.588 GB; 5 and 6
    layers 0.611 and 0.605 GB), for two layers' matching less (about 5 CPU-s). The peak
    against the in-memory need at TinyLlama-1.1B, LLaMA-1B and LLaMA-2-7B shapes is measured
    by bench/stream.py."""
    small, small_need = _working_set(tmp_path, 1)
    large, large_need = _working_set(tmp_path, 5)
    assert large_need - small_need > 1.5e9
    assert large - small < 0.125 * (large_need - small_need), (small, large)
    assert large < 0.25 * large_need, (large, large_need)


@pytest.mark.parametrize("fam, opts", [("gpt2", {}), ("llama", {}), ("timm-vit", {}),
                                       ("deberta-v2", {"lm": True}),
                                       ("bert", {"lm": True}),
                                       ("electra", {"lm": True})])  # projected, tied
def test_function_check_with_streamed_embeddings(fam, opts, sharded, tmp_path, monkeypatch):
    """Embeddings and output heads above `runtime.LARGE` elements load only while their
    module runs (tied heads read their embedding; a head that decodes with the embedding
    matrix outside its module falls back to holding them): with every tensor counted large,
    the check gives the in-memory numbers."""
    import rotviz.atsize.runtime as runtime

    a, s = sharded(fam, 0, **opts), sharded(fam, 1, **opts)
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(runtime, "LARGE", 1)
    rep = match_streamed(open_streamed(a), open_streamed(s), out, MatchOptions())
    ref = match_models(load_model(a), load_model(s), MatchOptions())
    assert abs(rep.max_output_diff - ref.report.max_output_diff) <= 1e-5
    assert rep.max_output_diff <= 1e-4

"""Curves of models held in their stored dtype and interpolated block by block
(rotviz.atsize.points) give the in-memory curve (rotviz.measures.barrier.interpolate), in
the library and through `rotviz barrier --max-memory`."""

from __future__ import annotations

import json
import shutil

import pytest

from rotviz import zoo_registry as zoo
from rotviz.atsize.blocks import open_streamed
from rotviz.atsize.landscape import sized_curve
from rotviz.atsize.points import sized_loaded
from rotviz.cli import main
from rotviz.data.reading import split_for
from rotviz.measures.barrier import interpolate
from rotviz.sources.checkpoint import Checkpoint
from rotviz.sources.loading import load_model
from rotviz.sources.shards import save_sharded


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


def _barrier(tmp_path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["barrier", *args, "--json", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("pair, extra", [
    (("zoo:gpt2-pystdlib-s0", "zoo:gpt2-pystdlib-s1"),
     ["--data", "text:CODE", "--match", "none", "--repeats", "3", "--seed", "2"]),
], ids=["gpt2-none-repeats"])
def test_cli_barrier_at_size_equals_in_memory(pair, extra, tmp_path, capsys):
    """`rotviz barrier --max-memory 0` on a language model, unmatched, with repeats: the pair
    evaluated block by block gives the in-memory curve (losses and accuracies to 1e-6,
    repeats' spreads and distances), saying how it ran. (The language model reads 30 kB of
    Python source as a text file; the default pair, matched, is every at-size record's
    generated test, tests/measures/test_every_record.py.)"""
    import inspect

    import rotviz.data.labelled

    code = tmp_path / "code.txt"
    code.write_text(inspect.getsource(rotviz.data.labelled)[:30000])
    extra = [e.replace("CODE", str(code)) for e in extra]
    args = [*pair, *extra, "--points", "5"]
    ref = _barrier(tmp_path, "mem", *args)
    assert "at size" not in capsys.readouterr().out
    got = _barrier(tmp_path, "size", *args, "--max-memory", "0")
    assert "at size: each point built block by block" in capsys.readouterr().out
    assert got.pop("held_bytes") > 0
    for r in (ref, got):
        for k in ("seconds", "match_seconds", "rotviz"):
            r.pop(k, None)
    assert set(ref) == set(got)
    for k, v in ref.items():
        w = got[k]
        if isinstance(v, list) and v and isinstance(v[0], float):
            assert max(abs(x - y) for x, y in zip(v, w, strict=True)) <= 1e-6, k
        elif isinstance(v, float):
            assert abs(v - w) <= 1e-6 * max(1.0, abs(v)), k
        elif k == "scores" or k == "mid_scores":
            assert v.keys() == w.keys(), k
        else:
            assert v == w, k
    if "--repeats" in extra:
        assert got["repeats"] == 3 and len(got["loss_std"]) == 5 and got["barrier_std"] > 0


def test_cli_barrier_at_size_refuses_data_matching(tmp_path, capsys):
    assert main(["barrier", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
                 "--match", "seed,act", "--max-memory", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "block by block" in err and "--max-memory" in err


def test_cli_merge_at_size_equals_in_memory(tmp_path, capsys):
    """`rotviz merge --max-memory 0`: the simple merge of the streamed-matched pair, built,
    evaluated and written block by block, is the in-memory merge: the same accuracies, losses
    to 1e-6, written weights to 1e-6 in the same names and dtypes. Statistics-based methods
    need whole models and are refused in one line."""
    args = ["merge", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
            "--match", "seed"]
    for name, extra in (("mem", []), ("size", ["--max-memory", "0"])):
        assert main([*args, "--out", str(tmp_path / name), "--json",
                     str(tmp_path / f"{name}.json"), *extra]) == 0
    assert "at size" in capsys.readouterr().out
    ref, got = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("mem", "size"))
    for k in ("acc", "anchor_acc", "source_acc", "match", "weight", "n", "method"):
        assert ref[k] == got[k], k
    for k in ("loss", "anchor_loss", "source_loss", "distance_before", "distance_after"):
        assert abs(ref[k] - got[k]) <= 1e-6 * max(1.0, abs(ref[k])), k
    x, y = Checkpoint(tmp_path / "mem"), Checkpoint(tmp_path / "size")
    assert x.keys() == y.keys() and (tmp_path / "size" / "config.json").is_file()
    for k in x.keys():
        assert x.entries[k].dtype == y.entries[k].dtype
        assert float((x.read([k])[k].double() - y.read([k])[k].double()).abs().max()) <= 1e-6
    assert main([*args, "--method", "fisher", "--max-memory", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--method simple" in err


def test_cli_plane_at_size_refuses_no_matching(capsys):
    """Without matching there is no second direction at size: a one-line refusal. (At size
    equals in memory for the plane: tests/measures/test_every_record.py.)"""
    assert main(["plane", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
                 "--grid", "5", "--match", "none", "--max-memory", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--match" in err


def test_a_pairs_distance_worked_out_beside_the_caller_is_the_same_bits(monkeypatch):
    """The distance outside the blocks of a pair not matched (`RestLater`, begun while an
    at-size merge works) is the same bits as `rest_cells` alone, whether its thread finished
    or was stopped after some slices (the caller sums the rest); its thread sums on one torch
    thread whatever the caller's count, leaves the caller's count alone, and is gone after."""
    import threading
    import time

    import torch

    from rotviz.match import at_size_checks as checks

    a, b = open_streamed("zoo:vit-digits-s3"), open_streamed("zoo:vit-digits-s6")
    ref = checks.streamed_distance(a, b).cells
    real, seen, go = checks._squared, [], threading.Event()

    def held(*args):
        if threading.current_thread().name.startswith("rotviz-distance"):
            seen.append(torch.get_num_threads())
            if len(seen) == 2:  # the second slice waits until the caller stops the thread
                assert go.wait(60)
        return real(*args)

    monkeypatch.setattr(checks, "_squared", held)
    threads = torch.get_num_threads()
    later = checks.RestLater(a, b)
    assert torch.get_num_threads() == threads
    for _ in range(600):
        if len(seen) >= 2:
            break
        time.sleep(0.1)
    later.stop.set()
    go.set()
    assert checks.streamed_distance(a, b, later).cells == ref
    assert len(later.sums) == 2 < len(later.todo) and seen == [1, 1]
    finished = checks.RestLater(a, b)
    finished.running.result()
    assert len(finished.sums) == len(finished.todo) and set(seen) == {1}
    assert checks.streamed_distance(a, b, finished).cells == ref
    assert not [t for t in threading.enumerate() if t.name.startswith("rotviz-distance")]

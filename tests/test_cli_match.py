"""`rotviz match` end to end: round trips for every family, and every kind of bad input.

Most runs call `rotviz.cli.main` in-process (a fresh python costs seconds for the torch and
transformers imports); one test runs the real `python -m rotviz`, twice, in a subprocess.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    ATTN_ROLES,
    FFN_ROLES,
    assert_state_equal,
    changed_keys,
    module_keys,
    view_of,
)
from safetensors.torch import load_file, save_file

from rotviz.cli import main
from rotviz.match.distances import distances
from rotviz.sources.loading import load_model
from rotviz.sources.running import forward, probe_inputs

ROOT = Path(__file__).resolve().parents[1]
REPORT_KEYS = {"options", "distance_before", "distance_after", "heads", "max_output_diff",
               "seconds"}


def _load_with_own_class(out: Path, source):
    """Load the written folder the way a user would: transformers' class from config.json."""
    if source.spec.source == "timm":
        return load_model(out).model
    import transformers

    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    cls = getattr(transformers, arch)
    assert cls is type(source.model)
    return cls.from_pretrained(str(out)).eval()


def _logits(model, source, inputs):
    with torch.no_grad():
        if source.spec.source == "timm":
            return model(inputs["pixel_values"])
        return model(**inputs).logits


def test_cli_round_trip(family, saved, loaded, tmp_path, capsys):
    a_dir, s_dir = saved(family, 0), saved(family, 1)
    out, rep_file = tmp_path / "matched", tmp_path / "r" / "report.json"
    rep_file.parent.mkdir()  # a file output's folder must exist (issue 43)
    rc = main(["match", str(a_dir), str(s_dir), "--out", str(out), "--report", str(rep_file),
               "--device", "cpu"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert captured.err == ""
    lines = captured.out.strip().splitlines()
    assert len(lines) == 1 and "distance" in lines[0] and "->" in lines[0]
    assert "max output difference" in lines[0]
    # the written folder loads with the source's own class and computes the same logits
    anchor, source = loaded(family, 0), loaded(family, 1)
    x = probe_inputs(source, n=3, seed=7)
    ours = _logits(_load_with_own_class(out, source), source, x)
    assert (ours - forward(source, x)).abs().max() <= 1e-4
    # ... and it sits closer to the anchor
    matched = load_model(out)
    before = distances(view_of(source), view_of(anchor)).total
    after = distances(view_of(matched), view_of(anchor)).total
    assert after < before
    report = json.loads(rep_file.read_text())
    assert REPORT_KEYS <= set(report)
    assert math.isclose(report["distance_before"]["total"], before, rel_tol=1e-6)
    assert math.isclose(report["distance_after"]["total"], after, rel_tol=1e-5)
    assert report["max_output_diff"] <= 1e-4
    assert f"{before:.4f} -> {after:.4f}" in lines[0]
    maps = view_of(source).dims.n_kv_heads  # one per key/value group (per head without GQA)
    assert len(report["heads"]) == 2 and len(report["heads"][0]["qk_scale"]) == maps


def test_cli_layer_subset_without_ffn(family, saved, loaded, tmp_path, capsys):
    out = tmp_path / "matched"
    rc = main(["match", str(saved(family, 0)), str(saved(family, 1)), "--out", str(out),
               "--layers", "0", "--no-ffn", "--device", "cpu"])
    assert rc == 0, capsys.readouterr().err
    source = loaded(family, 1)
    matched = load_model(out)
    view = view_of(source)
    changed = changed_keys(matched.state, source.state)
    assert changed and changed <= module_keys(view, [0], ATTN_ROLES)
    assert not changed & module_keys(view, [0, 1], FFN_ROLES)
    assert "[attn,rescale]" in capsys.readouterr().out


def test_cli_no_attn_no_rescale_keeps_attention(saved, loaded, tmp_path, capsys):
    out = tmp_path / "matched"
    rc = main(["match", str(saved("gpt2", 0)), str(saved("gpt2", 1)), "--out", str(out),
               "--no-attn", "--no-rescale"])
    assert rc == 0, capsys.readouterr().err
    source = loaded("gpt2", 1)
    changed = changed_keys(load_model(out).state, source.state)
    assert changed and changed <= module_keys(view_of(source), [0, 1], FFN_ROLES)


def test_pickled_checkpoint_loads(saved, loaded, tmp_path, capsys):
    """A pytorch_model.bin (no safetensors) loads with weights_only and can be matched."""
    for fam in ("bert", "timm-vit"):
        src = saved(fam, 1)
        d = tmp_path / f"{fam}-bin"
        d.mkdir()
        shutil.copy(src / "config.json", d / "config.json")
        torch.save(load_file(str(src / "model.safetensors")), d / "pytorch_model.bin")
        assert_state_equal(load_model(d).state, loaded(fam, 1).state)
        rc = main(["match", str(saved(fam, 0)), str(d), "--out", str(tmp_path / f"{fam}-out")])
        assert rc == 0, capsys.readouterr().err


# ---- bad input -------------------------------------------------------------------------------


def _expect_error(argv: list[str], capsys, *fragments: str) -> str:
    """Exit code 2, one line on stderr starting `rotviz: error:`, nothing written to --out."""
    out = Path(argv[argv.index("--out") + 1])
    capsys.readouterr()  # drop anything the fixtures printed
    rc = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert rc == 2, captured
    assert len(lines) == 1 and lines[0].startswith("rotviz: error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    for fragment in fragments:
        assert fragment.lower() in lines[0].lower(), (fragment, lines[0])
    return lines[0]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    ("family", "sizes", "fields"),
    [
        ("bert", {"d": 48}, ["hidden_size"]),
        ("bert", {"layers": 3}, ["num_hidden_layers"]),
        ("bert", {"heads": 8}, ["num_attention_heads"]),
        ("bert", {"ffn": 96}, ["FFN width only", "wider", "96 units vs 64"]),  # see test_widths
        ("gpt2", {"d": 48, "layers": 3}, ["n_embd", "n_layer"]),
        ("timm-vit", {"d": 48}, ["embed_dim"]),
    ],
)
def test_models_of_different_shape(saved, tmp_path, capsys, family, sizes, fields):
    argv = ["match", str(saved(family, 0)), str(saved(family, 1, **sizes)),
            "--out", str(tmp_path / "out")]
    _expect_error(argv, capsys, "differ", *fields)


def test_models_of_different_architecture(saved, tmp_path, capsys):
    argv = ["match", str(saved("gpt2", 0)), str(saved("bert", 1)), "--out", str(tmp_path / "o")]
    _expect_error(argv, capsys, "different architectures", "gpt2", "bert")
    argv = ["match", str(saved("vit", 0)), str(saved("timm-vit", 1)), "--out", str(tmp_path / "o")]
    _expect_error(argv, capsys, "vit", "timm-vit")


@pytest.mark.parametrize("model_type", ["mixtral", "t5"])
def test_unsupported_model_type(saved, tmp_path, capsys, model_type):
    bad = _copy(saved("bert", 1), tmp_path / model_type)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = model_type
    (bad / "config.json").write_text(json.dumps(cfg))
    argv = ["match", str(saved("bert", 0)), str(bad), "--out", str(tmp_path / "out")]
    _expect_error(argv, capsys, model_type, "supported", "gpt2", "bert", "roberta", "vit", "timm")


def test_remote_code_is_refused(saved, tmp_path, capsys):
    bad = _copy(saved("bert", 1), tmp_path / "remote")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (bad / "config.json").write_text(json.dumps(cfg))
    argv = ["match", str(saved("bert", 0)), str(bad), "--out", str(tmp_path / "out")]
    _expect_error(argv, capsys, "remote code")


def test_folder_without_a_model(saved, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(saved("bert", 1) / "config.json", no_weights / "config.json")
    anchor = str(saved("bert", 0))
    out = str(tmp_path / "out")
    _expect_error(["match", anchor, str(empty), "--out", out], capsys, "no model", "config.json")
    _expect_error(["match", anchor, str(no_weights), "--out", out], capsys, "no weights")
    _expect_error(["match", anchor, str(tmp_path / "missing"), "--out", out], capsys, "no model")
    _expect_error(["match", str(empty), anchor, "--out", out], capsys, "no model")


@pytest.mark.parametrize("family", ["bert", "timm-vit"])
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_weights_file(saved, tmp_path, capsys, family, damage):
    bad = _copy(saved(family, 1), tmp_path / "bad")
    f = bad / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes({"truncated": data[: len(data) // 2], "garbage": os.urandom(4096),
                   "empty": b""}[damage])
    argv = ["match", str(saved(family, 0)), str(bad), "--out", str(tmp_path / "out")]
    _expect_error(argv, capsys, "corrupt")


def test_corrupt_config(saved, tmp_path, capsys):
    bad = _copy(saved("gpt2", 1), tmp_path / "bad")
    (bad / "config.json").write_text('{"model_type": "gpt2", ')
    argv = ["match", str(saved("gpt2", 0)), str(bad), "--out", str(tmp_path / "out")]
    _expect_error(argv, capsys, "config.json")


@pytest.mark.parametrize("family", ["roberta", "timm-vit"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights(saved, tmp_path, capsys, family, value):
    bad = _copy(saved(family, 1), tmp_path / "bad")
    state = load_file(str(bad / "model.safetensors"))
    key = next(k for k in state if state[k].dim() == 2 and ("intermediate" in k or "fc1" in k))
    state[key] = state[key].clone()
    state[key][0, 0] = value
    save_file(state, str(bad / "model.safetensors"), metadata={"format": "pt"})
    argv = ["match", str(saved(family, 0)), str(bad), "--out", str(tmp_path / "out")]
    _expect_error(argv, capsys, "nan or inf", key)


class _Payload:
    """Unpickling this would create a file: proof that no code runs from a checkpoint."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("family", ["bert", "timm-vit"])
@pytest.mark.parametrize("payload", ["object", "list", "strings"])
def test_pickle_with_non_tensor_payload_is_refused(saved, tmp_path, capsys, family, payload):
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(saved(family, 1) / "config.json", bad / "config.json")
    marker = tmp_path / "code-ran"
    state = load_file(str(saved(family, 1) / "model.safetensors"))
    key = next(iter(state))
    obj = {"object": {**state, key: _Payload(marker)},
           "list": list(state.values()),
           "strings": {**state, key: "not a tensor"}}[payload]
    torch.save(obj, bad / "pytorch_model.bin")
    argv = ["match", str(saved(family, 0)), str(bad), "--out", str(tmp_path / "out")]
    _expect_error(argv, capsys, "pytorch_model.bin")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("layers", "fragment"),
    [("a-b", "malformed"), ("3-1", "malformed"), ("", "malformed"), ("1,,0", "malformed"),
     ("99", "out of range"), ("0-2", "out of range")],
)
def test_bad_layers(saved, tmp_path, capsys, layers, fragment):
    argv = ["match", str(saved("bert", 0)), str(saved("bert", 1)), "--out", str(tmp_path / "o"),
            "--layers", layers]
    _expect_error(argv, capsys, fragment, "--layers")


def test_existing_out_is_left_alone_on_error(saved, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    rc = main(["match", str(saved("bert", 0)), str(saved("gpt2", 1)), "--out", str(out)])
    assert rc == 2 and (out / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    capsys.readouterr()


# ---- the real command, in a fresh interpreter ---------------------------------------------

# Both commands run as `python -m rotviz` runs them (rotviz/__main__.py, by runpy), one after the
# other in one fresh interpreter: each interpreter pays seconds of CPU for the torch and
# transformers imports. The refusal runs first, so that its one line of stderr is counted with
# the imports' own output (BERT loads through transformers: all of its imports); each command's
# stdout and stderr are told apart by a line of their own written between them.
FRESH = """
import json, runpy, sys
codes = []
for argv in json.loads(sys.argv[1]):
    for f in (sys.stdout, sys.stderr):
        print("\\x00next", flush=True, file=f)
    sys.argv = ["rotviz", *argv]
    try:
        runpy.run_module("rotviz", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        codes.append(e.code)
    sys.stdout.flush(), sys.stderr.flush()
for f in (sys.stdout, sys.stderr):
    print("\\x00next", flush=True, file=f)
print(json.dumps(codes), flush=True)
"""
MARK = "\x00next\n"  # the line FRESH writes between commands


def _run(*commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Each command as `python -m rotviz` runs it, all in one fresh interpreter."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", FRESH, json.dumps(commands)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    outs, errs = done.stdout.split(MARK), done.stderr.split(MARK)
    assert len(outs) == len(errs) == len(commands) + 2, done.stderr[-3000:]
    assert outs[0] == errs[0] == ""  # nothing before the first command
    codes = json.loads(outs[-1])
    return [subprocess.CompletedProcess(c, rc, out, err) for c, rc, out, err
            in zip(commands, codes, outs[1:-1], errs[1:-1], strict=True)]


def test_subprocess_error_is_one_line(saved, loaded, tmp_path):
    """A refusal is one line on stderr, imports included, exit 2 and nothing written; then a
    round trip: a match writes one line and a model that gives the source's logits. (One test,
    named as tests/conftest.py's LONG_FIRST names it: two would each start an interpreter.)"""
    bad = tmp_path / "bad"
    out, rep = tmp_path / "matched", tmp_path / "report.json"
    proc, done = _run(
        ["match", str(saved("bert", 0)), str(saved("bert", 1, heads=8)), "--out", str(bad)],
        ["match", str(saved("gpt2", 0)), str(saved("gpt2", 1)), "--out", str(out),
         "--report", str(rep), "--layers", "0-1"])

    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rotviz: error: "), proc.stderr
    assert "num_attention_heads" in lines[0]
    assert proc.stdout == "" and not bad.exists()

    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("matched [ffn,attn,rescale]")
    assert REPORT_KEYS <= set(json.loads(rep.read_text()))
    source = loaded("gpt2", 1)
    x = probe_inputs(source, n=2, seed=3)
    assert (_logits(_load_with_own_class(out, source), source, x)
            - forward(source, x)).abs().max() <= 1e-4


def test_rounds_caps_the_alternation(saved, tmp_path, capsys):
    """--rounds bounds the work of --residual (each round costs about one seed matching on
    large models); a cap of 1 round per phase runs exactly 2 (without, then with heads)."""
    report = tmp_path / "r.json"
    argv = ["match", str(saved("bert", 0)), str(saved("bert", 1)), "--out", str(tmp_path / "o"),
            "--residual", "--heads", "--rounds", "1", "--tol", "0", "--stall", "0", "--report",
            str(report)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    res = json.loads(report.read_text())["residual"]
    assert res["phase_rounds"] == [1, 1]
    # each phase's one round still gained (tol 0): the summary says the cap ended it
    assert res["converged"] == [False, False]
    assert "(2 alternation rounds; ended by --rounds, still gaining more than --tol)" in out
    assert len(res["objective"]) == 1 + 2 * 2


def test_ffn_backoff_is_reported(saved, tmp_path, capsys):
    """--ffn-backoff: the summary says how many rounds held the FFN maps, the report has the
    options it ran with, and the written model keeps the function (checked before writing)."""
    report = tmp_path / "r.json"
    argv = ["match", str(saved("llama", 0)), str(saved("llama", 1)), "--out",
            str(tmp_path / "o"), "--residual", "--rounds", "8", "--tol", "0", "--stall", "0",
            "--ffn-backoff", "--report", str(report)]
    assert main(argv) == 0
    rep = json.loads(report.read_text())
    held = rep["residual"]["ffn_held"]
    assert held >= 1
    assert rep["residual"]["converged"] == [False]
    assert (f"(8 alternation rounds, {held} holding the FFN maps; ended by --rounds"
            in capsys.readouterr().out)
    assert rep["options"]["ffn_backoff"] is True and rep["options"]["rounds"] == 8
    assert rep["max_output_diff"] <= 1e-4


@pytest.mark.parametrize(("flag", "value", "fragment"),
                         [("--rounds", "0", "--rounds must be an integer from 1 to"),
                          ("--tol", "-1", "--tol must be a number from 0 to 1"),
                          ("--tol", "nan", "--tol must be a number from 0 to 1"),
                          ("--ffn-backoff", None, "--ffn-backoff needs --residual")])
def test_bad_rounds_and_tol(saved, tmp_path, capsys, flag, value, fragment):
    argv = ["match", str(saved("bert", 0)), str(saved("bert", 1)), "--out", str(tmp_path / "o")]
    argv += [flag] if value is None else ["--residual", flag, value]
    _expect_error(argv, capsys, fragment)
    assert not (tmp_path / "o").exists()

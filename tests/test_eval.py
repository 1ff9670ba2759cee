"""`rotviz eval`: the printed line, the JSON keys and values, and one clear line for bad input.

Most runs call `rotviz.cli.main` in-process; one runs `python -m rotviz eval` for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rotviz
from rotviz import zoo_registry as zoo
from rotviz.cli import main
from rotviz.data.split import load_split
from rotviz.evaluation import evaluate
from rotviz.sources.loading import load_model

ROOT = Path(__file__).resolve().parents[1]
# the documented keys (docs/cli.md, `rotviz eval`); an image classifier's task adds macro-F1
KEYS = {"rotviz", "loss", "acc", "n", "data", "split", "model", "device", "seconds", "task",
        "macro_f1"}


def _run(args, capsys) -> tuple[int, str, str]:
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("split", ["test", "val"])
def test_eval_json_has_the_documented_keys_and_true_values(tmp_path, capsys, split):
    f = tmp_path / "deep" / "eval.json"
    f.parent.mkdir()  # a file output's folder must exist (issue 43)
    rc, out, err = _run(["eval", "zoo:vit-digits-s3", "--data", "digits", "--split", split,
                         "--json", str(f), "--device", "cpu"], capsys)
    assert rc == 0, err
    got = json.loads(f.read_text())
    assert set(got) == KEYS
    want = evaluate(load_model("zoo:vit-digits-s3"), load_split("digits", split))
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)
    assert got["acc"] == pytest.approx(want["acc"], abs=1e-9)
    assert got["n"] == want["n"] == {"test": 397, "val": 200}[split]
    assert (got["data"], got["split"], got["model"], got["device"]) == (
        "digits", split, "zoo:vit-digits-s3", "cpu")
    assert got["seconds"] > 0
    assert got["task"] == "image" and got["macro_f1"] == pytest.approx(want["macro_f1"])
    assert got["rotviz"] == {"version": rotviz.__version__, "command": "eval"}
    assert f"loss {got['loss']:.4f}" in out and f"accuracy {got['acc']:.4f}" in out
    assert [p.name for p in f.parent.iterdir()] == ["eval.json"]  # no temporary left behind


def test_eval_of_a_directory_and_of_a_language_model(tmp_path, capsys):
    d = zoo.path_of("gpt2-pystdlib-s0")
    text = tmp_path / "code.py"
    text.write_text((ROOT / "rotviz" / "data" / "labelled.py").read_text())
    f = tmp_path / "lm.json"
    rc, out, err = _run(["eval", str(d), "--data", f"text:{text}", "--split", "train",
                         "--json", str(f)], capsys)
    assert rc == 0, err
    got = json.loads(f.read_text())
    full = load_model(d)
    want = evaluate(full, load_split(f"text:{text}", "train"))
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)
    assert got["acc"] == pytest.approx(want["acc"], abs=1e-9)
    assert got["model"] == str(d) and got["data"] == f"text:{text}"
    assert "next-character accuracy" in out
    assert got["acc"] > 0.4  # rotviz's own source is Python too: the model predicts it


def test_eval_leaves_the_thread_count_alone(capsys):
    before = torch.get_num_threads()
    assert main(["eval", "zoo:vit-digits-s6", "--data", "digits"]) == 0
    assert torch.get_num_threads() == before
    capsys.readouterr()


def test_eval_of_families_outside_the_lite_path(saved, tmp_path, capsys):
    d = saved("timm-vit", 0, labels=10)  # loaded by the ordinary loader (timm)
    f = tmp_path / "t.json"
    rc, _, err = _run(["eval", str(d), "--data", "digits", "--json", str(f)], capsys)
    assert rc == 0, err
    want = evaluate(load_model(d), load_split("digits", "test"))
    assert json.loads(f.read_text())["loss"] == pytest.approx(want["loss"], abs=1e-5)
    rc, _, err = _run(["eval", str(saved("bert", 0)), "--data", "digits"], capsys)
    assert rc == 2 and "is an image model" not in err and err.count("\n") == 1


def test_text_longer_than_the_models_positions(saved, capsys):
    rc, _, err = _run(["eval", str(saved("gpt2", 0, vocab=128)), "--data", "pystdlib"], capsys)
    assert rc == 2 and "takes at most 32" in err and err.count("\n") == 1


@pytest.mark.parametrize("args, needle", [
    (["zoo:vit-digits-s3", "--data", "pystdlib"], "is text data but"),
    (["zoo:gpt2-pystdlib-s0", "--data", "digits"], "is image data but"),
    (["zoo:vit-digits-s3", "--data", "mnist"], "unknown data 'mnist'"),
    (["zoo:vit-digits-s3", "--data", "digits", "--split", "dev"], "unknown split 'dev'"),
    (["zoo:nope", "--data", "digits"], "unknown zoo model 'nope'"),
    (["/no/such/model", "--data", "digits"], "no model directory"),
    (["zoo:vit-digits-s3", "--data", "text:/no/such.txt"], "does not exist"),
    (["zoo:vit-digits-s3", "--data", "digits", "--device", "tpu"], "unknown device"),
    (["zoo:vit-digits-s3", "--data", "digits", "--batch-size", "0"], "--batch-size"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, capsys):
    rc, out, err = _run(["eval", *args], capsys)
    assert rc == 2
    assert err.startswith("rotviz: error: ") and err.count("\n") == 1
    assert needle in err


def test_json_path_that_is_a_directory(tmp_path, capsys):
    rc, _, err = _run(["eval", "zoo:vit-digits-s3", "--data", "digits", "--json", str(tmp_path)],
                      capsys)
    assert rc == 2 and "is a folder; give a file name" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_cuda_without_a_gpu(capsys):
    rc, _, err = _run(["eval", "zoo:vit-digits-s3", "--data", "digits", "--device", "cuda"], capsys)
    assert rc == 2 and "no CUDA GPU" in err


def test_real_command_line(tmp_path):
    """`rotviz eval` in a fresh process gives the card's numbers, and takes the fast path: no
    transformers (nor sklearn, timm, streamlit, plotly, scipy) import to evaluate a zoo
    model."""
    f = tmp_path / "e.json"
    probe = subprocess.run(
        [sys.executable, "-c",
         "import sys; from rotviz.cli import main; main(['eval', 'zoo:vit-digits-s6', "
         f"'--data', 'digits', '--json', {str(f)!r}]); print(sorted(m for m in sys.modules "
         "if m.split('.')[0] in ('transformers', 'sklearn', 'timm', 'streamlit', 'plotly', "
         "'scipy')))"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # as the suite's workers run
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().splitlines()[-1] == "[]"
    got = json.loads(f.read_text())
    card = zoo.read_card("vit-digits-s6")
    assert got["loss"] == pytest.approx(card["test"]["loss"], abs=1e-4)
    assert got["acc"] == pytest.approx(card["test"]["acc"], abs=1e-4)


def test_short_sequences_attend_unfused_on_a_twin_of_the_model():
    """On the CPU the default pair (17 positions) is evaluated through a twin of its module
    that attends unfused: it shares every tensor with the cached model, whose config stays
    'sdpa', and gives the fused model's loss and logits to float32 roundoff. Long windows keep
    the model's own module."""


    from rotviz.data.reading import split_for
    from rotviz.data.split import load_split
    from rotviz.devices import SHORT_ATTENTION
    from rotviz.evaluation import Evaluator
    from rotviz.sources.loading import load_model

    model = load_model("zoo:vit-digits-s3")
    split = load_split("digits", "test").subset(64)
    ev = Evaluator(model, split, "cpu")
    assert ev.module is not model.model
    assert model.model.config._attn_implementation == "sdpa"
    assert ev.module.config._attn_implementation == "eager"
    ours = dict(ev.module.named_parameters())
    assert all(p.data_ptr() == ours[n].data_ptr() for n, p in model.model.named_parameters())
    x, y = next(iter(split.batches(64)))
    with torch.inference_mode():
        fused = model.model(pixel_values=x).logits
        twin = ev.logits(ev.params(model.state), x)
    assert float((fused - twin).abs().max()) < 1e-5
    loss = float(torch.nn.functional.cross_entropy(fused.double(), y))
    assert abs(ev.evaluate(ev.params(model.state))[0] - loss) < 1e-6
    long_text = load_model("zoo:gpt2-pystdlib-s0")
    text = split_for(long_text, "pystdlib", "test", seq_len=2 * SHORT_ATTENTION).subset(4)
    assert Evaluator(long_text, text, "cpu").module is long_text.model


def test_points_side_by_side_equal_points_in_turn_and_stop_cleanly():
    """With two torch threads a small model's points run on two single-threaded workers, each
    on its own twin of the module (functional_call swaps a module's parameters, so a shared
    module would mix two points' weights). The values equal those computed one by one to the
    bit, in order; the cached model is untouched; an exception from `done` (the app's Stop)
    cancels the rest and leaves the caller's thread count as it was."""
    from rotviz.evaluation import Evaluator, side_by_side

    model = load_model("zoo:vit-digits-s3")
    split = load_split("digits", "test").subset(48)
    ev = Evaluator(model, split, "cpu")
    theta = ev.params(model.state)
    before = {k: v.clone() for k, v in model.state.items()}
    gen = torch.Generator().manual_seed(0)
    direction = {k: 0.3 * torch.randn(v.shape, generator=gen) for k, v in theta.items()}

    def make(x: float) -> dict[str, torch.Tensor]:
        return {k: theta[k] + x * direction[k] for k in theta}

    xs = [i / 4 - 1 for i in range(9)]
    one_by_one = ev.evaluate_each(make, xs)  # the suite runs single-threaded: one worker
    assert side_by_side(ev) == 1
    torch.set_num_threads(2)
    try:
        assert side_by_side(ev) == 2
        seen: list[int] = []
        both = ev.evaluate_each(make, xs, seen.append)
        assert both == one_by_one and seen == list(range(1, 10))
        assert len({round(v[0], 6) for v in both}) == 9  # nine different points, not one

        def stop(k: int) -> None:
            if k == 3:
                raise KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            ev.evaluate_each(make, xs, stop)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert all(torch.equal(before[k], v) for k, v in model.state.items())


def test_two_threads_on_one_cached_model_each_get_their_own_points():
    """The app's sessions share a cached model; functional_call swaps its parameters while it
    runs, so without the module's lock (rotviz.sources.base.running_lock) two threads would
    each compute with a mix of both parameter sets. Each thread's values equal the serial
    ones to the bit."""
    import threading

    from rotviz.evaluation import Evaluator

    model = load_model("zoo:vit-digits-s3")
    split = load_split("digits", "test").subset(48)
    ev = Evaluator(model, split, "cpu")
    theta = ev.params(model.state)
    points = [{k: (1 + s) * v for k, v in theta.items()} for s in (0.0, 0.5)]
    serial = [ev.evaluate(p) for p in points]
    got: dict[int, list] = {0: [], 1: []}

    def worker(i: int) -> None:
        for _ in range(6):
            got[i].append(ev.evaluate(points[i]))
    threads = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert serial[0] != serial[1]
    assert got[0] == [serial[0]] * 6 and got[1] == [serial[1]] * 6

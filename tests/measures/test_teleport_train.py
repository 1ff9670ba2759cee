"""rotviz teleport_train: seeded (the same call twice gives identical histories); with K
past the last step the teleport run is the plain run exactly; each teleport keeps the train
loss on its examples (1e-5 relative) and raises the gradient norm there; the final test
loss and accuracy equal rotviz.evaluation's on the returned states (1e-6); the fresh init
touches neither the caller's RNG nor the loaded model; bad input is one line, exit 2."""

from __future__ import annotations

import json

import pytest
import torch

from rotviz.cli import main

A = "zoo:vit-digits-s3"
SMALL = dict(steps=24, every=8, teleport_steps=3, teleport_examples=32, eval_every=8,
             optimizer="adam", lr=2e-3, batch_size=32)


@pytest.fixture(scope="module")
def digits():
    from rotviz.data.split import load_split
    from rotviz.sources.plain_torch import load_for_eval

    return (load_for_eval(A), load_split("digits", "train", 0).subset(256),
            load_split("digits", "test", 0).subset(128))


@pytest.fixture(scope="module")
def run(digits):
    from rotviz.measures.teleport_train import teleport_train

    model, train, test = digits
    return teleport_train(model, train, test, **SMALL)


def test_the_same_call_gives_identical_histories(run, digits):
    from rotviz.measures.teleport_train import teleport_train

    model, train, test = digits
    again = teleport_train(model, train, test, **SMALL)
    a, b = run.to_dict(), again.to_dict()
    for key in ("plain", "teleport"):
        assert a[key]["train_loss"] == b[key]["train_loss"]
        assert a[key]["evals"] == b[key]["evals"]
        strip = [{k: v for k, v in e.items() if k != "seconds"} for e in a[key]["events"]]
        assert strip == [{k: v for k, v in e.items() if k != "seconds"}
                         for e in b[key]["events"]]
    assert len(a["plain"]["train_loss"]) == 24
    assert [e["step"] for e in a["teleport"]["events"]] == [8, 16]  # never after the last
    assert a["plain"]["events"] == []
    # both runs start from one initialisation and see the same first batches
    assert a["plain"]["train_loss"][:8] == a["teleport"]["train_loss"][:8]
    assert a["teleport"]["train_loss"][8] != a["plain"]["train_loss"][8]


def test_every_past_the_last_step_is_the_plain_run(digits):
    from rotviz.measures.teleport_train import teleport_train

    model, train, test = digits
    r = teleport_train(model, train, test, **{**SMALL, "steps": 10, "every": 11})
    p, t = r.plain, r.teleport
    assert t["events"] == [] and p["train_loss"] == t["train_loss"]
    assert p["evals"] == t["evals"]
    assert p["final_test_acc"] == t["final_test_acc"]
    for k, v in r.states["plain"].items():
        assert torch.equal(v, r.states["teleport"][k]), k


def test_each_teleport_keeps_the_loss_and_raises_the_gradient_norm(run):
    events = run.teleport["events"]
    assert len(events) == 2
    for e in events:
        assert e["kept"] and e["orbit_steps"] >= 1
        assert abs(e["train_loss_after"] - e["train_loss_before"]) <= \
            1e-5 * e["train_loss_before"]
        assert e["loss_relative"] <= 1e-5 and e["logits_relative"] <= 1e-4
        assert e["grad_norm_after"] > 1.01 * e["grad_norm_before"]
        assert 1.0 < e["condition"] <= 30.0 + 1e-9


def test_a_teleport_keeps_the_loss_by_rotviz_evaluation(digits):
    """Independently of the event's own numbers: rotviz.evaluation's loss on the teleport's
    examples at the state before and after."""
    from rotviz.analysis.teleport_training import Schedule, teleport_once
    from rotviz.evaluation import evaluate

    model, train, _ = digits
    examples = train.subset(32)
    before = dict(model.state)
    after, e = teleport_once(model, before, examples, Schedule(10, 5, 3), "cpu")
    la, lb = (evaluate(model, examples, s)["loss"] for s in (before, after))
    assert e["kept"] and abs(lb - la) <= 1e-5 * la
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert moved > 1e-2  # it did move along the orbit
    assert e["grad_norm_after"] > e["grad_norm_before"]


def test_the_final_numbers_are_rotviz_evaluations(run, digits):
    from rotviz.evaluation import evaluate

    model, _, test = digits
    for key in ("plain", "teleport"):
        got = evaluate(model, test, run.states[key])
        assert getattr(run, key)["final_test_loss"] == pytest.approx(got["loss"], rel=1e-6)
        assert getattr(run, key)["final_test_acc"] == pytest.approx(got["acc"], abs=1e-6)
        assert getattr(run, key)["evals"][-1]["step"] == 24


def test_the_fresh_init_leaves_the_rng_and_the_model_alone(digits):
    from rotviz.analysis.teleport_training import fresh_state

    model, _, _ = digits
    keep = {k: v.clone() for k, v in model.state.items()}
    rng = torch.get_rng_state()
    a, b = fresh_state(model, 0), fresh_state(model, 0)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(model.state[k], keep[k]) for k in keep)
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = fresh_state(model, 1)
    w = "vit.layers.0.attention.q_proj.weight"
    assert not torch.equal(a[w], c[w]) and not torch.equal(a[w], keep[w])
    assert float(a[w].std()) == pytest.approx(0.02, rel=0.1)  # ViT's initializer_range


def test_the_cli_writes_the_json(tmp_path, capsys):
    js = tmp_path / "t.json"
    rc = main(["teleport_train", A, "--data", "digits", "--device", "cpu", "--steps", "6",
               "--every", "3", "--teleport-steps", "2", "--teleport-examples", "16",
               "--eval-every", "3", "--json", str(js)])
    said = capsys.readouterr()
    assert rc == 0, said.err
    assert "teleport_train (adam lr 0.002, fresh init, 6 steps, every 3)" in said.out
    d = json.loads(js.read_text())
    assert d["group"] == ["qk", "vo"] and d["moments"] == "reset"
    assert len(d["plain"]["train_loss"]) == 6 and len(d["teleport"]["events"]) == 1
    assert [e["step"] for e in d["plain"]["evals"]] == [0, 3, 6]


@pytest.mark.parametrize("args,says", [
    (["--group", "qk,vo,ffn-scale"], "not of this model's gelu FFN"),
    (["--every", "0"], "--every must be an integer from 1"),
    (["--steps", "0"], "--steps must be an integer from 1"),
    (["--optimizer", "lbfgs"], "--optimizer"),
    (["--init", "zeros"], "--init"),
])
def test_bad_input_is_one_line_and_exit_2(args, says, capfd, ws):
    from conftest import refused

    refused(["teleport_train", A, "--data", "digits", "--device", "cpu", "--steps", "2",
             "--teleport-examples", "4", *args], capfd, ws, says)

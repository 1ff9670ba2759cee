"""rotviz teleport: the teleported model keeps its function (logits 1e-4 relative, test loss
1e-6), sharp-max at least doubles the top eigenvalue, grad-max raises the gradient norm,
sharp-min lowers the top eigenvalue (on the zoo's trained digits ViT, few examples); the
reported eigenvalues are the dense Hessian's (a tiny float64 ViT, 1e-4); --out writes the
teleported model; bad input is one line, exit 2."""

from __future__ import annotations

import json

import pytest
import torch
from pairs import synthetic_split

from rotviz.cli import main
from rotviz.sources.loading import Loaded, load_model
from rotviz.sources.running import forward, probe_inputs

A = "zoo:vit-digits-s3"
SMALL = dict(layers=1, d=8, heads=2, ffn=16)  # 845 parameters: a dense Hessian in seconds
F64 = torch.float64


@pytest.fixture(scope="module")
def digits():
    from rotviz.data.split import load_split
    from rotviz.sources.plain_torch import load_for_eval

    return (load_for_eval(A), load_split("digits", "train", 0).subset(16),
            load_split("digits", "test", 0).subset(96))


@pytest.fixture(scope="module")
def runs(digits):
    """Each objective, a few steps on 16 train examples of the trained ViT: every Hessian
    product (Lanczos, trace, path) costs half of 32's, and the margins stay wide (top
    eigenvalue 26.5 -> 216 for sharp-max and -> 25.6 for sharp-min, gradient norm 0.180 ->
    0.465; at 32: 37.7 -> 363, 36.3, 0.325 -> 0.942)."""
    from rotviz.measures.teleport import teleport

    model, train, test = digits
    return {obj: teleport(model, train, test, obj, steps=4, trace_probes=2, iterations=20)
            for obj in ("grad-max", "sharp-max", "sharp-min")}


def _relative_logits(model: Loaded, a: dict, b: dict) -> float:
    x = probe_inputs(model, 8, 1)
    ya, yb = (forward(model, x, s, every=True).double() for s in (a, b))
    return float((ya - yb).abs().max() / ya.abs().max())


@pytest.mark.parametrize("objective", ["grad-max", "sharp-max", "sharp-min"])
def test_the_teleported_model_keeps_its_function(objective, runs, digits):
    model, _, _ = digits
    r = runs[objective]
    assert r.steps >= 1 and r.max_condition > 1.5  # it moved, well away from orthogonal
    assert _relative_logits(model, model.state, r.state) < 1e-4
    assert abs(r.loss_after - r.loss_before) <= 1e-6 * r.loss_before
    assert r.function_check["preserved"] and r.function_check["relative"] < 1e-4
    assert r.max_condition <= 30.0 + 1e-9
    assert len(r.conditions) == 4 and len(r.conditions[0]["qk"]) == 4  # blocks, KV groups
    # the path: the train loss flat, its first point the start
    assert r.path[0]["loss"] == pytest.approx(r.train_loss_before)
    assert all(abs(p["loss"] / r.path[0]["loss"] - 1) < 1e-5 for p in r.path)


def test_the_objectives_move_the_measures(runs):
    up, grad, down = runs["sharp-max"], runs["grad-max"], runs["sharp-min"]
    assert up.top_after >= 2 * up.top_before
    assert grad.grad_norm_after > 1.5 * grad.grad_norm_before
    assert down.top_after < 0.98 * down.top_before
    # same probes before and after: the trace moves with the curvature
    assert up.trace_after > up.trace_before
    assert all(r.top_before == pytest.approx(up.top_before) for r in runs.values())
    # what the orbit cannot move: the geodesic sharpness (Hide & Seek), same seeded directions
    for r in runs.values():
        assert r.geodesic_before > 0
        assert abs(r.geodesic_after - r.geodesic_before) <= 1e-4 * r.geodesic_before


def test_the_reported_eigenvalues_are_the_dense_hessians(saved):
    """A tiny float64 ViT: top_before and top_after equal the largest eigenvalue of the
    dense Hessian (Curvature.hvp on the identity's columns) at the original and at the
    teleported model, to 1e-4; the path's top eigenvalues too."""
    from rotviz.analysis.hvp import Curvature, dense_block
    from rotviz.evaluation import Evaluator
    from rotviz.measures.teleport import teleport

    tiny = load_model(saved("vit", 0, **SMALL), dtype=F64)
    train, test = synthetic_split(tiny, 12, 0), synthetic_split(tiny, 12, 1)
    r = teleport(tiny, train, test, "sharp-max", steps=3, trace_probes=0, iterations=100)
    assert r.steps >= 1 and r.state[next(iter(r.state))].dtype == F64

    def top(state) -> float:
        cur = Curvature(Evaluator(tiny, train), state, F64)
        h = dense_block(cur, torch.ones(cur.n, dtype=torch.bool))
        return float(torch.linalg.eigvalsh(h)[-1])

    before, after = top(tiny.state), top(r.state)
    assert r.top_before == pytest.approx(before, rel=1e-4)
    assert r.top_after == pytest.approx(after, rel=1e-4)
    assert r.path[-1]["top"] == pytest.approx(after, rel=1e-4)
    assert after > before
    assert _relative_logits(tiny, tiny.state, r.state) < 1e-10


def test_out_writes_the_teleported_model(tmp_path, capsys, digits):
    from rotviz.measures.teleport import teleport

    out, js = tmp_path / "moved", tmp_path / "t.json"
    rc = main(["teleport", A, "--data", "digits", "--device", "cpu", "--steps", "2",
               "--examples", "16", "--trace-probes", "0", "--iterations", "10",
               "--out", str(out), "--json", str(js)])
    said = capsys.readouterr()
    assert rc == 0, said.err
    assert "teleport (grad-max, qk,vo)" in said.out
    d = json.loads(js.read_text())
    assert d["steps"] == 2 and d["group"] == ["qk", "vo"] and d["split"] == "train"
    model, _, _ = digits
    from rotviz.data.split import load_split

    train = load_split("digits", "train", 0).subset(16)
    mem = teleport(model, train, load_split("digits", "test", 0), steps=2, trace_probes=0,
                   iterations=10)
    assert d["top_after"] == pytest.approx(mem.top_after, rel=1e-6)
    written = load_model(out)
    x = probe_inputs(model, 8, 2)
    a = forward(written, x, written.state).double()
    b = forward(model, x, mem.state).double()
    assert torch.equal(a, b)
    assert _relative_logits(model, model.state, written.state) < 1e-4


@pytest.mark.parametrize("args,says", [
    (["--group", "qk,vo,ffn-scale"], "not of this model's gelu FFN"),
    (["--group", "qk,rot"], "unknown symmetry group rot"),
    (["--steps", "0"], "--steps must be an integer from 1"),
    (["--objective", "flat"], "--objective"),
    (["--max-condition", "0.5"], "--max-condition"),
])
def test_bad_input_is_one_line_and_exit_2(args, says, capfd, ws):
    from conftest import refused

    refused(["teleport", A, "--data", "digits", "--device", "cpu", "--steps", "1",
             "--examples", "4", "--trace-probes", "0", *args], capfd, ws, says)


@pytest.mark.parametrize("family,groups", [("vit", ("qk", "vo")),
                                           ("llama", ("qk", "vo", "ffn-scale"))])
def test_the_groups_route_equals_the_third_order_pass(family, groups, saved):
    """d(v^T H v)/dX at 0, v fixed: the pullback at v of -2 H v (one product, what the path
    takes) equals the pullback at theta of the third-order pass, for any v (1e-6)."""
    from rotviz.analysis.hvp import Curvature
    from rotviz.analysis.loss_graph import LossGraph
    from rotviz.analysis.orbit import Orbit
    from rotviz.analysis.teleporting import _coordinate_grad, _Point, _pullback
    from rotviz.evaluation import Evaluator
    from rotviz.measures.teleport import _theta_grad

    sizes = SMALL if family == "vit" else dict(layers=1, d=16, heads=2, ffn=16)
    model = load_model(saved(family, 0, **sizes), dtype=F64)
    cur = Curvature(Evaluator(model, synthetic_split(model, 6, 0)), model.state)
    graph = LossGraph(cur)
    v = torch.randn(cur.n, generator=torch.Generator().manual_seed(0), dtype=F64)
    orbit = Orbit.of(model, groups)
    point = _Point(model.state, graph, 0.0, graph.loss, 0.0, v)
    fast = orbit.flat(_coordinate_grad(orbit, cur, point, "sharp-max"))
    slow = orbit.flat(_pullback(orbit, cur, model.state, _theta_grad(graph, "sharp-max", v)))
    assert float(slow.norm()) > 0
    assert float((fast - slow).norm()) <= 1e-6 * float(slow.norm())

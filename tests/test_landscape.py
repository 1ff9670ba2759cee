"""Interpolation curves, barriers and the loss plane: exact paths, acceptance on the default pair,
bad input, CLI."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from functools import cache

import numpy as np
import pytest
import torch
from conftest import clone_state

from rotviz.analysis.paths import _partition, loss_range_of
from rotviz.cli import main
from rotviz.data import Split, load_split
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator, barrier_of, evaluate
from rotviz.match.endpoints import match_endpoints
from rotviz.measures.barrier import interpolate
from rotviz.measures.plane import loss_plane
from rotviz.models import Loaded, forward, load_model, probe_inputs

# ---- shared helpers (imported by the other landscape/fusion/spectra tests) ----------


@cache
def default_pair_refs() -> tuple[str, str]:
    """The two `zoo:` references of the default pair (two digits ViTs, seeds 0 and 1)."""
    from rotviz.zoo_registry import default_pair as zoo_default_pair

    a, b = zoo_default_pair()
    return a, b


@cache
def default_pair() -> tuple[Loaded, Loaded]:
    a, b = default_pair_refs()
    return load_model(a), load_model(b)


@cache
def digits(split: str = "test") -> Split:
    return load_split("digits", split)


def synthetic_split(model: Loaded, n: int = 12, seed: int = 0) -> Split:
    """Random inputs of the model's kind with random labels of the right shape and range."""
    x = next(iter(probe_inputs(model, n, seed).values()))
    logits = forward(model, probe_inputs(model, 1, seed))
    n_classes = logits.shape[-1]
    gen = torch.Generator().manual_seed(seed + 1)
    shape = (n,) if logits.dim() == 2 else tuple(x.shape)
    y = torch.randint(0, n_classes, shape, generator=gen)
    from rotviz.evaluation import task_of

    task = task_of(model) or "text"  # a bare text model is scored on next-token labels
    return Split("synthetic", "test", task, x, y, n_classes, "" if task == "image" else "chars")


def assert_unchanged(model: Loaded, before: dict[str, torch.Tensor]) -> None:
    assert all(torch.equal(model.state[k], before[k]) for k in before)
    assert all(torch.equal(p, before[k]) for k, p in model.model.state_dict().items())


# ---- exactness ----------


def module_loss(model: Loaded, state: dict[str, torch.Tensor], split: Split) -> dict:
    """Evaluate `state` the plain way: load it into a copy of the module and call the module."""
    m = copy.deepcopy(model.model)
    m.load_state_dict(state)
    return evaluate(dataclasses.replace(model, model=m, state=dict(m.state_dict())), split)


def test_functional_call_path_equals_module_evaluation(family, loaded):
    a, b = loaded(family, 0), loaded(family, 1)
    before_a, before_b = clone_state(a.state), clone_state(b.state)
    split = synthetic_split(a)
    curve = interpolate(a, b, split, None, points=5, device="cpu")
    assert curve.alphas == [0.0, 0.25, 0.5, 0.75, 1.0]
    for alpha, loss, acc in zip(curve.alphas, curve.loss, curve.acc, strict=True):
        state = {k: torch.lerp(a.state[k], b.state[k], alpha) if v.is_floating_point() else v
                 for k, v in a.state.items()}
        ref = module_loss(a, state, split)
        assert abs(loss - ref["loss"]) <= 1e-6, (alpha, loss, ref)
        assert abs(acc - ref["acc"]) <= 1e-12
    assert abs(curve.loss[0] - evaluate(a, split)["loss"]) <= 1e-6
    assert abs(curve.loss[-1] - evaluate(b, split)["loss"]) <= 1e-6
    assert_unchanged(a, before_a)
    assert_unchanged(b, before_b)


def test_barrier_and_loss_range_definitions():
    alphas = [0.0, 0.25, 0.5, 0.75, 1.0]
    loss = [1.0, 2.0, 4.0, 3.0, 3.0]
    # line between endpoints: 1, 1.5, 2, 2.5, 3 -> excess 0, 0.5, 2, 0.5, 0
    assert barrier_of(alphas, loss) == pytest.approx(2.0)
    assert loss_range_of(loss) == pytest.approx(3.0)
    assert barrier_of([0, 0.5, 1], [2.0, 1.0, 0.5]) == pytest.approx(0.0)  # convex path: no barrier


def test_partition_is_disjoint_and_complete():
    parts = _partition(397, 4, seed=3)
    assert sorted(np.concatenate(parts).tolist()) == list(range(397))
    assert [len(p) for p in parts] == [100, 99, 99, 99]
    assert all(np.array_equal(p, q) for p, q in zip(parts, _partition(397, 4, seed=3), strict=True))


# ---- acceptance on the default pair ----------


def _check_matching_helps(a: Loaded, b: Loaded) -> None:
    none = interpolate(a, b, digits(), None, points=21)
    seed = interpolate(a, b, digits(), "seed", points=21)
    assert none.match == "none" and seed.match == "seed"
    assert len(none.alphas) == len(none.loss) == len(none.acc) == 21
    # both paths start and end at the same models: matching keeps the source's function
    assert seed.loss[0] == none.loss[0]
    assert abs(seed.loss[-1] - none.loss[-1]) < 1e-4
    assert seed.distance_after < seed.distance_before == pytest.approx(none.distance_after)
    assert seed.max_output_diff < 1e-4
    # the midpoint is the simple average
    assert none.mid_loss == none.loss[10] and none.mid_acc == none.acc[10]
    assert none.loss_range >= none.barrier > 1.0
    assert seed.barrier < none.barrier
    assert seed.mid_acc > none.mid_acc


def test_default_pair_matching_lowers_the_barrier_and_raises_midpoint_accuracy():
    """The seed paper's Figure 5 claim, on the zoo's default pair."""
    _check_matching_helps(*default_pair())


def test_repeats_report_spread_over_disjoint_subsets():
    a, b = default_pair()
    one = interpolate(a, b, digits(), "seed", points=5)
    four = interpolate(a, b, digits(), "seed", points=5, repeats=4, seed=1)
    assert four.loss == pytest.approx(one.loss, abs=1e-12)  # whole-split values are unchanged
    assert four.repeats == 4 and len(four.loss_std) == len(four.acc_std) == 5
    assert all(s > 0 for s in four.loss_std[1:-1]) and four.barrier_std > 0
    # the subset barriers average to roughly the whole-split barrier
    assert abs(four.barrier_mean - four.barrier) < 3 * four.barrier_std + 1e-9


def test_progress_plain_data_and_even_points():
    a, b = default_pair()
    calls = []
    c = interpolate(a, b, digits(), "ffn", points=4,
                    progress=lambda d, t, m: calls.append((d, t)))
    assert calls[-1][0] == calls[-1][1] == 5  # 4 alphas plus the midpoint, which is not among them
    assert [d for d, _ in calls] == [1, 2, 3, 4, 5]
    d = c.to_dict()
    json.dumps(d)
    for key in ("alphas", "loss", "acc", "barrier", "loss_range", "mid_acc", "match", "data",
                "split", "device", "seconds"):
        assert key in d
    assert d["device"] == "cpu" and d["data"] == "digits" and d["split"] == "test"
    assert d["mid_loss"] not in d["loss"]  # measured at 0.5, between the grid points
    assert min(d["loss"][1:3]) - 1 < d["mid_loss"]


# ---- the loss plane ----------


def test_plane_agrees_with_interpolation_and_distances():
    a, b = default_pair()
    split = digits().subset(200)
    plane = loss_plane(a, b, split, "seed", grid=7)
    none = interpolate(a, b, split, None, points=3)
    matched = interpolate(a, b, split, "seed", points=3)
    pts = plane.points
    assert pts["A"] == [0.0, 0.0] and pts["B"][1] == 0.0
    assert pts["B"][0] == pytest.approx(none.distance_before, rel=1e-6)
    assert math.hypot(*pts["B'"]) == pytest.approx(matched.distance_after, rel=1e-6)
    assert pts["AB"] == pytest.approx([pts["B"][0] / 2, 0.0])
    assert pts["AB'"] == pytest.approx([pts["B'"][0] / 2, pts["B'"][1] / 2])
    # |B - B'| from the plane's coordinates equals the true distance between the two sources
    ev = Evaluator(a, split)
    pb, pc = ev.params(b.state), ev.params(match_endpoints(a, b, "seed").matched)
    true_bb = math.sqrt(sum(float(((pb[k] - pc[k]).double() ** 2).sum()) for k in pb))
    assert math.dist(pts["B"], pts["B'"]) == pytest.approx(true_bb, rel=1e-5)
    # the named points equal the interpolation values
    for name, value in (("A", none.loss[0]), ("B", none.loss[-1]), ("AB", none.loss[1]),
                        ("B'", matched.loss[-1]), ("AB'", matched.loss[1])):
        assert plane.point_loss[name] == pytest.approx(value, abs=1e-5), name
    # the grid covers every point, and its row y = 0 is the unmatched path with A and B on nodes
    xs, ys = np.array(plane.xs), np.array(plane.ys)
    for x, y in pts.values():
        assert xs[0] < x < xs[-1] and ys[0] < y < ys[-1]
    iy = int(np.argmin(np.abs(ys)))
    assert abs(ys[iy]) < 1e-9
    ia, ib = int(np.argmin(np.abs(xs))), int(np.argmin(np.abs(xs - pts["B"][0])))
    assert abs(xs[ia]) < 1e-9 and abs(xs[ib] - pts["B"][0]) < 1e-6 and ib > ia
    on_line = interpolate(a, b, split, None, points=ib - ia + 1)
    row = plane.loss[iy][ia : ib + 1]
    np.testing.assert_allclose(row, on_line.loss, atol=1e-5)
    np.testing.assert_allclose(plane.acc[iy][ia : ib + 1], on_line.acc, atol=1e-9)
    assert len(plane.loss) == len(plane.acc) == 7 and all(len(r) == 7 for r in plane.loss)
    json.dumps(plane.to_dict())


def test_plane_without_matching_is_degenerate_but_drawn():
    a, b = default_pair()
    plane = loss_plane(a, b, digits().subset(50), None, grid=3)
    assert plane.degenerate
    assert plane.points["B'"] == pytest.approx(plane.points["B"])
    assert plane.point_loss["B'"] == plane.point_loss["B"]


def test_plane_of_identical_models_is_an_error():
    a, _ = default_pair()
    with pytest.raises(RotvizError, match="identical"):
        loss_plane(a, a, digits().subset(20), None, grid=3)


# ---- bad input ----------


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert msg and "\n" not in msg
    return msg


def test_bad_inputs_are_one_line_errors(loaded):
    a, b = default_pair()
    d = digits()
    empty = Split("digits", "test", "image", d.inputs[:0], d.labels[:0], 10)
    bad = {
        "empty": (empty, "empty"),
        "text to image model": (synthetic_split(loaded("gpt2")), "language model|text"),
        "wrong size": (Split("x", "test", "image", torch.zeros(3, 1, 16, 16),
                             torch.zeros(3, dtype=torch.long), 10), "16x16"),
        "wrong channels": (Split("x", "test", "image", torch.zeros(3, 3, 8, 8),
                                 torch.zeros(3, dtype=torch.long), 10), "3x8x8"),
        "labels": (Split("x", "test", "image", d.inputs[:3], d.labels[:3], 7), "7 classes"),
    }
    for split, pattern in bad.values():
        with pytest.raises(RotvizError, match=pattern) as e:
            interpolate(a, b, split, None, points=3)
        _one_line(e)
        with pytest.raises(RotvizError):
            loss_plane(a, b, split, "seed", grid=3)
    with pytest.raises(RotvizError, match="image data but .* is a language model") as e:
        interpolate(loaded("gpt2"), loaded("gpt2", 1), d, None, points=3)
    _one_line(e)
    for points in (2, 1, 0, -3):  # the endpoints alone give a barrier of 0 by construction
        with pytest.raises(RotvizError, match="from 3 to") as e:
            interpolate(a, b, d, None, points=points)
        _one_line(e)
    with pytest.raises(RotvizError, match="repeats"):
        interpolate(a, b, d, None, points=3, repeats=0)
    with pytest.raises(RotvizError, match="grid"):
        loss_plane(a, b, d, "seed", grid=2)
    with pytest.raises(RotvizError, match="unknown matching option") as e:
        interpolate(a, b, d, "ffn,rotations", points=3)
    _one_line(e)
    with pytest.raises(RotvizError, match="differ|architectures"):
        interpolate(a, loaded("vit"), d, None, points=3)


# ---- command line ----------


def test_cli_barrier_writes_the_documented_json(tmp_path, capsys):
    a, b = default_pair_refs()
    out = tmp_path / "sub" / "barrier.json"
    out.parent.mkdir()  # a file output's folder must exist (issue 43)
    rc = main(["barrier", a, b, "--data", "digits", "--match", "seed", "--points", "5",
               "--device", "cpu", "--json", str(out), "--repeats", "2"])
    assert rc == 0
    line = capsys.readouterr().out
    assert "barrier [seed]" in line
    d = json.loads(out.read_text())
    required = {"alphas", "loss", "acc", "barrier", "loss_range", "mid_acc", "match", "data",
                "split", "device", "seconds"}
    assert required <= set(d)
    assert d["match"] == "seed" and d["device"] == "cpu" and len(d["alphas"]) == 5
    pa, pb = default_pair()
    direct = interpolate(pa, pb, digits(), "seed", points=5)
    assert d["barrier"] == pytest.approx(direct.barrier, abs=1e-9)
    assert [p.name for p in out.parent.iterdir()] == ["barrier.json"]  # no temporary left


def test_cli_barrier_layer_subset(tmp_path, capsys):
    a, b = default_pair_refs()
    out = tmp_path / "b.json"
    assert main(["barrier", a, b, "--data", "digits", "--points", "3", "--layers", "1-2",
                 "--json", str(out), "--device", "cpu"]) == 0
    assert "[seed, layers 1,2]" in capsys.readouterr().out
    d = json.loads(out.read_text())
    pa, pb = default_pair()
    full = interpolate(pa, pb, digits(), "seed", points=3)
    assert d["layers"] == [1, 2] and d["match"] == "seed"
    assert full.distance_after < d["distance_after"] < d["distance_before"]


def test_cli_plane_writes_json(tmp_path, capsys):
    a, b = default_pair_refs()
    out = tmp_path / "plane.json"
    assert main(["plane", a, b, "--data", "digits", "--grid", "3", "--json", str(out),
                 "--device", "cpu"]) == 0
    d = json.loads(out.read_text())
    assert {"xs", "ys", "loss", "acc", "points", "point_loss", "point_acc"} <= set(d)
    assert set(d["points"]) == {"A", "B", "B'", "AB", "AB'"}
    assert "plane [seed]" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, pattern",
    [
        (["--points", "1"], "--points must be"),
        (["--match", "ffn,wat"], "unknown matching option"),
        (["--match", "heads"], "needs attention rotation (attn)"),
        (["--data", "nosuchdata"], "unknown data"),
        (["--split", "holdout"], "unknown split"),
        (["--device", "tpu"], "unknown device"),
        (["--layers", "9"], "out of range"),
    ],
)
def test_cli_barrier_errors_are_one_line_exit_2(tmp_path, capsys, extra, pattern):
    a, b = default_pair_refs()
    out = tmp_path / "b.json"
    args = ["barrier", a, b, "--data", "digits", "--json", str(out)]
    rc = main(args + extra)
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("rotviz: error: ") and err.count("\n") == 1 and pattern in err
    assert not out.exists()


# ---- ablations and layer sweeps ----------------------------------------------------------


def test_ablation_rows_agree_with_curves_and_touch_only_their_modules():
    from rotviz.measures.distances import ABLATION_SPECS, ablation

    a, b = default_pair()
    split = digits().subset(150)
    ab = ablation(a, b, split, points=5)
    rows = {r.match: r for r in ab.rows}
    assert list(rows) == list(ABLATION_SPECS)
    none = rows["none"]
    assert none.distance == pytest.approx(ab.distance_none)
    assert rows["ffn"].distance < none.distance and rows["attn"].distance < none.distance
    assert rows["ffn,attn"].distance < min(rows["ffn"].distance, rows["attn"].distance)
    assert rows["seed"].distance <= rows["ffn,attn"].distance + 1e-9  # rescaling never adds
    # FFN matching moves only FFN tensors, attention matching only Q, K, V, O
    for kind in ("q", "k", "v", "o", "norms", "embeddings", "head"):
        assert rows["ffn"].per_kind[kind] == pytest.approx(none.per_kind[kind], rel=1e-9)
    for kind in ("ffn_in", "ffn_out", "norms", "embeddings", "head"):
        assert rows["attn"].per_kind[kind] == pytest.approx(none.per_kind[kind], rel=1e-9)
    for spec in ("none", "attn"):
        c = interpolate(a, b, split, spec, points=5)
        assert rows[spec].barrier == pytest.approx(c.barrier, abs=1e-9)
        assert rows[spec].loss == pytest.approx(c.loss, abs=1e-9)
    assert set(none.per_layer) == {"0", "1", "2", "3", "rest"}
    json.dumps(ab.to_dict())


def test_layer_sweeps_cover_single_and_tail_subsets():
    from rotviz.measures.sweeps import layer_sweeps

    a, b = default_pair()
    split = digits().subset(150)
    calls = []
    sw = layer_sweeps(a, b, split, "seed", points=3, progress=lambda d, t, m: calls.append(d))
    assert sw.n_layers == 4 and sw.match == "seed"
    assert [p.layers for p in sw.single] == [[0], [1], [2], [3]]
    assert [p.layers for p in sw.tail] == [[3], [2, 3], [1, 2, 3], [0, 1, 2, 3]]
    assert sw.tail[0] == sw.single[3] and sw.tail[-1] == sw.all
    assert sw.none.layers == [] and sw.all.layers == [0, 1, 2, 3]
    full = interpolate(a, b, split, "seed", points=3)
    assert sw.all.distance == pytest.approx(full.distance_after)
    assert sw.all.mid_loss == pytest.approx(full.mid_loss, abs=1e-9)
    assert sw.none.distance == pytest.approx(full.distance_before)
    assert all(sw.all.distance < p.distance < sw.none.distance for p in sw.single)
    # tail distances shrink as more layers are matched
    d = [p.distance for p in sw.tail]
    assert all(x > y for x, y in zip(d, d[1:], strict=False))
    assert calls and max(calls) == 9  # none, 4 single, 4 tail (tail[0] and tail[-1] reused)
    json.dumps(sw.to_dict())

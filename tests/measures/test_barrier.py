"""The barrier record (rotviz.measures.barrier): the path evaluated exactly, the barrier and
loss range as defined, matching lowering it on the default pair, spread over subsets, bad
input in one line, the CLI's JSON, and its figure."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json

import numpy as np
import pytest
import torch
from conftest import clone_state
from pairs import assert_unchanged, default_pair, default_pair_refs, digits, synthetic_split
from test_plots import _check_frame

from rotviz.analysis.paths import _partition, loss_range_of
from rotviz.cli import main
from rotviz.data.split import Split
from rotviz.errors import RotvizError
from rotviz.evaluation import barrier_of, evaluate
from rotviz.measures.barrier import barrier_curves, interpolate
from rotviz.measures.plane import loss_plane
from rotviz.plots import style
from rotviz.plots.paths import barrier_point
from rotviz.sources.loading import Loaded


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


@functools.cache
def _seed_path():
    """The default pair's seed-matched path at 5 points on the digits test split, once per
    process: three tests read the same call (and rotviz never modifies a result)."""
    a, b = default_pair()
    return interpolate(a, b, digits(), "seed", points=5)


def _check_matching_helps() -> None:
    a, b = default_pair()
    # 5 points: both paths peak at alpha 0.5, a grid point, so each barrier is the one 21
    # points give (3.2907 unmatched, 2.0650 seed-matched), at a quarter of the evaluations
    none = interpolate(a, b, digits(), None, points=5)
    seed = _seed_path()
    assert none.match == "none" and seed.match == "seed"
    assert len(none.alphas) == len(none.loss) == len(none.acc) == 5
    # both paths start and end at the same models: matching keeps the source's function
    assert seed.loss[0] == none.loss[0]
    assert abs(seed.loss[-1] - none.loss[-1]) < 1e-4
    assert seed.distance_after < seed.distance_before == pytest.approx(none.distance_after)
    assert seed.max_output_diff < 1e-4
    # the midpoint is the simple average
    assert none.mid_loss == none.loss[2] and none.mid_acc == none.acc[2]
    assert none.loss_range >= none.barrier > 1.0
    assert seed.barrier < none.barrier
    assert seed.mid_acc > none.mid_acc


def test_default_pair_matching_lowers_the_barrier_and_raises_midpoint_accuracy():
    """The seed paper's Figure 5 claim, on the zoo's default pair."""
    _check_matching_helps()


def test_repeats_report_spread_over_disjoint_subsets():
    a, b = default_pair()
    one = _seed_path()
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
    direct = _seed_path()
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

CURVES = [
    {"match": "none", "alphas": [0, 0.25, 0.5, 0.75, 1], "loss": [0.2, 1.0, 2.3, 0.9, 0.3],
     "acc": [0.95, 0.7, 0.3, 0.7, 0.94]},
    {"match": "seed", "alphas": [0, 0.25, 0.5, 0.75, 1], "loss": [0.2, 0.5, 0.9, 0.5, 0.3],
     "acc": [0.95, 0.85, 0.6, 0.86, 0.94]},
]


def test_barrier_point_is_the_largest_rise_above_the_chord():
    a = [0.0, 0.5, 1.0]
    am, top, base = barrier_point(a, [1.0, 4.0, 3.0])
    assert am == 0.5 and top == 4.0 and base == pytest.approx(2.0)
    # a convex-down curve: the barrier is 0 at an end point
    am, top, base = barrier_point(a, [1.0, 1.5, 3.0])
    assert top - base == pytest.approx(0.0)


def test_barrier_curves_carry_the_data_and_annotate_the_barrier():
    fig = barrier_curves(CURVES)
    _check_frame(fig, "loss along")
    assert fig.layout.xaxis.title.text == style.ALPHA
    assert fig.layout.yaxis.title.text == style.LOSS
    lines = [tr for tr in fig.data if tr.showlegend is not False]
    assert [list(tr.y) for tr in lines] == [c["loss"] for c in CURVES]
    assert "no matching" in lines[0].name and "barrier 2.050" in lines[0].name
    assert "seed paper" in lines[1].name and "barrier 0.650" in lines[1].name
    marks = [tr for tr in fig.data if tr.showlegend is False]
    assert [tuple(m.y) for m in marks] == [(0.25, 2.3), (0.25, 0.9)]
    assert lines[0].line.color != lines[1].line.color and lines[0].line.dash != lines[1].line.dash
    acc = barrier_curves(CURVES, metric="acc")
    _check_frame(acc, "accuracy")
    assert [list(tr.y) for tr in acc.data] == [c["acc"] for c in CURVES]
    # titles true of every curve: the path ends at the matched source only when all matched
    assert fig.layout.title.text == ("Loss along the straight path from anchor to source, "
                                     "with and without matching")
    assert barrier_curves(CURVES[1:]).layout.title.text == \
        "Loss along the straight path from anchor to matched source"
    assert acc.layout.title.text.startswith("Accuracy along the straight path from anchor to "
                                            "source, with")
    assert "no matching" in barrier_curves(CURVES[:1], "acc").layout.title.text
    # the accuracy axis follows the data (0.3..0.95, padded by 5 % of the span), or 0-1
    assert list(acc.layout.yaxis.range) == pytest.approx([0.3 - 0.0325, 0.95 + 0.0325])
    low = [{**c, "acc": [0.12, 0.15, 0.18, 0.14, 0.13]} for c in CURVES]
    assert list(barrier_curves(low, "acc").layout.yaxis.range) == pytest.approx(
        [0.11, 0.19])  # a 0.06 span: the 0.01 floor of the padding
    fixed = barrier_curves(low, "acc", acc_range=style.ACC_FIXED)
    assert list(fixed.layout.yaxis.range) == [0.0, 1.02]
    assert style.acc_range([0.99, 1.0]) == pytest.approx([0.98, 1.01])
    assert style.acc_range([float("nan")]) == [0.0, 1.02]


def test_the_record_draws_in_the_hosts_style():
    """The barrier's figure is `barrier_curves` of the one curve, in the page's font size
    (14 by default, as the CLI's --figure draws it)."""
    from rotviz.measures import measurement
    from rotviz.plots.figure_style import Style

    rec = measurement("barrier")
    assert rec.plot(CURVES[1], Style()).to_dict() == barrier_curves([CURVES[1]]).to_dict()
    assert rec.plot(CURVES[1], Style(font_size=22)).layout.font.size == 22

"""Many models at once (rotviz.measures.many, `rotviz many`): the zoo's four digits ViT seeds
aligned onto their barycentre and merged. One alignment (seed matching, 3 rounds) is shared by
the module; the CLI runs on three of the seeds, one round."""

from __future__ import annotations

import json

import pytest
import torch

from rotviz import zoo_registry as zoo
from rotviz.cli import main
from rotviz.data.reading import split_for
from rotviz.errors import RotvizError
from rotviz.evaluation import evaluate
from rotviz.match.distances import distances
from rotviz.match.many import align_many, mean_states
from rotviz.match.pipeline import view_of
from rotviz.measures.many import merged_curve
from rotviz.sources.loading import load_model
from rotviz.sources.running import max_output_diff


@pytest.fixture(scope="module")
def seeds():
    assert len(zoo.SEEDS) == 4
    return [load_model(f"zoo:{n}") for n in zoo.SEEDS]


@pytest.fixture(scope="module")
def test_split(seeds):
    return split_for(seeds[0], "digits", "test")


@pytest.fixture(scope="module")
def given(seeds):
    """The four seeds' parameters before anything ran (to check nothing is mutated)."""
    return [{k: v.clone() for k, v in m.state.items()} for m in seeds]


@pytest.fixture(scope="module")
def bary(seeds, given):
    calls = []
    out = align_many(seeds, "seed", "barycentre", rounds=3,
                     progress=lambda d, t, m: calls.append((d, t)))
    assert calls and calls[-1][0] <= calls[-1][1]
    return out


@pytest.fixture(scope="module")
def curve(seeds, bary, test_split):
    return merged_curve(seeds, bary, test_split)


def test_barycentre_lowers_the_mean_pairwise_distance(seeds, bary):
    a = bary
    # measured: 26.72 as given, 25.35 onto the anchor, then 25.11, 25.03, 24.99
    assert a.spread[0] > a.spread[1] > a.spread[-1]
    assert a.spread[0] - a.spread[-1] > 1.0
    assert 1 <= a.rounds <= 3 and a.ended in ("converged", "round limit")
    assert len(a.moved) == a.rounds and len(a.spread) == 2 + a.rounds
    # the matrices are rotviz.match.distances' totals, as the app shows a pair
    d01 = distances(view_of(seeds[0]), view_of(seeds[1])).total
    assert a.before[0][1] == pytest.approx(d01, rel=1e-9)
    assert a.before[1][0] == a.before[0][1] and a.before[2][2] == 0.0
    n = len(seeds)
    mean_after = sum(a.after[i][j] for i in range(n) for j in range(i + 1, n)) / 6
    assert mean_after == pytest.approx(a.spread[-1], rel=1e-9)


def test_every_aligned_model_keeps_its_function(seeds, bary, given, test_split):
    assert bary.max_output_diff < 1e-4
    for m, state in zip(seeds, bary.states, strict=True):
        assert max_output_diff(m, m.state, state) < 1e-4  # recomputed independently
        assert any(not torch.equal(state[k], m.state[k]) for k in state)  # it moved
    # and on the test split: the same accuracy as the original
    e0, e1 = evaluate(seeds[1], test_split), evaluate(seeds[1], test_split, bary.states[1])
    assert e1["acc"] == pytest.approx(e0["acc"], abs=1e-12)
    for m, g in zip(seeds, given, strict=True):  # inputs never mutated
        assert all(torch.equal(m.state[k], g[k]) for k in g)


def test_merged_accuracy_against_the_number_of_models(seeds, curve, test_split):
    c = curve
    assert c.k == [2, 3, 4]
    # the unaligned merge of the first two, computed independently
    mid = {k: 0.5 * (seeds[0].state[k] + seeds[1].state[k]) for k in seeds[0].state}
    assert c.acc["unaligned"][0] == pytest.approx(evaluate(seeds[0], test_split, mid)["acc"],
                                                  abs=1e-12)
    # measured (seed matching, 3 barycentre rounds), N = 2, 3, 4: accuracy aligned 0.363,
    # 0.232, 0.118, not aligned 0.123, 0.118, 0.156; loss aligned 2.24, 2.26, 2.47, not
    # aligned 3.48, 3.21, 2.82; single models 0.917 to 0.960. Seed matching (no heads, no
    # residual) does not bring four seeds into one basin: every mean is far from the single
    # models, and for N = 4 the aligned mean's accuracy is below the unaligned one's (both
    # near chance, 0.1), though its loss is lower.
    assert c.acc["aligned"][0] > c.acc["unaligned"][0] + 0.1
    assert all(al < un for al, un in zip(c.loss["aligned"], c.loss["unaligned"], strict=True))
    assert all(0.0 <= x <= 1.0 for k in c.acc for x in c.acc[k])
    assert min(c.model_acc) > 0.9


def test_anchor_alignment_leaves_the_anchor(seeds):
    a = align_many(seeds[:3], "seed", "anchor")
    assert a.ended == "anchor" and a.rounds == 0 and a.moved == []
    assert all(torch.equal(a.states[0][k], seeds[0].state[k]) for k in seeds[0].state)
    assert a.spread[0] > a.spread[1]
    assert a.max_output_diff < 1e-4


def test_mean_states_and_a_plugged_merge(seeds):
    s = [m.state for m in seeds[:3]]
    got = mean_states(seeds[0], s, [0.2, 0.3, 0.5])
    k = next(k for k in s[0] if s[0][k].is_floating_point())
    want = 0.2 * s[0][k].double() + 0.3 * s[1][k].double() + 0.5 * s[2][k].double()
    assert torch.allclose(got[k].double(), want, atol=1e-6)
    used = []

    def first_only(anchor, states, weights):
        used.append(len(states))
        return {k: v.clone() for k, v in states[0].items()}

    a = align_many(seeds[:3], "seed", "barycentre", rounds=1, merge=first_only)
    assert used == [3, 3]  # the starting mean and one round's
    assert a.rounds == 1


def test_bad_inputs_are_refused(seeds):
    with pytest.raises(RotvizError, match="at least 3 models, got 2"):
        align_many(seeds[:2], "seed")
    with pytest.raises(RotvizError, match="not a trained model"):
        align_many(seeds[:3], "act", "barycentre")
    with pytest.raises(RotvizError, match="needs a matching"):
        align_many(seeds[:3], "none")
    with pytest.raises(RotvizError, match="anchor or barycentre"):
        align_many(seeds[:3], "seed", "centre")
    gpt = load_model("zoo:gpt2-pystdlib-s0")
    with pytest.raises(RotvizError, match="not of 'zoo:vit-digits-s3''s architecture"):
        align_many([*seeds[:2], gpt], "seed")


def _cli_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_cli(capsys, tmp_path):
    refs = [f"zoo:{n}" for n in zoo.SEEDS[:3]]
    out = tmp_path / "many.json"
    assert main(["many", *refs, "--data", "digits", "--rounds", "1", "--json", str(out)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("many [seed, to barycentre] of 3 models")
    d = json.loads(out.read_text())
    assert d["k"] == [2, 3] and len(d["before"]) == 3 and d["max_output_diff"] < 1e-4
    assert d["spread"][0] > d["spread"][-1]
    err = _cli_error(capsys, ["many", *refs[:2], "--data", "digits"])
    assert "at least 3 models, got 2" in err
    err = _cli_error(capsys, ["many", *refs, "--data", "digits", "--match", "seed",
                              "--match", "weight"])
    assert "one --match SPEC" in err
    err = _cli_error(capsys, ["many", *refs[:2], "zoo:gpt2-pystdlib-s0", "--data", "digits"])
    assert "architecture" in err
    err = _cli_error(capsys, ["many", *refs, "--data", "digits", "--match", "act"])
    assert "data-free" in err


def test_the_library_call_measure_takes_the_references(seeds, test_split):
    from rotviz import measure

    refs = [f"zoo:{n}" for n in zoo.SEEDS[:3]]
    r = measure("many", refs, test_split, match=["seed"], to="anchor")
    a = align_many(seeds[:3], "seed", "anchor")
    assert r.alignment.spread == pytest.approx(a.spread, rel=1e-12)
    assert r.k == [2, 3] and r.alignment.refs == refs


def test_the_curve_merges_with_a_registered_method_about_a_base(capsys):
    """`many --method M --base B`: the curve's merges are the registered method's
    (rotviz.merging.merge_many of the aligned states, each weighing 1/k); task arithmetic at
    lambda 1 about any base is the plain mean, so its curve equals the default's (to float64
    roundoff: the weights 1/3 sum to 1 within an ulp);
    a method that needs statistics is not offered, and refused in one line."""
    from rotviz.measures.many import many, registered_merge
    from rotviz.merging.combine import merge_many

    refs = ["zoo:vit-digits-base", "zoo:vit-digits-ft-a", "zoo:vit-digits-ft-b"]
    models = [load_model(r) for r in refs]
    split = split_for(models[0], "digits", "test").subset(64)
    base = models[0].state
    plain = many(models, split, "seed", "anchor")
    ta = many(models, split, "seed", "anchor", final=registered_merge("task_arithmetic", base))
    for key in ("aligned", "unaligned"):
        assert ta.acc[key] == plain.acc[key]
        assert ta.loss[key] == pytest.approx(plain.loss[key], rel=1e-6)
    ties = many(models, split, "seed", "anchor",
                final=registered_merge("ties", base, density=0.3))
    from rotviz.evaluation import Evaluator

    ev = Evaluator(models[0], split)
    states = align_many(models, "seed", "anchor").states
    want = ev.evaluate(ev.params(merge_many(models[0], "ties", states, [1 / 3] * 3, base,
                                            density=0.3)))
    assert (ties.loss["aligned"][-1], ties.acc["aligned"][-1]) == want
    assert ties.loss["aligned"] != plain.loss["aligned"]
    with pytest.raises(RotvizError, match="needs statistics of each model"):
        registered_merge("regmean")
    assert main(["many", *refs, "--data", "digits", "--method", "fisher"]) == 2
    err = capsys.readouterr().err  # the record offers only the methods without statistics
    assert err.count("\n") == 1 and "unknown --method 'fisher': use one of simple," in err


@pytest.mark.parametrize("option", [("--rounds", "3"), ("--tol", "0.1")])
def test_barycentre_settings_need_the_barycentre(option, capfd, ws):
    """--to anchor matches once onto the first model: the barycentre's rounds and tolerance
    would be ignored, so they are refused in one line
    (models that do not exist: a refusal after loading would name them instead)."""
    from conftest import refused

    flag, value = option
    refused(["many", "nosuch-a", "nosuch-b", "nosuch-c", "--data", "digits", "--to", "anchor",
             flag, value], capfd, ws, f"{flag} needs --to barycentre: add it, or drop {flag}")


def test_the_figures_carry_the_data_in_the_hosts_style():
    """The record's figure: the pairwise distances before and after alignment on one colour
    scale (0 to the largest, or the page's shared range), in the page's font size; the
    merged accuracy against the number of models, beside the best single model."""
    from rotviz.measures import measurement
    from rotviz.measures.many import merged_by_count, short_names
    from rotviz.plots.figure_style import Style

    d = {"refs": ["zoo:vit-digits-s3", "/m/s6/", "s7"], "to": "barycentre", "match": "seed",
         "before": [[0.0, 4.0, 5.0], [4.0, 0.0, 6.0], [5.0, 6.0, 0.0]],
         "after": [[0.0, 2.0, 3.0], [2.0, 0.0, 2.5], [3.0, 2.5, 0.0]],
         "k": [2, 3], "acc": {"aligned": [0.8, 0.75], "unaligned": [0.3, 0.2]},
         "model_acc": [0.95, 0.94, 0.93]}
    assert short_names(d["refs"]) == ["vit-digits-s3", "s6", "s7"]
    rec = measurement("many")
    fig = rec.plot(d, Style())
    assert [list(map(list, t.z)) for t in fig.data] == [d["before"], d["after"]]
    axis = fig.layout.coloraxis
    assert (axis.cmin, axis.cmax) == (0.0, 6.0) and fig.layout.font.size == 14
    shared = rec.plot(d, Style(font_size=18, colour_range=(1.0, 8.0)))
    assert (shared.layout.coloraxis.cmin, shared.layout.coloraxis.cmax) == (1.0, 8.0)
    assert shared.layout.font.size == 18
    curve = merged_by_count(d)
    assert [list(t.y) for t in curve.data[:2]] == [[0.8, 0.75], [0.3, 0.2]]
    assert list(curve.data[2].y) == [0.95, 0.95] and "accuracy" in curve.layout.yaxis.title.text

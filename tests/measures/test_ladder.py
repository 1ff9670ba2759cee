"""The symmetry ladder (rotviz.measures.ladder, `rotviz ladder`): each rung's path is the
`rotviz barrier` CLI's for the same --match, its merged accuracy `rotviz merge --method
simple`'s, the align-to-self rung is exactly 0, and every reason is the symmetry registry's.

The CLI comparisons run on two tiny random ViTs (tests/conftest.py) on the digits test split,
5 points per path, in-process; the act and learned rungs and align-to-self on the default pair
(learned matching from the act rung's match, 20 steps, 100 test images: the reuse of a rung's
match is the same for weight's, `weight,learned`, without its cost). The default pair's full
ladder runs in bench/ladder.py."""

from __future__ import annotations

import json

import pytest
import torch

from rotviz.match.rungs import RUNGS, describe
from rotviz.measures.ladder import LadderPair, ladder
from rotviz.plots.figure_style import Style
from rotviz.symmetry import registry

POINTS = 5
VIT = dict(layers=2, d=32, heads=4, ffn=64, image=8, patch=2, channels=1, labels=10)  # digits
STEPS = 4  # learned matching on the tiny pair (whose paths have no barrier to learn away)
ZOO_STEPS = 20  # on the default pair: one validation check, which improves on the start


@pytest.fixture(scope="module")
def refs(saved) -> list[str]:
    return [str(saved("vit", 0, **VIT)), str(saved("vit", 1, **VIT))]


@pytest.fixture(scope="module")
def split():
    from rotviz.data.split import load_split

    return load_split("digits", "test")


@pytest.fixture(scope="module")
def cli_ladder(refs, tmp_path_factory) -> tuple[dict, str]:
    """`rotviz ladder A B --data digits` in-process (every default rung): its JSON and its
    standard output."""
    import contextlib
    import io

    from rotviz.cli import main
    from rotviz.plots.images import why_not

    out = tmp_path_factory.mktemp("ladder") / "ladder.json"
    svg = out.with_suffix(".svg") if why_not() is None else out.with_suffix(".html")
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        assert main(["ladder", *refs, "--data", "digits", "--points", str(POINTS), "--steps",
                     str(STEPS), "--json", str(out), "--figure", str(svg)]) == 0
    # --figure draws the record's figure of the same result (SVG where a Chromium is there)
    assert "The symmetry ladder: what each larger group of symmetries buys" in svg.read_text()
    return json.loads(out.read_text()), said.getvalue()


@pytest.fixture(scope="module")
def zoo_ladder(split) -> dict:
    """The default pair's act and learned rungs and align-to-self, 100 test images."""
    pair = LadderPair.read(["zoo:vit-digits-s3", "zoo:vit-digits-s6"], ["act", "learned"])
    return ladder(pair, split.subset(100), points=POINTS, steps=ZOO_STEPS).to_dict()


def _barrier_cli(refs, spec: str, tmp_path) -> dict:
    from rotviz.cli import main

    out = tmp_path / f"barrier-{spec}.json"
    assert main(["barrier", *refs, "--data", "digits", "--match", spec, "--points",
                 str(POINTS), "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_rung_equals_the_barrier_cli_and_self_is_exactly_zero(cli_ladder, refs,
                                                                     tmp_path):
    d, said = cli_ladder
    rungs = d["rungs"]
    assert [r["asked"] for r in rungs] == [*RUNGS, "weight"]
    assert [r["kind"] for r in rungs] == ["rung"] * len(RUNGS) + ["self"]
    assert "ladder on cpu: none [none]: barrier" in said
    assert "align-to-self [weight]: barrier 0.0000, distance 0.0000" in said
    for r in rungs[:-2]:  # learned: the CLI's learns 80 steps (the zoo test below)
        c = _barrier_cli(refs, r["asked"], tmp_path)
        assert c["match"] == r["spec"]
        assert r["loss"] == pytest.approx(c["loss"], abs=1e-6), r["spec"]
        assert r["barrier"] == pytest.approx(c["barrier"], abs=1e-6)
        assert r["distance"] == pytest.approx(c["distance_after"], abs=1e-6)
        assert r["mid_acc"] == pytest.approx(c["mid_acc"], abs=1e-9)
    assert rungs[0]["distance"] == rungs[0]["distance_before"] > 0  # none moves nothing
    assert rungs[5]["distance"] < rungs[3]["distance"] < rungs[0]["distance"]
    me = rungs[-1]
    assert me["barrier"] == 0.0 and me["distance"] == 0.0 and me["loss_range"] == 0.0
    assert min(r["loss_range"] for r in rungs[:-1]) > 0  # every other path is not flat
    assert me["merged_acc"] == d["anchor_acc"]


def test_merged_accuracy_is_the_simple_merge_cli(cli_ladder, refs, tmp_path):
    from rotviz.cli import main

    out = tmp_path / "merge.json"
    assert main(["merge", *refs, "--data", "digits", "--match", "seed", "--method", "simple",
                 "--json", str(out)]) == 0
    m = json.loads(out.read_text())
    seed = next(r for r in cli_ladder[0]["rungs"] if r["spec"] == "seed")
    assert seed["merged_acc"] == m["acc"]
    assert seed["merged_loss"] == pytest.approx(m["loss"], abs=1e-9)
    assert seed["merged_scores"] == pytest.approx(m["scores"], abs=1e-9)


def test_learned_rung_starts_from_the_rung_before_and_equals_learned_matching(zoo_ladder,
                                                                           split):
    """On the default pair: the learned rung reuses the act rung's match (activation
    matching), and its path is learned matching's own, made from scratch (activation matching
    again) with the same steps; align-to-self is exactly 0 where the other rungs have
    barriers."""
    from dataclasses import replace

    from rotviz.match.endpoints import match_endpoints
    from rotviz.match.options import LearnOptions
    from rotviz.match.selection import match_options
    from rotviz.measures.barrier import curve_on
    from rotviz.sources.loading import load_model

    a, b = load_model("zoo:vit-digits-s3"), load_model("zoo:vit-digits-s6")
    options = replace(match_options("learned"), learn=LearnOptions(steps=ZOO_STEPS))
    test = split.subset(100)
    c = curve_on(match_endpoints(a, b, options, data=test), test, POINTS)
    act, learned, me = zoo_ladder["rungs"]
    assert (act["spec"], learned["spec"]) == ("weight,act", "weight,act,learned")
    assert learned["words"] == "learned matching (from activation matching)"
    assert learned["distance"] != act["distance"]
    assert learned["loss"] == pytest.approx(c.loss, abs=1e-6)
    assert learned["barrier"] == pytest.approx(c.barrier, abs=1e-6)
    # float32 roundoff of a distance over every weight: 31.032012 against 31.031994 since the
    # joint steps build the matched model from the composed maps (loss and barrier stay 1e-6)
    assert learned["distance"] == pytest.approx(c.distance_after, rel=1e-6)
    assert learned["max_output_diff"] <= 1e-4
    assert act["barrier"] > learned["barrier"] > 0.0
    assert me["kind"] == "self" and me["spec"] == "none"  # no data-free rung: unmatched
    assert me["barrier"] == 0.0 and me["distance"] == 0.0


def test_reasons_come_from_the_registry_one_sentence_each(cli_ladder):
    cli_ladder = cli_ladder[0]
    want = [registry.NONE_REASON] + [registry.BY_NAME[f].one_sentence() for f in
                                     ("ffn", "attn", "rescale", "heads", "residual", "act",
                                      "learned")] + [registry.SELF_REASON]
    got = [r["reason"] for r in cli_ladder["rungs"]]
    assert got == want
    for text in got:
        assert text.endswith(".") and ". " not in text[:-1] and "\n" not in text
    assert [r["adds"] for r in describe(RUNGS)][1:6] == [["ffn"], ["attn"], ["rescale"],
                                                         ["heads"], ["residual"]]
    assert registry.LADDER == RUNGS  # the record's default rungs are the registry's


def test_table_figure_and_page_text(cli_ladder):
    cli_ladder = cli_ladder[0]
    from rotviz.measures.ladder import markdown
    from rotviz.measures.registry import measurement
    from rotviz.plots import style

    record = measurement("ladder")
    rows = record.rows(cli_ladder)
    assert [r["match"] for r in rows] == [r["spec"] for r in cli_ladder["rungs"]]
    text = markdown(cli_ladder)
    assert "| **align-to-self** | `weight` | 0.0000 | 0.0000 |" in text
    fig = record.plot(cli_ladder, Style())
    assert fig.layout.title.text and fig.layout.showlegend
    assert all(fig.layout[f"xaxis{i}"].title.text for i in ("", "2", "3"))
    assert fig.layout.yaxis.title.text
    bars = [t for t in fig.data if t.type == "bar"]
    assert {t.marker.color for t in bars} <= set(style.OKABE_ITO)
    self_bars = [t for t in bars if t.marker.color == "#000000"]
    assert [t.text[0] for t in self_bars] == ["0.0000", "0.0000", f"{cli_ladder['anchor_acc']:.4f}"]


def test_self_match_is_the_anchor_bit_for_bit(refs):
    """Weight matching of a model onto itself returns it unchanged (without
    rotviz.match.engine.kept_if_lower, float32 roundoff moved 58 of its tensors)."""
    from rotviz.match.endpoints import match_endpoints
    from rotviz.sources.loading import load_model

    a = load_model(refs[0])
    ends = match_endpoints(a, a, "weight")
    assert all(torch.equal(ends.matched[k], a.state[k]) for k in a.state)
    assert ends.info.distance_after == 0.0


def test_rungs_are_checked_and_skipped_with_a_reason(refs, split):
    from rotviz.errors import RotvizError

    with pytest.raises(RotvizError, match="unknown matching option 'spin'"):
        LadderPair.read(refs, ["seed", "spin"])
    pair = LadderPair.read(refs, ["seed", "ffn,attn,rescale", "none"])
    assert pair.specs == ("seed", "none")  # one rung per meaning, in the order given
    r = ladder(pair, split.subset(64), points=4)  # even: path_points adds the point at 0.5
    assert [x["spec"] for x in r.rungs] == ["seed", "none", "seed"]  # self: the last map rung
    assert r.rungs[-1]["barrier"] == 0.0
    assert len(r.rungs[0]["loss"]) == 4 and r.rungs[-1]["mid_acc"] == r.anchor_acc


def test_two_points_and_an_empty_rung_are_refused_before_loading(capfd, ws):
    """--points 2 (a barrier of 0 by construction) and an empty --match (once taken as
    none) are refused in one line
    (models that do not exist: a refusal after loading would name them instead)."""
    from tests.conftest import refused

    refused(["ladder", "nosuch-a", "nosuch-b", "--data", "digits", "--points", "2"], capfd,
            ws, "--points must be an integer from 3 to 1001, got 2")
    for spec in ("", " , "):
        refused(["ladder", "nosuch-a", "nosuch-b", "--data", "digits", "--match", "seed",
                 "--match", spec], capfd, ws, f"empty matching SPEC '{spec}'")


def test_steps_without_a_learned_rung_are_refused_before_loading(capfd, ws, monkeypatch):
    """--steps bounds the learned rung alone (the ladder's Inputs.check): with no learned
    rung it was ignored, now one line, before either model is loaded (loading would fail
    the test); the default rungs hold one, so --steps alone is fine there."""
    from tests.conftest import refused

    def never(self):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(LadderPair, "models", never)
    refused(["ladder", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
             "--match", "none", "--match", "seed", "--steps", "5"], capfd, ws,
            "--steps needs a learned rung (--match learned): add it, or drop --steps")

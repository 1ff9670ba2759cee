"""Variance collapse and REPAIR (rotviz.measures.collapse, rotviz.analysis.activations,
rotviz.analysis.repair): the per-unit statistics against the model's own hidden states and
across batch sizes, the std ratio of 1 at the path's ends and its collapse in the middle on
the default pair, REPAIR's endpoints, target statistics and stock state dicts, its refusal
for a family without biases, the barrier and the merge with --repair, and the figure."""

from __future__ import annotations

import copy
import functools
import json

import numpy as np
import pytest
import torch
from conftest import clone_state, refused
from pairs import assert_unchanged, default_pair, digits, synthetic_split

from rotviz.analysis.activations import KINDS, activation_stats
from rotviz.analysis.paths import path_point
from rotviz.analysis.repair import endpoint_stats, repair
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.match.endpoints import match_endpoints
from rotviz.measures.barrier import curve_on
from rotviz.measures.collapse import COLOUR_BAR, collapse_heatmaps, collapse_on


@functools.cache
def _ends(spec: str = "weight"):
    """The default pair matched once per process (2.7 s of weight matching; four tests read
    it, and rotviz never modifies endpoints it is given)."""
    a, b = default_pair()
    return match_endpoints(a, b, spec, "cpu", data=digits("test"))


def _train(n: int = 300):
    """The first examples of the digits train split (REPAIR's statistics, kept quick)."""
    return digits("train").subset(n)


# ---- statistics ----------------------------------------------------------------------------------


def test_residual_statistics_equal_the_models_hidden_states():
    """The residual stream after block i is the model's hidden state i + 1: mean and std
    over every token, in float64, equal the plain computation (1e-5)."""
    a, _ = default_pair()
    split = digits("test").subset(64)
    before = clone_state(a.state)

    def hooks():
        return [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in a.model.modules()]

    had = hooks()
    s = activation_stats(a, a.state, split, batch_size=10)
    assert hooks() == had  # none registered on the caller's model
    with torch.no_grad():
        out = a.model(pixel_values=split.inputs, output_hidden_states=True)
    for i, mean in enumerate(s.mean["residual"]):
        h = out.hidden_states[i + 1].reshape(-1, mean.shape[0]).double()
        np.testing.assert_allclose(mean, h.mean(0), atol=1e-5)
        np.testing.assert_allclose(s.std["residual"][i], h.std(0, unbiased=False), atol=1e-5)
    assert s.n == 64 * out.hidden_states[0].shape[1]
    assert_unchanged(a, before)


def test_statistics_do_not_depend_on_the_batch_size():
    a, _ = default_pair()
    split = digits("test").subset(50)
    one = activation_stats(a, a.state, split, batch_size=50)
    many = activation_stats(a, a.state, split, batch_size=7)
    for k in KINDS:
        assert len(one.std[k]) == 4
        for x, y in zip(one.mean[k] + one.std[k], many.mean[k] + many.std[k], strict=True):
            assert float((x - y).abs().max()) < 1e-10


# ---- the record ----------------------------------------------------------------------------------


def test_collapse_is_one_at_the_ends_and_below_one_in_the_middle():
    """At alpha 0 and 1 every ratio is 1 (1e-6). On the default pair, weight-matched, the
    midpoint model keeps 0.55 of the residual stream's spread, 0.72 of the FFN's and 0.68 of
    the heads' (averages over the 4 blocks)."""
    c = collapse_on(_ends(), digits("test"), points=3).to_dict()
    assert c["alphas"] == [0.0, 0.5, 1.0] and c["layers"] == [0, 1, 2, 3]
    for k in KINDS:
        for row in c["ratio"][k]:
            assert abs(row[0] - 1) < 1e-6 and abs(row[-1] - 1) < 1e-6
            assert row[1] < 0.95
    mid = {k: float(np.mean([r[1] for r in c["ratio"][k]])) for k in KINDS}
    assert mid["residual"] == pytest.approx(0.552, abs=0.01)
    assert mid["ffn"] == pytest.approx(0.723, abs=0.01)
    assert mid["heads"] == pytest.approx(0.683, abs=0.01)
    assert c["tokens"] == 397 * 17
    fig = collapse_heatmaps(c)
    assert len(fig.data) == 3 and {t.coloraxis for t in fig.data} == {"coloraxis"}
    assert fig.layout.coloraxis.colorbar.title.text == COLOUR_BAR
    assert fig.layout.coloraxis.cmin < 1 < fig.layout.coloraxis.cmax


# ---- REPAIR --------------------------------------------------------------------------------------


def test_repair_leaves_the_endpoints_unchanged_and_hits_its_targets():
    """alpha 0 and 1: the state is A's and B''s (1e-6). alpha 0.5: each head output and FFN
    hidden unit has the interpolated endpoint mean and std on the train split (1e-4), and
    the result loads into the model's class with no missing or unexpected key."""
    ends = _ends()
    a, sa, sb = ends.anchor, ends.anchor.state, ends.matched
    train = _train()
    stats = endpoint_stats(a, sa, sb, train)
    for alpha, want in ((0.0, sa), (1.0, sb)):
        got = repair(a, path_point(sa, sb, alpha), sa, sb, alpha, train, ends=stats)
        assert set(got) == set(want)
        assert max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-6
    mid = path_point(sa, sb, 0.5)
    fixed = repair(a, mid, sa, sb, 0.5, train, ends=stats)
    assert max(float((fixed[k] - mid[k]).abs().max()) for k in mid) > 0.01  # it did something
    after = activation_stats(a, fixed, train, kinds=("ffn", "heads"))
    for k in ("ffn", "heads"):
        for i in range(4):
            mean = 0.5 * stats[0].mean[k][i] + 0.5 * stats[1].mean[k][i]
            std = 0.5 * stats[0].std[k][i] + 0.5 * stats[1].std[k][i]
            assert float((after.mean[k][i] - mean).abs().max()) < 1e-4
            assert float((after.std[k][i] - std).abs().max()) < 1e-4
    module = copy.deepcopy(a.model)
    result = module.load_state_dict(fixed, strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    assert all(fixed[k].dtype == mid[k].dtype and fixed[k].shape == mid[k].shape for k in mid)


def test_repair_folds_into_a_fused_conv1d_model(loaded):
    """GPT-2 (fused Q, K, V stored (in, out)): after REPAIR at alpha 0.3 every corrected unit
    has its target statistics (1e-4) on the split it was measured on."""
    a, b = loaded("gpt2", 0), loaded("gpt2", 1)
    split = synthetic_split(a, n=12)
    fixed = repair(a, path_point(a.state, b.state, 0.3), a.state, b.state, 0.3, split)
    sa, sb = endpoint_stats(a, a.state, b.state, split)
    after = activation_stats(a, fixed, split, kinds=("ffn", "heads"))
    for k in ("ffn", "heads"):
        for i in range(len(after.std[k])):
            mean = 0.7 * sa.mean[k][i] + 0.3 * sb.mean[k][i]
            std = 0.7 * sa.std[k][i] + 0.3 * sb.std[k][i]
            assert float((after.mean[k][i] - mean).abs().max()) < 1e-4
            assert float((after.std[k][i] - std).abs().max()) < 1e-4


def test_repair_refuses_a_family_without_biases(loaded):
    a = loaded("llama", 0)
    with pytest.raises(RotvizError) as e:
        repair(a, a.state, a.state, a.state, 0.5, synthetic_split(a, n=4))
    assert "\n" not in str(e.value) and "no bias" in str(e.value)


def test_barrier_with_repair_keeps_the_plain_curve_beside():
    """The repaired curve's ends are the endpoints' own losses, and its unrepaired barrier is
    the plain curve's, exactly."""
    ends = _ends()
    split = digits("test")
    plain = curve_on(ends, split, points=3)
    fixed = curve_on(ends, split, points=3, repair=True).to_dict()
    assert fixed["repair"] is True and fixed["barrier_unrepaired"] == plain.barrier
    assert fixed["loss_unrepaired"] == plain.loss
    assert fixed["loss"][0] == pytest.approx(plain.loss[0], abs=1e-6)
    assert fixed["loss"][-1] == pytest.approx(plain.loss[-1], abs=1e-6)
    assert fixed["loss"][1] != pytest.approx(plain.loss[1], abs=1e-3)


@pytest.mark.parametrize("record", ["barrier", "merge"])
def test_repair_at_size_is_refused_in_one_line(record, capfd, ws):
    refused([record, "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
             "--repair", "yes", "--max-memory", "0", "--json", str(ws / "b.json")],
            capfd, ws, "--repair", "--max-memory")


def test_collapse_cli_writes_its_json(ws):
    """The command's JSON holds every kind's ratio and a std per block (weight matching
    stopped after its first round: what is checked here is the JSON, not the matching)."""
    out = ws / "c.json"
    assert main(["collapse", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
                 "--match", "weight", "--time-limit", "0", "--points", "3", "--json",
                 str(out)]) == 0
    d = json.loads(out.read_text())
    assert set(d["ratio"]) == set(KINDS) and len(d["anchor_std"]["ffn"]) == 4


def test_merge_with_repair_is_the_repaired_midpoint():
    """A simple merge at weight 0.5 is the path's midpoint: with --repair its loss is the
    REPAIRed midpoint's (1e-6), beside the unrepaired merge's; the merged state is stock."""
    from rotviz import measure

    ends = _ends()
    split = digits("test")
    plain = measure("merge", ends, split, weight=0.5)
    fixed = measure("merge", ends, split, weight=0.5, repair="yes")
    d = fixed.to_dict()
    assert d["repair"] is True and "state" not in d
    assert d["loss_unrepaired"] == plain.loss and d["acc_unrepaired"] == plain.acc
    sa, sb = ends.anchor.state, ends.matched
    want = repair(ends.anchor, path_point(sa, sb, 0.5), sa, sb, 0.5, digits("train"))
    assert max(float((fixed.state[k] - want[k]).abs().max()) for k in want) < 1e-6
    with pytest.raises(RotvizError, match="--repair"):
        measure("merge", ends, split, repair="maybe")


@pytest.mark.parametrize("fam", ["gpt2", "bert"])
def test_collapse_at_size_equals_in_memory_on_tied_and_post_norm_models(saved, fam):
    """Each model of the path run block by block, its blocks interpolated as they start,
    gives the in-memory ratios and stds to 1e-5, at 5 points (3 inside the path): GPT-2's
    fused attention and tied head, BERT's post-norm blocks."""
    from pairs import synthetic_split

    from rotviz.atsize.blocks import open_streamed
    from rotviz.atsize.endpoints import streamed_endpoints
    from rotviz.match.endpoints import match_endpoints
    from rotviz.match.selection import match_options
    from rotviz.measures.collapse import collapse_on, sized_collapse
    from rotviz.sources.loading import load_model

    paths = [str(saved(fam, s)) for s in (0, 1)]
    a, b = load_model(paths[0]), load_model(paths[1])
    split = synthetic_split(a, 8)
    want = collapse_on(match_endpoints(a, b, "seed"), split, points=5).to_dict()
    with streamed_endpoints(open_streamed(paths[0]), open_streamed(paths[1]),
                            match_options("seed"), "cpu") as ends:
        got = sized_collapse(ends, split, points=5).to_dict()
    assert got["tokens"] == want["tokens"] and got["layers"] == want["layers"]
    for key in ("ratio", "anchor_std", "source_std"):
        for kind in want[key]:
            assert np.allclose(got[key][kind], want[key][kind], rtol=1e-5, atol=1e-5), (key,
                                                                                        kind)
    mid = np.asarray(want["ratio"]["ffn"])[:, 2]
    assert not np.allclose(mid, 1.0, atol=1e-3)  # a real interpolation between two models

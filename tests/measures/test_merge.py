"""The merge record (rotviz.measures.merge, one merge on rotviz.analysis.merges.merge_on):
self-merge identity, RegMean and Fisher algebra, exact statistics taken on the matched
models, the fusion table (rotviz.analysis.fusion), the merge CLI, bad input and the figure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import clone_state, view_of
from pairs import (
    assert_unchanged,
    default_pair,
    default_pair_refs,
    digits,
    synthetic_split,
)
from test_plots import _check_frame

from rotviz.arch import FAMILIES
from rotviz.cli import main
from rotviz.data.split import Split
from rotviz.errors import RotvizError
from rotviz.evaluation import evaluate
from rotviz.match.endpoints import match_endpoints
from rotviz.match.engine import match
from rotviz.match.options import MatchOptions
from rotviz.measures.merge import bar_range, fusion_chart, merge
from rotviz.merging import method as method_record
from rotviz.merging import names
from rotviz.merging.fisher import fisher_combine, fisher_diag
from rotviz.merging.regmean import gram_matrices, regmean_combine
from rotviz.merging.simple import simple_average
from rotviz.sources.loading import load_model
from rotviz.symmetry.view import write_state


def _gram(n: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(3 * n, n, generator=gen, dtype=torch.float64)
    return x.T @ x / (3 * n)


# ---- algebra -------------------------------------------------------------------------------------


@pytest.mark.parametrize("in_out", [False, True])
def test_regmean_with_equal_grams_is_the_simple_average(in_out):
    gen = torch.Generator().manual_seed(0)
    w1, w2 = (torch.randn(5, 7, generator=gen, dtype=torch.float64) for _ in range(2))
    if in_out:  # GPT-2 Conv1D layout: (in, out)
        w1, w2 = w1.T.contiguous(), w2.T.contiguous()
    g = _gram(7, gen)
    for lw in ((0.5, 0.5), (0.3, 0.7)):
        for alpha in (1.0, 0.9, 0.0):
            out = regmean_combine([w1, w2], [g, g], lw, alpha, in_out=in_out)
            torch.testing.assert_close(out, simple_average([w1, w2], lw), rtol=0, atol=1e-12)


def test_regmean_solves_the_regression():
    gen = torch.Generator().manual_seed(1)
    w1, w2 = (torch.randn(4, 6, generator=gen, dtype=torch.float64) for _ in range(2))
    g1, g2 = _gram(6, gen), _gram(6, gen)
    lw = (0.4, 0.6)
    out = regmean_combine([w1, w2], [g1, g2], lw, alpha=1.0)
    # normal equations of min_W sum_i l_i ||X_i W^T - X_i W_i^T||^2
    grad = lw[0] * g1 @ (out - w1).T + lw[1] * g2 @ (out - w2).T
    assert float(grad.abs().max()) < 1e-10
    assert float((out - simple_average([w1, w2], lw)).abs().max()) > 1e-2  # not just the mean
    # alpha = 0 keeps only the diagonals: a per-input-feature weighted mean
    d1, d2 = torch.diagonal(g1), torch.diagonal(g2)
    want = (lw[0] * d1 * w1 + lw[1] * d2 * w2) / (lw[0] * d1 + lw[1] * d2)
    torch.testing.assert_close(regmean_combine([w1, w2], [g1, g2], lw, alpha=0.0), want)
    # alpha shrinks the off-diagonal entries: alpha = 0.5 sits strictly between the two
    half = regmean_combine([w1, w2], [g1, g2], lw, alpha=0.5)
    assert not torch.allclose(half, out) and not torch.allclose(half, want)


def test_fisher_combine_weights_each_parameter_by_its_fisher():
    a, b = torch.tensor([1.0, 1.0, 5.0]), torch.tensor([3.0, 3.0, 5.0])
    fa, fb = torch.tensor([1.0, 1e3, 2.0]), torch.tensor([1.0, 0.0, 7.0])
    out = fisher_combine([a, b], [fa, fb], (0.5, 0.5))
    assert out[0] == pytest.approx(2.0)  # equal information: the mean
    assert out[1] == pytest.approx(1.0, abs=1e-5)  # only the anchor is informed: the anchor
    assert out[2] == pytest.approx(5.0)  # equal values stay
    same = fisher_combine([a, b], [fa, fa], (0.25, 0.75))
    torch.testing.assert_close(same, simple_average([a, b], (0.25, 0.75)))


# ---- statistics ----------------------------------------------------------------------------------


def test_fisher_is_the_mean_squared_per_sample_gradient():
    a, _ = default_pair()
    train = digits("train")
    got = fisher_diag(a, a.state, train, batches=1, batch_size=3, seed=2)
    order = np.random.default_rng(2).permutation(train.n)[:3]
    params = {k: v.detach().clone().requires_grad_(True) for k, v in a.model.named_parameters()}
    want = {k: torch.zeros_like(v) for k, v in params.items()}
    from torch.func import functional_call

    for i in order:
        x, y = train.inputs[i : i + 1], train.labels[i : i + 1]
        logits = functional_call(a.model, params, (), {"pixel_values": x}).logits
        ll = -torch.nn.functional.cross_entropy(logits, y, reduction="sum")
        grads = torch.autograd.grad(ll, list(params.values()))
        for k, g in zip(params, grads, strict=True):
            want[k] += g**2 / 3
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-10)


def test_gram_matrices_are_the_inputs_second_moments():
    a, _ = default_pair()
    train = digits("train")
    grams = gram_matrices(a, a.state, train, batches=2, batch_size=8, seed=4)
    idx = torch.as_tensor(np.random.default_rng(4).permutation(train.n)[:16])
    with torch.no_grad():
        x = a.model.vit(pixel_values=train.inputs[idx]).last_hidden_state[:, 0].double()
    torch.testing.assert_close(grams["classifier.weight"], x.T @ x / 16, rtol=1e-5, atol=1e-8)
    names = [k for k in grams if k.startswith("vit.layers.0.")]
    assert len(names) == 6  # q, k, v, o, fc1, fc2
    assert grams["vit.layers.0.mlp.fc2.weight"].shape == (128, 128)


@pytest.mark.parametrize("method", ["fisher", "regmean"])
def test_statistics_are_taken_on_the_matched_source(method):
    a, b = default_pair()
    train = digits("train")
    kw = dict(batches=2, batch_size=16, seed=0)
    stat = fisher_diag if method == "fisher" else gram_matrices
    state = match_endpoints(a, b, "seed").matched
    merged = merge(a, b, method, "seed", digits(), stats_split=train, **kw)
    on_matched = stat(a, state, train, **kw)
    before_matching = stat(b, b.state, train, **kw)
    assert set(merged.source_stats) == set(on_matched)
    for k in on_matched:
        assert torch.equal(merged.source_stats[k], on_matched[k]), k
    anchor_stats = stat(a, a.state, train, **kw)
    assert all(torch.equal(merged.anchor_stats[k], anchor_stats[k]) for k in anchor_stats)
    # the statistics of matched layers differ from those taken before matching
    key = ("vit.layers.1.attention.o_proj.weight" if method == "regmean"
           else "vit.layers.1.attention.q_proj.weight")
    diff = (on_matched[key] - before_matching[key]).abs().max() / on_matched[key].abs().max()
    assert diff > 0.05


def test_ffn_statistics_move_with_the_permutation():
    """With FFN-only matching, the source's FFN Gram and Fisher are the raw ones permuted:
    the basis the statistics live in is the one the neurons were moved to."""
    a, b = default_pair()
    train = digits("train")
    kw = dict(batches=2, batch_size=16)
    res = match(view_of(a), view_of(b), MatchOptions(ffn=True, attn=False, rescale=False))
    state = write_state(res.view)
    perm = res.transforms[2].perm
    assert (perm != torch.arange(len(perm))).any()
    g_raw, g_new = gram_matrices(b, b.state, train, **kw), gram_matrices(a, state, train, **kw)
    key = "vit.layers.2.mlp.fc2.weight"
    torch.testing.assert_close(g_new[key], g_raw[key][perm][:, perm], rtol=1e-4, atol=1e-7)
    f_raw, f_new = fisher_diag(b, b.state, train, **kw), fisher_diag(a, state, train, **kw)
    key = "vit.layers.2.mlp.fc1.weight"
    torch.testing.assert_close(f_new[key], f_raw[key][perm], rtol=1e-4, atol=1e-12)


# ---- merging -------------------------------------------------------------------------------------


# Every method on two families (a ViT classifier; a gated, rotary, grouped-query LM), and on
# every family the methods whose code differs by family: the statistics (hooks on each
# family's modules) and one elementwise method of each kind (the plain mean, one about a base,
# one row-wise). The other elementwise methods run the same rows code on any family's tensors.
BY_FAMILY = ("simple", "fisher", "regmean", "ties", "nuslerp")
SELF_MERGES = sorted({(f, m) for f in ("vit", "llama") for m in names()}
                     | {(f, m) for f in FAMILIES for m in BY_FAMILY})


@pytest.mark.parametrize(("family", "method"), SELF_MERGES,
                         ids=[f"{f}-{m}" for f, m in SELF_MERGES])
def test_merging_a_model_with_itself_returns_it(family, loaded, method):
    m = loaded(family)
    before = clone_state(m.state)
    split = synthetic_split(m, n=8)
    kw = dict(batches=2, batch_size=4) if method_record(method).needs_statistics else {}
    if method_record(method).needs_base:  # about a base that is the model itself
        kw["base"] = m
    r = merge(m, m, method, None, split, stats_split=split, **kw)
    assert set(r.state) == set(m.state)
    for k, v in m.state.items():
        assert r.state[k].dtype == v.dtype
        torch.testing.assert_close(r.state[k], v, rtol=0, atol=1e-6)
    assert r.acc == r.anchor_acc == r.source_acc
    assert_unchanged(m, before)


@pytest.mark.parametrize("method", ["fisher", "regmean"])
def test_self_merge_with_matching_on_the_default_pair(method):
    a, _ = default_pair()
    r = merge(a, a, method, "seed", digits(), stats_split=digits("val"), batches=1, batch_size=16)
    for k, v in a.state.items():
        torch.testing.assert_close(r.state[k], v, rtol=0, atol=1e-6)
    assert r.acc == pytest.approx(evaluate(a, digits())["acc"])


def test_merge_cli_writes_a_loadable_model(tmp_path, capsys):
    a, b = default_pair_refs()
    out, js = tmp_path / "merged", tmp_path / "merge.json"
    rc = main(["merge", a, b, "--method", "regmean", "--match", "seed", "--data", "digits",
               "--out", str(out), "--json", str(js), "--batches", "2", "--batch-size", "16",
               "--device", "cpu"])
    assert rc == 0
    line = capsys.readouterr().out
    assert "merged [regmean, match seed" in line
    d = json.loads(js.read_text())
    for key in ("method", "match", "weight", "acc", "loss", "anchor_acc", "source_acc", "data",
                "split", "stats_split", "device", "seconds", "alpha", "batches", "out", "scores"):
        assert key in d
    # the summary line gives the task's F1 (digits: macro-F1) beside the accuracy, for the
    # merged model and both end models, as --json has them
    assert set(d["scores"]) == set(d["anchor_scores"]) == {"macro_f1"}
    assert (f"accuracy {d['acc']:.4f} (loss {d['loss']:.4f}), macro-F1 "
            f"{d['scores']['macro_f1']:.4f}; anchor {d['anchor_acc']:.4f} (macro-F1 "
            f"{d['anchor_scores']['macro_f1']:.4f}), source {d['source_acc']:.4f} (macro-F1 "
            f"{d['source_scores']['macro_f1']:.4f})") in line
    # docs/cli.md's `rotviz merge --json` table names every key the file holds (but the
    # stamp every JSON rotviz writes carries, documented once for them all)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    table = doc.split("`rotviz merge --json`:")[1].split("\n\n")[1]
    assert not [k for k in d if f"`{k}`" not in table and k != "rotviz"]
    assert d["stats_split"] == "train" and d["alpha"] == 0.9
    back = load_model(out)
    assert evaluate(back, digits())["acc"] == pytest.approx(d["acc"], abs=1e-9)


def test_bad_merge_input(tmp_path, capsys):
    a, b = default_pair()
    with pytest.raises(RotvizError, match="unknown merge method") as e:
        merge(a, b, "mean", None, digits())
    assert ", ".join(names()) in str(e.value)  # every registered method, in the registry's order
    with pytest.raises(RotvizError, match="weight"):
        merge(a, b, "simple", None, digits(), weight=1.5)
    with pytest.raises(RotvizError, match="alpha"):
        merge(a, b, "regmean", None, digits(), alpha=2.0)
    d = digits()
    empty = Split("digits", "train", "image", d.inputs[:0], d.labels[:0], 10)
    with pytest.raises(RotvizError, match="empty"):
        merge(a, b, "fisher", None, d, stats_split=empty)
    wrong = Split("x", "train", "image", torch.zeros(4, 1, 16, 16), torch.zeros(4).long(), 10)
    with pytest.raises(RotvizError, match="16x16"):
        merge(a, b, "regmean", None, d, stats_split=wrong)
    ra, rb = default_pair_refs()
    out = tmp_path / "m"
    for extra, pattern in ((["--method", "mean"], "unknown --method 'mean'"),
                           (["--weight", "-0.1"], "weight"),
                           (["--match", "ffn,bogus"], "unknown matching option")):
        rc = main(["merge", ra, rb, "--data", "digits", "--out", str(out)] + extra)
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and pattern in err
        assert not out.exists()


def test_fusion_chart_groups_methods():
    rows = [
        {"method": "average", "matching": "none", "acc": 0.3},
        {"method": "average", "matching": "seed", "acc": 0.5},
        {"method": "fisher", "matching": "none", "acc": 0.35},
        {"method": "fisher", "matching": "seed", "acc": 0.6},
    ]
    fig = fusion_chart(rows, references={"anchor": 0.95, "source": 0.94})
    _check_frame(fig, "accuracy")
    assert list(fig.data[0].x) == ["average", "fisher"]
    assert list(fig.data[0].y) == [0.3, 0.35] and list(fig.data[1].y) == [0.5, 0.6]
    assert list(fig.data[2].y) == [0.95, 0.95]
    # bars start at 0 and the axis ends just above the highest bar or line: 0.95 + 5 % of
    # 0.95 - 0.3; the 0-1 scale on request; a shared range as given
    assert list(fig.layout.yaxis.range) == pytest.approx([0.0, 0.95 + 0.0325])
    assert bar_range([0.3, 0.6], fixed=True) == [0.0, 1.02]
    shared = fusion_chart(rows, "acc", y_range=[0.0, 0.8])
    assert list(shared.layout.yaxis.range) == [0.0, 0.8]


def test_the_record_draws_in_the_hosts_style():
    """The merge's bars take the page's font size and accuracy axis (the whole 0-1 scale, or
    one range shared with the panels beside it); by default the axis follows the data."""
    from rotviz.measures import measurement
    from rotviz.plots.figure_style import Style

    d = {"method": "simple", "match": "seed", "acc": 0.6, "anchor_acc": 0.9, "source_acc": 0.8}
    rec = measurement("merge")
    plain = rec.plot(d, Style())
    assert list(plain.layout.yaxis.range) == bar_range([0.6, 0.9, 0.8])
    assert plain.layout.font.size == 14
    assert list(rec.plot(d, Style(fixed_accuracy=True)).layout.yaxis.range) == [0.0, 1.02]
    shared = rec.plot(d, Style(font_size=18, accuracy_range=(0.0, 0.7)))
    assert list(shared.layout.yaxis.range) == [0.0, 0.7] and shared.layout.font.size == 18


def _never(*args, **kwargs):
    raise AssertionError("the distance of a pair not matched was measured")


def test_a_merge_not_evaluated_writes_the_same_model(tmp_path, capsys):
    """--evaluate no writes, in memory and at size, the bytes the evaluated merge writes,
    with no losses in its result and a line that says so, and no distance of a pair it did
    not match (at size not even measured); without --out (nothing would be
    made) or with --repair (judged by evaluating) it is one line, exit 2, nothing written."""
    from safetensors.torch import load_file

    from rotviz.match import at_size_checks

    a, b = default_pair_refs()
    common = ["merge", a, b, "--data", "digits", "--method", "simple", "--device", "cpu"]
    for sized in ([], ["--max-memory", "0"]):
        done = {}
        for ev in ("yes", "no"):
            out, js = tmp_path / f"{ev}{len(sized)}", tmp_path / f"{ev}{len(sized)}.json"
            assert main([*common, *sized, "--evaluate", ev, "--out", str(out),
                         "--json", str(js)]) == 0
            line = capsys.readouterr().out
            d = json.loads(js.read_text())
            done[ev] = load_file(out / "model.safetensors")
            if ev == "no":
                assert "not evaluated (--evaluate no)" in line and "accuracy" not in line
                assert all(d[k] is None for k in ("loss", "acc", "anchor_loss", "anchor_acc",
                                                  "source_loss", "source_acc"))
                assert d["scores"] == d["anchor_scores"] == {}
            else:
                assert 0.0 <= d["acc"] <= 1.0 and d["scores"]
        assert done["yes"].keys() == done["no"].keys()
        for k, t in done["yes"].items():
            assert torch.equal(t, done["no"][k]), k
        # a matched pair keeps its match's distances; one not matched is not measured at all
        # (at size that would be a pass over both models: its thread is never waited for)
        yes, no = (json.loads((tmp_path / f"{ev}{len(sized)}.json").read_text())
                   for ev in ("yes", "no"))
        assert no["distance_after"] == yes["distance_after"] > 0.0
        js = tmp_path / f"none{len(sized)}.json"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(at_size_checks, "streamed_distance", _never)
            assert main([*common, *sized, "--match", "none", "--evaluate", "no", "--out",
                         str(tmp_path / f"none{len(sized)}"), "--json", str(js)]) == 0
        d = json.loads(js.read_text())
        assert d["match"] == "none" and d["distance_before"] is d["distance_after"] is None
    for extra, pattern in (([], "give --out DIR"),
                           (["--repair", "yes", "--out", str(tmp_path / "r")], "--repair")):
        rc = main([*common, "--evaluate", "no", *extra])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and pattern in err
        assert not (tmp_path / "r").exists()

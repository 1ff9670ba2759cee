"""The merge_sweep record (rotviz.measures.merge_sweep): one merge per value, equal to
`merge_on` at that value, its CLI, rows, figure and refusals."""

from __future__ import annotations

import json
from functools import cache

import pytest
from conftest import refused

from rotviz.errors import RotvizError
from rotviz.plots.figure_style import Style


@cache
def _refs():
    return tuple(f"zoo:vit-digits-{n}" for n in ("ft-a", "ft-b", "base"))


def test_a_sweep_is_one_merge_per_value(tmp_path, capfd, ws):
    """`merge_sweep` turns one number and holds the rest: at each value its loss and accuracy
    are those of `merge_on` with that value (to the bit); the weight's ends are the anchor
    and the matched source; the CLI writes the rows and a plot with titled axes; a number
    the method cannot sweep, and a value outside the parameter's bound, are one line each."""
    from rotviz.analysis.merges import merge_on
    from rotviz.cli import main
    from rotviz.data.split import load_split
    from rotviz.match.endpoints import match_endpoints
    from rotviz.measures import measurement
    from rotviz.measures.merge_sweep import sweep_on
    from rotviz.sources.loading import load_model

    la, lb, lbase = (load_model(x) for x in _refs())
    split = load_split("digits", "test").subset(64)
    ends = match_endpoints(la, lb, None)
    dens = [0.1, 0.5, 1.0]
    sw = sweep_on(ends, "ties", "density", dens, split, base=lbase, scale=1.5)
    for d, loss, acc in zip(dens, sw.loss, sw.acc, strict=True):
        one = merge_on(ends, "ties", split, base=lbase, density=d, scale=1.5)
        assert (loss, acc) == (one.loss, one.acc), d
    assert len(set(sw.loss)) == 3 and sw.base == lbase.ref
    assert sw.params == {"consensus": "sum", "scale": 1.5}  # held; the swept one is `values`
    w = sweep_on(ends, "simple", "weight", [0.0, 0.5, 1.0], split)
    assert w.loss[0] == pytest.approx(w.anchor_loss, abs=1e-9)
    assert w.loss[2] == pytest.approx(w.source_loss, abs=1e-9)
    assert w.loss[1] == merge_on(ends, "simple", split).loss
    with pytest.raises(RotvizError, match="--param density is not a number --method simple"):
        sweep_on(ends, "simple", "density", dens, split)
    js = tmp_path / "sweep.json"
    args = ["merge_sweep", *_refs()[:2], "--data", "digits", "--match", "none", "--method",
            "task_arithmetic", "--base", _refs()[2], "--param", "scale", "--start", "0",
            "--stop", "2", "--points", "3"]
    assert main([*args, "--json", str(js)]) == 0
    out = capfd.readouterr().out
    assert out.startswith("merge sweep [task_arithmetic, match none] of scale")
    d = json.loads(js.read_text())
    assert d["values"] == [0.0, 1.0, 2.0] and len(d["acc"]) == 3
    assert d["loss"][0] == pytest.approx(merge_on(
        match_endpoints(la, lb, None), "task_arithmetic", load_split("digits", "test"),
        base=lbase, scale=0.0).loss, abs=1e-12)  # lambda 0: the base itself
    rec = measurement("merge_sweep")
    assert rec.rows(d)[1] == {"scale": 1.0, "loss": d["loss"][1], "acc": d["acc"][1]}
    fig = rec.plot(d, Style())
    assert fig.layout.title.text.startswith("Merged model accuracy against scale")
    assert "λ" in fig.layout.xaxis.title.text and "accuracy" in fig.layout.yaxis.title.text
    assert fig.layout.legend.title.text and [t.name for t in fig.data][0] == "no matching"
    shared = rec.plot(d, Style(font_size=19, accuracy_range=(0.1, 0.9)))
    assert list(shared.layout.yaxis.range) == [0.1, 0.9] and shared.layout.font.size == 19
    assert list(rec.plot(d, Style(fixed_accuracy=True)).layout.yaxis.range) == [0.0, 1.02]
    refused([*args[:-6], "--param", "density"], capfd, ws, "--param density is not a number")
    refused([*args[:-8], "--method", "ties", "--param", "density", "--stop", "1.5"], capfd, ws,
            "--stop 1.5 is outside --density's range", "a number from 0 to 1")


def test_a_sweep_offers_only_numbers_that_change_the_merge(capfd, ws):
    """Each method's `weighted` says what it does: on random tensors its merge at weights
    (0.8, 0.2) and (0.2, 0.8) is the same exactly where it declares the weight unused, and
    differs elsewhere; the sweep then offers no weight to those methods (a flat line), a
    method's own numbers by its widget's label, and refuses the rest in one line each before
    any model loads."""
    import torch

    from rotviz.measures.merge_sweep import axis_label
    from rotviz.merging import method, methods
    from rotviz.merging.combine import combine_one, merge_job
    from rotviz.merging.registry import sweepable

    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g, dtype=torch.float64)
    ts = [base + 0.3 * torch.randn(6, 5, generator=g, dtype=torch.float64) for _ in range(2)]
    weightless = []
    for m in methods():
        if m.needs_statistics:  # fisher, regmean: weighted, and need whole models
            assert m.weighted
            continue
        if m.assemble is not None or m.whole is not None:  # whole models, not tensor by tensor
            continue  # (passthrough stacks blocks; zipit's statistics are the models' features)
        b = base if m.needs_base else None
        one, other = (combine_one(m, merge_job(None, m, w, None, {}), "w", ts, b)
                      for w in ((0.8, 0.2), (0.2, 0.8)))
        assert torch.equal(one, other) == (not m.weighted), m.name
        weightless += [] if m.weighted else [m.name]
    assert set(weightless) == {"sce", "ram", "ramplus_tl", "nearswap", "arcee_fusion"}
    assert sweepable(method("sce")) == ("select_topk",)
    assert sweepable(method("arcee_fusion")) == ()
    assert not method("passthrough").weighted and sweepable(method("passthrough")) == ()
    assert sweepable(method("karcher")) == ("weight", "karcher_tol")  # its steps: an integer
    assert axis_label("nearswap", "nearswap_t") == method("nearswap").params[0].title
    pair = ["merge_sweep", *_refs()[:2], "--data", "digits", "--match", "none"]
    refused([*pair, "--method", "sce", "--base", _refs()[2]], capfd, ws,
            "--method sce takes no weight", "use --param select_topk")
    refused([*pair, "--method", "arcee_fusion", "--param", "weight"], capfd, ws,
            "--method arcee_fusion has no number a sweep can turn")

"""The layerwise record (rotviz.measures.layerwise): the parameter sets each group builds
(only its tensors move), the cumulative series ending on the full path, points checked
against an independent evaluation, the record (CLI JSON, rows, plot, refusals), and at size
(streamed endpoints, `--max-memory 0`) equal to in memory."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import refused, view_of
from pairs import assert_close, default_pair_refs, synthetic_split

from rotviz import measure
from rotviz.analysis.tensor_groups import REST, GroupStates, rise_of
from rotviz.atsize.blocks import open_streamed
from rotviz.atsize.endpoints import streamed_endpoints
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator, barrier_of
from rotviz.match.endpoints import match_endpoints
from rotviz.match.selection import match_options
from rotviz.measures.barrier import curve_on
from rotviz.measures.layerwise import layerwise_on
from rotviz.plots.figure_style import Style
from rotviz.sources.loading import load_model
from rotviz.symmetry.view import read_view


@pytest.fixture(scope="module")
def pairs(loaded):
    """Tiny matched pairs: a ViT (separate Q/K/V) and GPT-2 (fused Q/K/V, tied head), each
    with a small synthetic split."""
    out = {}
    for fam in ("vit", "gpt2"):
        a, b = loaded(fam, 0), loaded(fam, 1)
        out[fam] = (match_endpoints(a, b, "seed"), synthetic_split(a, 8))
    return out


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.dtype == y.dtype and torch.equal(x, y)


@pytest.mark.parametrize("fam", ["vit", "gpt2"])
def test_one_block_moves_only_its_own_tensors(pairs, fam):
    ends, _ = pairs[fam]
    a, m = ends.anchor.state, ends.matched
    before = {k: v.clone() for k, v in a.items()}
    gs = GroupStates(ends.anchor, a, m, "block")
    assert gs.groups == [str(i) for i in range(2)] + [REST]
    moved_somewhere = set()
    for g in gs.groups:
        s = gs.state([g])
        assert list(s) == list(a)
        mine = {k for k in a if gs.block_of(k) == g}
        assert mine, g
        for k in a:
            assert _same(s[k], m[k] if k in mine else a[k]), (g, k)
        moved_somewhere |= {k for k in mine if not torch.equal(a[k], m[k])}
        assert any(not torch.equal(a[k], m[k]) for k in mine)  # the group really moves
    assert moved_somewhere == {k for k in a if not torch.equal(a[k], m[k])}
    every = gs.state(gs.groups)
    assert all(_same(every[k], m[k]) for k in a)
    assert all(torch.equal(before[k], a[k]) for k in a)  # the anchor is not modified


def test_one_kind_moves_only_its_tensors_even_inside_a_fused_projection(pairs):
    ends, _ = pairs["gpt2"]
    anchor = ends.anchor
    a, m = anchor.state, ends.matched
    gs = GroupStates(anchor, a, m, "kind")
    assert gs.groups == ["q", "k", "v", "o", "ffn", "norms", "embeddings"]  # head tied to wte
    va, vm = view_of(anchor), read_view(anchor.spec, anchor.config, m)
    fields = {"q": ("wq", "bq"), "k": ("wk", "bk"), "v": ("wv", "bv")}
    for kind, own in fields.items():
        vs = read_view(anchor.spec, anchor.config, gs.state([kind]))
        for i in range(2):
            for f in ("wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo"):
                want = vm if f in own else va
                assert torch.equal(getattr(vs.blocks[i].attn, f),
                                   getattr(want.blocks[i].attn, f)), (kind, i, f)
            assert torch.equal(vs.blocks[i].ffn.w_in, va.blocks[i].ffn.w_in)
        s = gs.state([kind])
        fused = {k for k in a if ".c_attn." in k}
        assert all(_same(s[k], a[k]) for k in a if k not in fused), kind
    s = gs.state(["ffn"])
    changed = {k for k in a if not torch.equal(s[k], a[k])}
    assert changed and all(".mlp." in k for k in changed)
    assert {k for k in a if ".mlp." in k and not torch.equal(a[k], m[k])} == changed
    every = gs.state(gs.groups)
    assert all(_same(every[k], m[k]) for k in a)


@pytest.mark.parametrize("fam,by", [("vit", "block"), ("vit", "kind"), ("gpt2", "kind")])
def test_the_cumulative_series_ends_on_the_full_path(pairs, fam, by):
    ends, split = pairs[fam]
    r = layerwise_on(ends, split, points=5, by=by)
    c = curve_on(ends, split, points=5)
    assert len(r.cum_loss) == len(r.groups) and r.cumulative[-1].endswith(r.groups[-1])
    assert np.max(np.abs(np.array(r.cum_loss[-1]) - np.array(c.loss))) <= 1e-6
    assert abs(r.full_barrier - c.barrier) <= 1e-6
    assert abs(r.loss_anchor - c.loss[0]) <= 1e-6 and abs(r.loss_source - c.loss[-1]) <= 1e-6
    assert r.cum_loss[0] == r.loss[0]  # the first step is the first group alone
    for loss, bar, rise in zip(r.loss, r.barrier, r.rise, strict=True):
        assert loss[0] == r.loss_anchor  # every path starts at the anchor
        assert bar == barrier_of(r.alphas, loss) and bar >= 0
        assert rise == rise_of(r.alphas, loss, r.loss_source) and rise >= 0
    assert min(r.cum_barrier) >= 0
    assert r.barrier_unmatched is not None and min(r.barrier_unmatched) >= 0
    cu = curve_on(match_endpoints(ends.anchor, ends.source, None), split, points=5)
    assert abs(r.full_barrier_unmatched - cu.barrier) <= 1e-6


def test_a_point_of_one_block_equals_an_independent_evaluation(pairs):
    """The loss at alpha = 0.25 with only block 1 moved, built by hand from the names."""
    ends, split = pairs["vit"]
    r = layerwise_on(ends, split, points=5, by="block", compare=False)
    assert r.barrier_unmatched is None and r.full_barrier_unmatched is None
    ev = Evaluator(ends.anchor, split)
    a, m = ends.anchor.state, ends.matched
    prefix = read_view(ends.anchor.spec, ends.anchor.config, a).layout.blocks[1]
    point = {k: (0.75 * a[k] + 0.25 * m[k]) if k.startswith(prefix) else a[k] for k in a}
    want = ev.evaluate(ev.params(point))[0]
    assert r.loss[1][1] == pytest.approx(want, rel=1e-6)
    # the set the path evaluates, lerp(A, S_1, alpha): every tensor outside block 1 is A's
    pa = ev.params(a)
    pb = ev.params(GroupStates(ends.anchor, a, m, "block").state(["1"]))
    for al in r.alphas:
        for k in pa:
            got = torch.lerp(pa[k], pb[k], al)
            assert k.startswith(prefix) or torch.equal(got, pa[k]), (al, k)
    # block 1 with every other tensor at the anchor is not the anchor: the point moved
    assert abs(want - r.loss_anchor) > 1e-6


def test_unmatched_endpoints_compare_nothing_and_bad_values_are_refused(pairs):
    from rotviz import measure

    ends, split = pairs["vit"]
    plain = match_endpoints(ends.anchor, ends.source, None)
    r = layerwise_on(plain, split, points=3)
    assert r.match == "none" and r.barrier_unmatched is None
    with pytest.raises(RotvizError, match="--by") as e:
        measure("layerwise", ends, split, by="layer")
    assert "\n" not in str(e.value)
    with pytest.raises(RotvizError, match="--points"):
        measure("layerwise", ends, split, points=1)
    sized = SimpleNamespace(at_size=True)  # streamed endpoints: the at-size path checks too
    with pytest.raises(RotvizError, match="--by") as e:
        measure("layerwise", sized, split, by="layer")
    assert "\n" not in str(e.value)


def test_the_record_from_the_cli_json_rows_and_plot(tmp_path, capsys):
    from rotviz.measures import measurement
    from rotviz.plots import style

    a, b = default_pair_refs()
    js = tmp_path / "lw.json"
    rc = main(["layerwise", a, b, "--data", "digits", "--points", "3", "--device", "cpu",
               "--batch-size", "512", "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("layer-wise barriers by block [seed]"), out
    d = json.loads(js.read_text())
    for key in ("by", "alphas", "groups", "barrier", "rise", "loss", "cumulative",
                "cum_barrier", "cum_loss", "full_barrier", "barrier_unmatched",
                "cum_barrier_unmatched", "full_barrier_unmatched", "match", "n"):
        assert key in d, key
    assert d["alphas"] == [0.0, 0.5, 1.0] and d["groups"][-1] == REST
    assert len(d["barrier"]) == len(d["groups"]) == len(d["cum_barrier"])
    assert min(d["barrier"] + d["cum_barrier"] + d["barrier_unmatched"]) >= 0
    m = measurement("layerwise")
    rows = m.rows(d)
    assert [r["group"] for r in rows] == d["groups"]
    assert rows[0]["barrier_unmatched"] == d["barrier_unmatched"][0]
    fig = m.plot(d, Style())
    assert m.plot(d, Style(font_size=19)).layout.font.size == 19 != fig.layout.font.size
    assert fig.layout.title.text and fig.layout.xaxis.title.text == style.LAYER
    assert fig.layout.yaxis.title.text == style.BARRIER and fig.layout.barmode == "group"
    names = [t.name for t in fig.data]
    assert len(names) == 4 and all(names)
    assert {t.marker.color for t in fig.data if t.type == "bar"} <= set(style.OKABE_ITO)


def test_two_points_are_refused_before_any_model_loads(capfd, ws):
    """With the endpoints alone every barrier is 0 by construction: --points 2 is refused
    by the path's one bound (rotviz.limits.POINTS)
    (models that do not exist: a refusal after loading would name them instead)."""
    refused(["layerwise", "nosuch-a", "nosuch-b", "--data", "digits", "--points", "2"],
            capfd, ws, "--points must be an integer from 3 to 1001, got 2")


@pytest.fixture(scope="module")
def streamed_pairs(saved):
    """Tiny pairs (ViT: separate Q/K/V; GPT-2: fused Q/K/V and a tied head), loaded and
    as folders."""
    out = {}
    for fam in ("vit", "gpt2"):
        paths = [str(saved(fam, s)) for s in (0, 1)]
        a, b = load_model(paths[0]), load_model(paths[1])
        out[fam] = (paths, a, b, synthetic_split(a, 8))
    return out


@pytest.mark.parametrize("fam,by,match,compare", [
    ("vit", "block", "seed", "yes"), ("vit", "kind", "seed", "no"),
    ("gpt2", "kind", "seed", "yes"), ("gpt2", "block", "none", "yes")])
def test_streamed_layerwise_equals_in_memory(streamed_pairs, fam, by, match, compare):
    """Every group's and every cumulative step's losses and accuracies, the barriers and
    rises, matched and unmatched, to 1e-5 (the streamed match writes float32 files, so the
    matched source agrees with the held one to about 1e-7, not bit for bit)."""
    paths, a, b, split = streamed_pairs[fam]
    held = match_endpoints(a, b, match_options(match))
    want = measure("layerwise", held, split, points=3, by=by, compare=compare)
    with streamed_endpoints(open_streamed(paths[0]), open_streamed(paths[1]),
                            match_options(match), "cpu") as ends:
        got = measure("layerwise", ends, split, points=3, by=by, compare=compare)
    w, g = want.to_dict(), got.to_dict()
    for k in ("seconds", "device"):
        w.pop(k), g.pop(k)
    assert set(w) == set(g)
    for k, v in w.items():
        if v is None or isinstance(v, str) or (isinstance(v, list) and isinstance(v[0], str)):
            assert v == g[k], k
        elif k in ("anchor", "source", "layers", "n", "match"):
            assert v == g[k], k
        else:
            assert_close(v, g[k], k)
    assert (got.barrier_unmatched is None) == (compare == "no" or match == "none")
    assert max(got.barrier) > 1e-3 and got.groups[-1] in ("rest", "embeddings", "head")

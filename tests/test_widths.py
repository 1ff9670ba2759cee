"""A narrower FFN aligned into a wider one (rotviz.match.widths): the planted assignment is
recovered exactly, the embedded source computes the narrow source's function, the simple
merge keeps the anchor's free units scaled at their output, the CLI writes and merges such a
pair, and bad pairs are refused in one line.

The pairs are planted: the narrow model is a seeded subset of the wide model's FFN units, in a
seeded order, with random attention maps on top (so that matching has something to undo)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from rotviz.arch import spec_named
from rotviz.cli import main
from rotviz.data.split import load_split
from rotviz.errors import RotvizError
from rotviz.groups import inject
from rotviz.match.endpoints import match_endpoints
from rotviz.match.pipeline import match_models
from rotviz.match.selection import match_options
from rotviz.match.widths import Embedding, check_pair
from rotviz.merging.combine import merge_states
from rotviz.random_models import random_model, save_random
from rotviz.runner import measure
from rotviz.sources.adapters import source_of
from rotviz.sources.loading import load_model
from rotviz.sources.running import forward, probe_inputs
from rotviz.symmetry.actions import apply_layer, random_element
from rotviz.symmetry.view import read_view, write_state

WIDE, NARROW = 64, 40
SIZES = dict(layers=2, d=32, heads=4)
EXTRA = {"vit": dict(image=8, patch=2, channels=1, labels=10)}  # reads the digits data
TOL = 1e-4  # the embedded source's logits against the narrow source's


def _plant(root: Path, family: str, seed: int = 0, narrow: int = NARROW, **sizes):
    """(wide model's folder, narrow model's folder, slots per layer): narrow unit j of layer i
    is wide unit slots[i][j] (gate, up and down together), then the narrow model's attention
    is turned by a random Q-K/V-O element (seeded)."""
    sizes = {**SIZES, **EXTRA.get(family, {}), **sizes}
    wide_dir = save_random(family, root / f"{family}-wide", seed=seed, ffn=WIDE, **sizes)
    wide = load_model(wide_dir)
    view = read_view(wide.spec, wide.config, wide.state)
    gen = torch.Generator().manual_seed(seed + 7)
    slots = [torch.randperm(WIDE, generator=gen)[:narrow] for _ in view.blocks]

    def pick(t, s, cols=False):
        return None if t is None else (t[:, s] if cols else t[s])

    blocks = tuple(replace(b, ffn=replace(
        b.ffn, w_in=pick(b.ffn.w_in, s), b_in=pick(b.ffn.b_in, s), w_out=pick(b.ffn.w_out, s, True),
        w_gate=pick(b.ffn.w_gate, s), b_gate=pick(b.ffn.b_gate, s)))
        for b, s in zip(view.blocks, slots, strict=True))
    small = replace(view, blocks=blocks, dims=replace(view.dims, d_ffn=narrow))
    for i, t in random_element(small.dims, seed + 3, ffn=False).items():
        small = apply_layer(small, i, t)
    module, config = random_model(family, seed + 1, ffn=narrow, **sizes)
    missing, unexpected = module.load_state_dict(write_state(small), strict=False)
    assert not unexpected
    narrow_dir = root / f"{family}-narrow"
    source_of(spec_named(family)).save_module(module, config, narrow_dir)
    return wide_dir, narrow_dir, slots


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    cache: dict = {}

    def get(family: str):
        if family not in cache:
            root = tmp_path_factory.mktemp(f"widths-{family}")
            a, n, slots = _plant(root, family)
            cache[family] = (a, n, load_model(a), load_model(n), slots)
        return cache[family]

    return get


def _ffn(state, loaded):
    return read_view(loaded.spec, loaded.config, state).blocks


def test_inject_is_the_best_injective_assignment():
    """Against every injective map of 3 rows into 5 columns (60 of them)."""
    cost = np.random.default_rng(0).normal(size=(3, 5))
    best = max(itertools.permutations(range(5), 3),
               key=lambda cols: sum(cost[j, c] for j, c in enumerate(cols)))
    assert inject(cost).tolist() == list(best)
    with pytest.raises(RotvizError, match="no more rows than columns"):
        inject(cost.T)


@pytest.mark.parametrize("family", ["vit", "llama"])
@pytest.mark.parametrize("spec", ["seed", "weight"])
def test_planted_units_are_recovered_and_the_function_kept(planted, family, spec):
    _, _, anchor, narrow, slots = planted(family)
    before = {k: v.clone() for k, v in narrow.state.items()}
    out = match_models(anchor, narrow, match_options(spec))
    assert out.preserved
    rep = out.report
    assert rep.widths["source_units"] == [NARROW] * 2 and rep.widths["anchor_units"] == [WIDE] * 2
    assert rep.widths["slots"] == [s.tolist() for s in slots]  # exactly the planted slots
    assert rep.max_output_diff < TOL
    # independently: the written state run on the anchor's module against the narrow model
    x = probe_inputs(narrow)
    diff = (forward(anchor, x, out.state) - forward(narrow, x)).abs().max()
    assert float(diff) < TOL
    assert all(out.state[k].shape == anchor.state[k].shape for k in anchor.state)
    assert all(torch.equal(narrow.state[k], before[k]) for k in before)  # not mutated
    emb = Embedding(tuple(slots), ((NARROW, WIDE),) * 2)
    for i, (bm, ba) in enumerate(zip(_ffn(out.state, anchor), _ffn(anchor.state, anchor),
                                     strict=True)):
        s, free = slots[i], emb.free(i)
        assert len(free) == WIDE - NARROW
        fm, fa = bm.ffn, ba.ffn
        # the matched units are the anchor's own (the planted source is a subset of it), gate,
        # up and down together; the free units add nothing (zero out columns)
        torch.testing.assert_close(fm.w_in[s], fa.w_in[s], rtol=0, atol=1e-5)
        torch.testing.assert_close(fm.w_out[:, s], fa.w_out[:, s], rtol=0, atol=1e-5)
        if family == "llama":
            torch.testing.assert_close(fm.w_gate[s], fa.w_gate[s], rtol=0, atol=1e-5)
        col = fm.w_out[:, free]
        if spec == "weight" and family == "vit":  # LayerNorm stream: the anchor's writer
            col = col - col.mean(dim=0)  # means come back (restore), which no reader sees
            assert float(fm.w_out[:, free].abs().max()) > 1e-3
        assert float(col.abs().max()) < 1e-6
        torch.testing.assert_close(fm.w_in[free], fa.w_in[free], rtol=0, atol=1e-5)
        # the attention maps undo the planted rotations
        torch.testing.assert_close(bm.attn.wq, ba.attn.wq, rtol=0, atol=1e-4)
        torch.testing.assert_close(bm.attn.wo, ba.attn.wo, rtol=0, atol=1e-4)


def test_simple_merge_keeps_the_free_units_scaled_at_their_output(planted):
    """Weight w: matched units (1 - w) anchor + w source; a free unit keeps the anchor's
    in-side and (1 - w) of its out column, so it writes (1 - w) of what the anchor's unit
    writes; w = 0 is the anchor, w = 1 the narrow source's function."""
    _, _, anchor, narrow, slots = planted("llama")
    ends = match_endpoints(anchor, narrow, "seed")
    w = 0.3
    merged = merge_states(anchor, "simple", anchor.state, ends.matched, w)
    emb = Embedding(tuple(slots), ((NARROW, WIDE),) * 2)
    blocks = zip(_ffn(merged, anchor), _ffn(anchor.state, anchor),
                 _ffn(dict(ends.matched), anchor), strict=True)
    for i, (bm, ba, bs) in enumerate(blocks):
        free, s = emb.free(i), slots[i]
        for name in ("w_in", "w_gate"):
            assert torch.equal(getattr(bm.ffn, name)[free], getattr(ba.ffn, name)[free])
            torch.testing.assert_close(
                getattr(bm.ffn, name)[s],
                (1 - w) * getattr(ba.ffn, name)[s] + w * getattr(bs.ffn, name)[s])
        torch.testing.assert_close(bm.ffn.w_out[:, free], (1 - w) * ba.ffn.w_out[:, free],
                                   rtol=1e-6, atol=1e-7)
        # one free unit's contribution to the FFN's output, on random inputs: (1 - w) times
        # the anchor's (SwiGLU: silu(x gate^T) * (x up^T) down^T)
        x = torch.randn(5, SIZES["d"], generator=torch.Generator().manual_seed(i))
        k = int(free[0])

        def unit(f, k=k, x=x):
            h = torch.nn.functional.silu(x @ f.w_gate[k]) * (x @ f.w_in[k])
            return h[:, None] * f.w_out[:, k]

        torch.testing.assert_close(unit(bm.ffn), (1 - w) * unit(ba.ffn), rtol=1e-5, atol=1e-6)
    x = probe_inputs(narrow)
    at0 = merge_states(anchor, "simple", anchor.state, ends.matched, 0.0)
    assert all(torch.equal(at0[k], anchor.state[k]) for k in anchor.state)
    at1 = merge_states(anchor, "simple", anchor.state, ends.matched, 1.0)
    assert float((forward(anchor, x, at1) - forward(narrow, x)).abs().max()) < TOL


def test_cli_match_writes_the_embedded_source_and_merge_runs(planted, tmp_path, capsys):
    a_dir, n_dir, anchor, narrow, slots = planted("vit")
    out, rep = tmp_path / "embedded", tmp_path / "report.json"
    assert main(["match", str(a_dir), str(n_dir), "--out", str(out), "--report", str(rep),
                 "--device", "cpu"]) == 0
    assert "max output difference" in capsys.readouterr().out
    back = load_model(out)
    assert back.config["intermediate_size"] == WIDE
    assert all(back.state[k].shape == anchor.state[k].shape for k in anchor.state)
    x = probe_inputs(narrow)
    assert float((forward(back, x) - forward(narrow, x)).abs().max()) < TOL
    assert json.loads(rep.read_text())["widths"]["slots"] == [s.tolist() for s in slots]
    merged, js = tmp_path / "merged", tmp_path / "merge.json"
    assert main(["merge", str(a_dir), str(n_dir), "--match", "seed", "--data", "digits",
                 "--weight", "0.25", "--out", str(merged), "--json", str(js),
                 "--device", "cpu"]) == 0
    assert "merged [simple, match seed" in capsys.readouterr().out
    d = json.loads(js.read_text())
    m = load_model(merged)
    assert all(m.state[k].shape == anchor.state[k].shape for k in anchor.state)
    free = Embedding(tuple(slots), ((NARROW, WIDE),) * 2).free(0)
    fm, fa = _ffn(m.state, anchor)[0].ffn, _ffn(anchor.state, anchor)[0].ffn
    assert torch.equal(fm.w_in[free], fa.w_in[free])
    torch.testing.assert_close(fm.w_out[:, free], 0.75 * fa.w_out[:, free])
    assert 0.0 <= d["acc"] <= 1.0 and d["weight"] == 0.25


def test_bad_pairs_are_refused_in_one_line(planted, tmp_path, capsys):
    a_dir, n_dir, anchor, narrow, _ = planted("vit")
    other = save_random("vit", tmp_path / "wider-d", seed=2, ffn=NARROW,
                        **{**SIZES, **EXTRA["vit"], "d": 48})
    heads = save_random("vit", tmp_path / "heads", seed=2, ffn=NARROW,
                        **{**SIZES, **EXTRA["vit"], "heads": 8})
    cases = [
        (["match", str(a_dir), str(other)], "models differ in shape: hidden_size 32 vs 48"),
        (["merge", str(a_dir), str(heads), "--data", "digits"],
         "models differ in shape: num_attention_heads 4 vs 8"),
        (["match", str(n_dir), str(a_dir)], "wider than the anchor's (layer 0: 64 units vs 40)"),
        (["match", str(a_dir), str(n_dir), "--act", "--data", "digits"], "narrower"),
        (["merge", str(a_dir), str(n_dir), "--match", "none", "--data", "digits"],
         "give --match"),
        (["merge", str(a_dir), str(n_dir), "--data", "digits", "--max-memory", "0"],
         "raise --max-memory"),
        (["plane", str(a_dir), str(n_dir), "--match", "seed", "--data", "digits"],
         "plane also reads the source as it is, in its own width; use barrier, merge, "
         "distances, spectra"),
    ]
    for n, (argv, pattern) in enumerate(cases):
        out = tmp_path / f"out{n}"
        flag = "--out" if argv[0] in ("match", "merge") else "--json"
        rc = main([*argv, flag, str(out), "--device", "cpu"])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and pattern in err, (argv, err)
        assert not out.exists()
    assert check_pair(anchor, narrow) is True
    assert check_pair(anchor, anchor) is False
    ends = match_endpoints(anchor, narrow, "seed")
    with pytest.raises(RotvizError, match="layerwise also reads the source as it is"):
        measure("layerwise", ends, load_split("digits", "test"))
    d = measure("distances", ends)  # reads the anchor and the embedded source only
    assert d["distance_after"] < d["distance_before"] and d["max_output_diff"] < TOL


@pytest.mark.parametrize("method", ["fisher", "regmean"])
def test_methods_with_statistics_keep_the_free_units_in_side(planted, method):
    """Fisher and RegMean merge a free unit's in-side (equal in both: the anchor's) into
    itself; Fisher scales its out column by l_a (F_a + floor) / sum_i l_i (F_i + floor)."""
    from rotviz.measures.merge import merge
    from rotviz.merging.fisher import FISHER_FLOOR

    _, _, anchor, narrow, slots = planted("vit")
    split = load_split("digits", "test")
    w = 0.4
    r = merge(anchor, narrow, method, "seed", split, stats_split="val", weight=w, batches=1,
              batch_size=8)
    free = Embedding(tuple(slots), ((NARROW, WIDE),) * 2).free(1)
    bm, ba = _ffn(r.state, anchor)[1].ffn, _ffn(anchor.state, anchor)[1].ffn
    torch.testing.assert_close(bm.w_in[free], ba.w_in[free], rtol=0, atol=1e-6)
    torch.testing.assert_close(bm.b_in[free], ba.b_in[free], rtol=0, atol=1e-6)
    if method == "fisher":
        name = next(k for k in anchor.state if k.endswith("layers.1.mlp.fc2.weight"))
        fa = r.anchor_stats[name].double()[:, free] + FISHER_FLOOR
        fs = r.source_stats[name].double()[:, free] + FISHER_FLOOR
        want = (1 - w) * fa * ba.w_out[:, free].double() / ((1 - w) * fa + w * fs)
        torch.testing.assert_close(bm.w_out[:, free].double(), want, rtol=1e-5, atol=1e-7)
        assert float(bm.w_out[:, free].abs().max()) > 1e-3


def test_a_half_pair_is_checked_in_its_dtype_too(planted, tmp_path):
    """Both models stored in float16: the embedded source is checked in float32 and, rounded
    to float16 and run in it, against the narrow source run in float16."""
    import copy

    _, _, anchor, narrow, slots = planted("llama")
    half = []
    for m, name in ((anchor, "wide"), (narrow, "narrow")):
        source_of(m.spec).save_module(copy.deepcopy(m.model).half(), m.config, tmp_path / name)
        half.append(load_model(tmp_path / name))
    out = match_models(*half, match_options("seed"))
    rep = out.report
    assert half[1].stored_dtype == torch.float16 and rep.stored_dtype == "float16"
    assert rep.stored_output_diff <= rep.stored_tolerance and out.preserved
    assert rep.max_output_diff < TOL
    assert rep.widths["slots"] == [s.tolist() for s in slots]

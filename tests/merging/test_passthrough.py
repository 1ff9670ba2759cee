"""Passthrough (mergekit's `slices`): a model stacked from layer ranges of the anchor and the
matched source. Each block of the built model equals the block it was copied from bit for
bit, on every family (by the family's block naming), with the config's depth key and
per-layer lists rebuilt; the written folder loads with transformers and evaluates to the
record's loss; bad slices are refused in one line (exit 2). mergekit runs the YAML
(tests/test_mergekit.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from rotviz.analysis.merges import block_check
from rotviz.arch import FAMILIES, spec_named
from rotviz.arch.spec import config_value
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.merging import method
from rotviz.merging.combine import build_pair, merge_states
from rotviz.merging.slices import Slice, check_depths, parse, plan
from rotviz.sources.loading import load_model
from rotviz.sources.running import forward, probe_inputs
from rotviz.sources.stacking import (
    at_block,
    block_of,
    block_state,
    depth_of,
    model_of,
    own_config,
    stacked_config,
)
from rotviz.sources.stacking import stacked as stacked_model
from rotviz.sources.writing import write_model

TEXT = dict(vocab=98, positions=64)  # the text data's characters


def test_slices_read_as_mergekit_layer_ranges():
    s = parse("a:0-4, B:2-6")
    assert s == (Slice(0, 0, 4), Slice(1, 2, 6))
    assert plan(s) == ((0, 0), (0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (1, 4), (1, 5))
    check_depths(s, (4, 6))
    for text, says in (("c:0-2", "unknown model 'c'"), ("a:3-3", "'a:3-3' is empty"),
                       ("a:2-1", "is empty"), ("a0-2", "cannot read 'a0-2'")):
        with pytest.raises(RotvizError, match=says):
            parse(text)
    with pytest.raises(RotvizError, match="'b:2-6' reaches block 5, but the source has "
                                          "blocks 0 to 4"):
        check_depths(s, (4, 5))
    m = method("passthrough")
    assert m.assemble is not None and not m.at_size and m.max_models == 2
    assert m.mergekit.method == "passthrough" and m.mergekit.slices == "slices"


def test_blocks_are_renamed_by_the_family_naming_only():
    """One renaming for both ways in (`stack`, `stacked`): the index the block template
    names, never a `.0.` elsewhere in the name (a root of its own numbered, a template
    with no dot before its index)."""
    spec = dataclasses.replace(spec_named("gpt2"), roots=("net.0.",), block=("h_{i}.",))
    assert block_of(spec, "net.0.h_3.attn.c_attn.weight") == ("net.0.h_", 3, ".attn.c_attn.weight")
    assert at_block(spec, "net.0.h_3.attn.c_attn.weight", 7) == "net.0.h_7.attn.c_attn.weight"
    assert at_block(spec, "net.0.h_0.", 12) == "net.0.h_12."
    with pytest.raises(ValueError, match="no tensor of a gpt2 block"):
        at_block(spec, "net.0.wte.weight", 1)


def test_every_family_stacks_block_by_block(loaded):
    """Three blocks from two 2-block models (a0, b1, a1) on every family: each block equal to
    its source bit for bit in the built module, the rest the anchor's, the depth key 3 and
    the module runs (finite logits on probe inputs)."""
    for fam in FAMILIES:
        a, b = loaded(fam, 0), loaded(fam, 1)
        built = build_pair(a, "passthrough", a.state, b.state, slices="a:0-1,b:1-2,a:1-2")
        assert built.blocks == ((0, 0), (1, 1), (0, 1)) and built.config is not None
        assert config_value(built.config, a.spec.n_layers_key) == 3
        model = model_of(a, built.state, "built", built.config)
        assert depth_of(a.spec, model.state) == 3
        rows = block_check(a.spec, model.state, [a.state, b.state], built.blocks)
        assert all(r["equal"] and r["tensors"] > 0 for r in rows), (fam, rows)
        for k, t in model.state.items():
            if block_of(a.spec, k) is None and k in a.state:
                assert torch.equal(t, a.state[k]), (fam, k)
        # the check can fail: block 1 is not the anchor's block 1
        wrong = block_check(a.spec, model.state, [a.state, b.state], ((0, 0), (0, 1), (0, 1)))
        assert [r["equal"] for r in wrong] == [True, False, True], fam
        logits = forward(model, probe_inputs(model, 2, 0))
        assert torch.isfinite(logits).all(), fam


def test_per_layer_settings_follow_their_blocks(loaded, tmp_path):
    """Gemma2 alternates sliding and full attention per layer: each block keeps its own.
    Two ways in, one model: stacked from blocks 1, 0, 1 by passthrough (state dicts) and by
    `stacked` (a model's blocks, as depth merging builds) it has the same tensors and config;
    the writer writes that config (it names other blocks than the folder's) and the folder
    loads back as that model."""
    a = loaded("gemma2", 0)
    kinds = a.config["layer_types"]
    assert len(set(kinds)) == 2  # else the blocks' settings could not be told apart
    built = build_pair(a, "passthrough", a.state, a.state, slices="a:1-2,b:0-2")
    assert built.config["layer_types"] == [kinds[i] for i in (1, 0, 1)]
    via = model_of(a, built.state, "via", built.config)
    b = stacked_model(a, [block_state(a, i) for i in (1, 0, 1)], "b", origins=(1, 0, 1))
    assert b.config == built.config and via.state.keys() == b.state.keys()
    assert all(torch.equal(via.state[k], b.state[k]) for k in b.state)
    assert own_config(a.spec, b.config, a.config) == b.config
    assert own_config(a.spec, a.config, a.config) is None
    write_model(b, b.state, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["layer_types"] == \
        b.config["layer_types"]
    x = probe_inputs(b, 2, 0)
    assert (forward(load_model(tmp_path), x) - forward(b, x)).abs().max() < 1e-5
    # a one-block model: only lists named for layers follow the blocks, not `architectures`
    one = {"num_hidden_layers": 1, "architectures": ["X"], "layer_types": ["full"]}
    assert stacked_config(a.spec, [one, one], ((0, 0), (1, 0))) == \
        {"num_hidden_layers": 2, "architectures": ["X"], "layer_types": ["full", "full"]}


def test_the_ends_and_a_kept_depth(loaded):
    """`slices` ends: embeddings of the first slice's model, final norm and head of the
    last's (mergekit's rule); a kept depth is a plain merge the sweep and table take, another
    depth is refused there in one line."""
    a, b = loaded("llama", 0), loaded("llama", 1)
    for slices, first, last in (("b:0-1,a:1-2", b, a), ("a:0-1,b:1-2", a, b)):
        st = build_pair(a, "passthrough", a.state, b.state, slices=slices,
                        passthrough_ends="slices").state
        assert torch.equal(st["model.embed_tokens.weight"],
                           first.state["model.embed_tokens.weight"]), slices
        for k in ("model.norm.weight", "lm_head.weight"):
            assert torch.equal(st[k], last.state[k]), (slices, k)
    kept = merge_states(a, "passthrough", a.state, b.state)  # default: a's half, then b's
    assert torch.equal(kept["model.layers.1.mlp.up_proj.weight"],
                       b.state["model.layers.1.mlp.up_proj.weight"])
    with pytest.raises(RotvizError, match="only `rotviz merge` evaluates and writes it"):
        merge_states(a, "passthrough", a.state, b.state, slices="a:0-2,b:0-2")


@pytest.fixture(scope="module")
def stacked(saved, tmp_path_factory):
    """`rotviz merge --method passthrough` of two tiny LLaMAs, matched (weight), written with
    its JSON and mergekit's YAML (and the matched source beside it)."""
    a, b = saved("llama", 0, **TEXT), saved("llama", 1, **TEXT)
    root = tmp_path_factory.mktemp("passthrough")
    text = root / "t.txt"
    text.write_text("\n".join("abcdefgh "[i % 9:] + "hgfedcba" for i in range(30)))
    out, js, yml = root / "out", root / "r.json", root / "m.yaml"
    argv = ["merge", str(a), str(b), "--data", f"text:{text}", "--device", "cpu", "--method",
            "passthrough", "--slices", "a:0-2,b:1-2,a:1-2"]
    assert main([*argv, "--out", str(out), "--json", str(js), "--mergekit-config",
                 str(yml)]) == 0
    return a, b, root, out, json.loads(js.read_text()), argv, text


def test_the_written_model_is_its_blocks_and_evaluates(stacked, capsys):
    a, _, root, out, d, _, text = stacked
    assert d["depth"] == 4 and [(r["model"], r["from"]) for r in d["block_checks"]] == \
        [("anchor", 0), ("anchor", 1), ("source", 1), ("anchor", 1)]
    assert all(r["equal"] and r["max_diff"] == 0.0 for r in d["block_checks"])
    assert d["params"] == {"slices": "a:0-2,b:1-2,a:1-2", "passthrough_ends": "anchor"}
    # the files, bit for bit: each block against the anchor's or the matched source's file
    mine, anchor = load_file(out / "model.safetensors"), load_file(a / "model.safetensors")
    matched = load_file(root / "m-matched" / "model.safetensors")
    src = {0: anchor, 1: matched}
    for k, t in mine.items():
        if k.startswith("model.layers."):
            i, rest = int(k.split(".")[2]), ".".join(k.split(".")[3:])
            model, index = ((0, 0), (0, 1), (1, 1), (0, 1))[i]
            assert torch.equal(t, src[model][f"model.layers.{index}.{rest}"]), k
        else:
            assert torch.equal(t, anchor[k]), k
    assert len(mine) == len(anchor) + 2 * 9  # two blocks of nine tensors more
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 4
    capsys.readouterr()
    assert main(["eval", str(out), "--data", f"text:{text}", "--device", "cpu"]) == 0
    said = capsys.readouterr().out
    assert f"loss {d['loss']:.4f}" in said, (said, d["loss"])


@pytest.mark.parametrize("slices, says", [
    ("a:0-2,b:1-3", "'b:1-3' reaches block 2, but the source has blocks 0 to 1"),
    ("a:1-1", "'a:1-1' is empty"),
    ("a:0-1,c:0-1", "unknown model 'c'"),
])
def test_bad_slices_one_line_exit_2(stacked, tmp_path, capsys, slices, says):
    _, _, _, _, _, argv, _ = stacked
    capsys.readouterr()
    rc = main([*argv[:-1], slices, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and says in err[0], err
    assert not (tmp_path / "o").exists()


def test_depths_are_checked_before_matching(loaded, monkeypatch):
    """The slices against the loaded pair's depths, before any matching is computed."""
    import rotviz.match.endpoints as endpoints
    from rotviz.measures.merge import merge
    from tests.pairs import synthetic_split

    a = loaded("llama", 0)

    def no_matching(*_, **__):
        raise AssertionError("matched before the slices were checked")

    monkeypatch.setattr(endpoints, "match_endpoints", no_matching)
    with pytest.raises(RotvizError, match="'a:1-3' reaches block 2, but the anchor"):
        merge(a, loaded("llama", 1), "passthrough", "seed", synthetic_split(a, 4),
              slices="a:1-3")


def test_at_size_and_mergekit_refusals(stacked, tmp_path, capsys):
    _, _, _, _, _, argv, _ = stacked
    for extra, says in ((["--max-memory", "0"], "builds a model of its own depth"),
                        (["--mergekit-config", str(tmp_path / "m.yaml"), "--slices",
                          "a:0-1,b:1-2"], "use --passthrough-ends slices")):
        capsys.readouterr()
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err

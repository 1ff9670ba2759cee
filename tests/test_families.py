"""Each family's quirks and their symmetry groups, beyond the tests every family runs (the
`family` fixture): each head class's bit-exact round trip, planted elements of each family's
quirk (partial rotary, parallel residual, Q/K/V biases, restricted Q-K maps under q/k norms,
(1 + w) norms, DeBERTa's position projections, GPT-2's CRFM flags), negative controls just
outside each group, matched models that reload with the stock transformers class, and
refusals in one line."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rotviz.arch import FAMILIES, Sizes, family_module, spec_for, spec_named
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.groups import random_orthogonal, random_rope_maps, rope_maps, rope_pairs
from rotviz.match.distances import distances, norm
from rotviz.match.engine import match
from rotviz.match.options import MatchOptions
from rotviz.random_models import random_model, save_random
from rotviz.sources.loading import Loaded, load_model
from rotviz.sources.running import forward, max_output_diff, probe_inputs
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import (
    LayerTransform,
    apply,
    apply_layer,
    qk_fixed_pairs,
    random_element,
    transform_qk,
)
from rotviz.symmetry.view import read_view, write_state

F64 = torch.float64
TOL = 1e-4  # float32 logits
BROKEN = 1e-2  # a map outside the group moves the logits by far more than this
TEXT = tuple(f for f in FAMILIES if spec_named(f).inputs == "tokens")
SUFFIXES = ("ForCausalLM", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
            "ForQuestionAnswering")


def _loaded(family: str, seed: int = 0, dtype=torch.float32, **options) -> Loaded:
    model, config = random_model(family, seed, dtype=dtype, **options)
    config = model.config.to_dict()
    return Loaded(f"random:{family}:{seed}", Path("."), config, spec_for(config), model,
                  dict(model.state_dict()))


def _view(loaded: Loaded):
    return read_view(loaded.spec, loaded.config, loaded.state)


# ---- every head class: a bit-exact round trip in float32 and bfloat16 ----------------------


def _head_classes(family: str) -> list[str]:
    """The model classes transformers ships for `family` among the heads rotviz reads: its
    random model's own and every `<Prefix>For...` of SUFFIXES that exists."""
    import transformers as T

    base = family_module(family).random_config(Sizes())["architectures"][0]
    prefix = re.split("For|LMHead", base)[0]
    names = [base] + [prefix + s for s in SUFFIXES if hasattr(T, prefix + s)]
    return list(dict.fromkeys(names))


HEADS = [(f, c) for f in TEXT for c in _head_classes(f)]


@pytest.mark.parametrize(("family", "cls"), HEADS, ids=[f"{f}-{c}" for f, c in HEADS])
def test_every_head_class_round_trips_bit_for_bit(family, cls):
    import transformers as T

    config = family_module(family).random_config(Sizes()) | {"architectures": [cls]}
    if "Classification" in cls or "QuestionAnswering" in cls:
        config |= {"num_labels": 3, "id2label": {0: "a", 1: "b", 2: "c"},
                   "label2id": {"a": 0, "b": 1, "c": 2}}
    if "QuestionAnswering" in cls:  # answer start and end (DistilBERT's class insists)
        config |= {"num_labels": 2, "id2label": {0: "a", 1: "b"}, "label2id": {"a": 0, "b": 1}}
    hf = T.AutoConfig.for_model(**config)
    torch.manual_seed(0)
    model = getattr(T, cls)(hf)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # biases and gains off their init
    spec = spec_for(hf.to_dict())
    assert spec.family == family
    for dtype in (torch.float32, torch.bfloat16):
        state = {k: v.detach().to(dtype) for k, v in model.state_dict().items()}
        out = write_state(read_view(spec, hf.to_dict(), state))
        assert list(out) == list(state)
        for k in state:
            assert out[k].dtype == state[k].dtype and torch.equal(out[k], state[k]), (dtype, k)


# ---- planted elements of each family's quirk --------------------------------------------------

VARIANTS = {
    "gpt2-crfm-flags": ("gpt2", dict(scale_by_layer=True, reorder_upcast=True)),
    "gpt-neox-sequential": ("gpt-neox", dict(parallel=False)),
    "gpt-neox-rotary-half": ("gpt-neox", dict(rotary_pct=0.5)),
    "phi3-partial-rotary": ("phi3", dict(rotary=0.5)),
    "qwen2-untied": ("qwen2", dict(tie=False)),
    "deberta-v2-separate-position-projections": ("deberta-v2", dict(share_att_key=False)),
    "deberta-v2-masked-lm": ("deberta-v2", dict(lm=True)),
    "gemma-untied": ("gemma", dict(tie=False)),
    "gemma2-untied": ("gemma2", dict(tie=False)),
    "qwen3-untied": ("qwen3", dict(tie=False)),
}


def _eager(loaded: Loaded) -> Loaded:
    """GPT-2's reorder_and_upcast_attn runs only in the eager attention: use it."""
    loaded.model.config._attn_implementation = "eager"
    return loaded


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_planted_element_keeps_the_function_and_is_recovered(variant):
    family, options = VARIANTS[variant]
    model = _eager(_loaded(family, **options))
    view = _view(model)
    element = random_element(view.dims, seed=11, heads=True)
    image = apply(view, element)
    assert distances(image, view).total / norm(view) > 0.1  # it moved far
    assert max_output_diff(model, model.state, write_state(image)) <= TOL
    original = view.to(F64)
    result = match(original, apply(original, element), MatchOptions(heads=True))
    assert distances(result.view, original).total / norm(original) <= 1e-5


def _qwen3_with_equal_gains() -> Loaded:
    """A Qwen3 whose q/k gains are equal on the first two frequency pairs of every layer, so
    those pairs may turn by any angle; the others only flip."""
    model = _loaded("qwen3")
    i, j = rope_pairs(model.model.config.head_dim, "rotate_half")
    with torch.no_grad():
        for layer in model.model.model.layers:
            for norm_ in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm_.weight[j[:2]] = norm_.weight[i[:2]]
    return Loaded(model.ref, model.path, model.config, model.spec, model.model,
                  dict(model.model.state_dict()))


def test_qwen3_turns_pairs_whose_gains_are_equal_and_only_flips_the_others():
    model = _qwen3_with_equal_gains()
    view = _view(model)
    fixed = qk_fixed_pairs(view.blocks[0].attn, view.dims.rope)
    assert fixed.tolist() == [False, False, True, True]
    gen = torch.Generator().manual_seed(5)
    h = view.dims.n_kv_heads
    theta = 2 * torch.pi * torch.rand(h, 4, generator=gen, dtype=F64)
    theta[:, 2:] = torch.pi * torch.randint(0, 2, (h, 2), generator=gen).to(F64)  # 0 or pi
    a = rope_maps(torch.cos(theta), torch.sin(theta), view.dims.rope)
    element = {i: LayerTransform(qk=a) for i in range(view.dims.n_layers)}
    image = apply(view, element)
    assert max_output_diff(model, model.state, write_state(image)) <= TOL
    original = view.to(F64)
    result = match(original, apply(original, element), MatchOptions(ffn=False, rescale=False))
    assert distances(result.view, original).total / norm(original) <= 1e-5


# ---- negative controls: a map just outside each group breaks the function --------------------


def _unchecked_qk(view, a) -> dict:
    """The state with Q-K maps `a` on layer 0, applied without any check (transform_qk with
    no rotary layout to keep)."""
    blk = view.blocks[0]
    return write_state(view.with_block(0, replace(blk, attn=transform_qk(blk.attn, a))))


ROPE = tuple(f for f in TEXT if spec_named(f).rope is not None)


@pytest.mark.parametrize("family", ROPE)
def test_a_full_qk_rotation_under_rope_breaks_the_function(family):
    """Under rotary embeddings (partial or not, with or without q/k norms), an orthogonal Q-K
    map that is not per-pair breaks the function, and the library refuses it."""
    model = _loaded(family)
    view = _view(model)
    gen = torch.Generator().manual_seed(3)
    a = random_orthogonal(view.dims.n_kv_heads, view.dims.d_head, gen)
    assert max_output_diff(model, model.state, _unchecked_qk(view, a)) > BROKEN
    with pytest.raises(RotvizError) as e:
        apply_layer(view, 0, LayerTransform(qk=a))
    assert "\n" not in str(e.value)


def test_neox_maps_may_not_mix_rotary_and_other_dims():
    """Block-diagonal maps (per-pair on the rotary dims, orthogonal on the rest) keep GPT-NeoX;
    an orthogonal map of all its dims does not."""
    model = _loaded("gpt-neox")
    view = _view(model)
    gen = torch.Generator().manual_seed(4)
    dims = view.dims
    good = random_rope_maps(dims.n_kv_heads, dims.d_head, dims.rope, gen)
    assert dims.rope == "rotate_half:2"  # 0.25 of 8 dims
    assert max_output_diff(model, model.state,
                           write_state(apply(view, {0: LayerTransform(qk=good)}))) <= TOL
    mixed = random_orthogonal(dims.n_kv_heads, dims.d_head, gen)
    assert max_output_diff(model, model.state, _unchecked_qk(view, mixed)) > BROKEN


def test_qwen3_turning_a_pair_whose_gains_differ_breaks_the_function():
    model = _loaded("qwen3")
    view = _view(model)
    assert bool(qk_fixed_pairs(view.blocks[0].attn, view.dims.rope).all())
    gen = torch.Generator().manual_seed(6)
    a = random_rope_maps(view.dims.n_kv_heads, view.dims.d_head, view.dims.rope, gen)
    assert max_output_diff(model, model.state, _unchecked_qk(view, a)) > BROKEN
    with pytest.raises(RotvizError, match="qwen3 normalises each head's queries and keys"):
        apply_layer(view, 0, LayerTransform(qk=a))


def test_deberta_position_projections_must_move_with_queries_and_keys():
    model = _loaded("deberta-v2", share_att_key=False)
    view = _view(model)
    attn = view.blocks[0].attn
    assert attn.wpq is not None and attn.wpk is not None
    gen = torch.Generator().manual_seed(7)
    a = random_orthogonal(view.dims.n_kv_heads, view.dims.d_head, gen)
    moved = transform_qk(attn, a)
    assert max_output_diff(model, model.state, write_state(view.with_block(
        0, replace(view.blocks[0], attn=moved)))) <= TOL
    half = replace(moved, wpq=attn.wpq, bpq=attn.bpq, wpk=attn.wpk, bpk=attn.bpk)
    assert max_output_diff(model, model.state, write_state(view.with_block(
        0, replace(view.blocks[0], attn=half)))) > BROKEN


@pytest.mark.parametrize("family", ["deberta-v2", "gemma2", "olmo2"])
def test_a_rotation_of_a_permutation_only_stream_breaks_the_function(family):
    model = _loaded(family, **(family_module(family).UNTIED or {}))
    view = _view(model)
    assert rs.group_of(view) == "permutation"
    q = random_orthogonal(1, view.dims.d_model, torch.Generator().manual_seed(8))[0]
    broken = rs.apply_residual(view, q, check=False)
    assert max_output_diff(model, model.state, write_state(broken)) > BROKEN
    perm = torch.eye(view.dims.d_model, dtype=F64)[torch.randperm(view.dims.d_model)]
    kept = rs.apply_residual(view, perm)
    assert max_output_diff(model, model.state, write_state(kept)) <= TOL


def test_gemma_folds_one_plus_w_not_w():
    model = _loaded("gemma", tie=False)
    view = _view(model)
    canon, _ = rs.canonicalise(view)
    assert max_output_diff(model, model.state, write_state(canon)) <= TOL
    assert all(bool((b.norms["attn_in"].weight == 0).all()) for b in canon.blocks)  # gain 1
    wrong, _ = rs.canonicalise(replace(view, spec=replace(view.spec, norm_offset=0.0)))
    assert max_output_diff(model, model.state, write_state(wrong)) > BROKEN


def test_phi3_moves_both_halves_of_its_fused_gate_up():
    model = _loaded("phi3")
    view = _view(model)
    perm = torch.randperm(view.dims.d_ffn, generator=torch.Generator().manual_seed(9))
    kept = apply(view, {0: LayerTransform(perm=perm)})
    assert max_output_diff(model, model.state, write_state(kept)) <= TOL
    ffn = view.blocks[0].ffn
    up_only = replace(view.blocks[0], ffn=replace(ffn, w_in=ffn.w_in[perm]))
    assert max_output_diff(model, model.state, write_state(view.with_block(0, up_only))) > BROKEN
    key = view.layout.blocks[0] + view.layout.roles["ffn_in"] + ".weight"
    assert torch.equal(write_state(kept)[key][perm.shape[0]:], ffn.w_in[perm])  # [gate; up]


# ---- the matched model reloads with the stock class -----------------------------------------

NEW = ("mistral", "qwen2", "gemma", "gemma2", "gpt-neox", "phi3", "qwen3", "deberta-v2", "olmo2",
       "falcon")
NEW += ("modernbert", "distilbert", "electra")  # issue 50's encoders


@pytest.mark.parametrize("family", NEW)
def test_a_matched_model_reloads_with_the_stock_class(family, tmp_path, capsys):
    import transformers as T

    options = family_module(family).UNTIED
    dirs = [save_random(family, tmp_path / f"m{s}", seed=s, **(options or {})) for s in (0, 1)]
    out = tmp_path / "matched"
    # two rounds: what is written, not how far the alternation gets, is under test here
    extra = ["--heads", "--residual", "--rounds", "2"] if options is not None else []
    rc = main(["match", str(dirs[0]), str(dirs[1]), "--out", str(out), *extra])
    assert rc == 0, capsys.readouterr().err
    matched = load_model(out)
    x = probe_inputs(matched)
    want = forward(matched, x)
    cls = getattr(T, matched.config["architectures"][0])
    stock = cls.from_pretrained(str(out)).eval()
    with torch.no_grad():
        got = stock(**x).logits
    assert (got.double() - want.double()).abs().max() <= 1e-5
    source = load_model(dirs[1])
    assert max_output_diff(source, source.state, matched.state) <= TOL


# ---- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(("family", "group", "allowed"), [
    ("deberta-v2", "orthogonal", "coordinate permutation"),
    ("gemma2", "centred", "coordinate permutation"),
    ("gpt-neox", "orthogonal", "orthogonal with Q 1 = 1"),
])
def test_a_stream_map_the_family_lacks_is_refused_in_one_line(family, group, allowed, tmp_path,
                                                               capsys):
    options = family_module(family).UNTIED or {}
    dirs = [save_random(family, tmp_path / f"m{s}", seed=s, **options) for s in (0, 1)]
    rc = main(["match", str(dirs[0]), str(dirs[1]), "--out", str(tmp_path / "out"),
               "--residual", "--residual-group", group])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert family in err and group in err and allowed in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("key", "value", "words"), [
    ("conv_kernel_size", 3, "conv_kernel_size"),
    ("embedding_size", 16, "embedding_size != hidden_size"),
])
def test_deberta_parts_rotviz_cannot_map_are_refused_in_one_line(key, value, words, tmp_path,
                                                                  capsys):
    import transformers as T

    config = family_module("deberta-v2").random_config(Sizes()) | {key: value}
    for s in (0, 1):
        torch.manual_seed(s)
        T.DebertaV2ForSequenceClassification(T.AutoConfig.for_model(**config)).save_pretrained(
            tmp_path / f"m{s}")
    capsys.readouterr()  # (transformers' progress bars)
    rc = main(["match", str(tmp_path / "m0"), str(tmp_path / "m1"), "--out",
               str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and words in err and "deberta-v2" in err


def test_deberta_masked_lm_that_decodes_with_the_embeddings_gets_no_stream_map(tmp_path, capsys):
    import transformers as T

    config = family_module("deberta-v2").random_config(Sizes(), lm=True) | {"legacy": False}
    for s in (0, 1):
        torch.manual_seed(s)
        T.DebertaV2ForMaskedLM(T.AutoConfig.for_model(**config)).save_pretrained(
            tmp_path / f"m{s}")
    capsys.readouterr()  # (transformers' progress bars)
    rc = main(["match", str(tmp_path / "m0"), str(tmp_path / "m1"), "--out",
               str(tmp_path / "out"), "--residual"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "lm_predictions.lm_head.dense" in err
    rc = main(["match", str(tmp_path / "m0"), str(tmp_path / "m1"), "--out",
               str(tmp_path / "out")])  # the per-layer maps are fine
    assert rc == 0, capsys.readouterr().err


QA = ("bert", "llama", "gpt-neox", "deberta-v2")
QA += ("modernbert",)  # its QA head reads every position through head.dense


@pytest.mark.parametrize("family", QA)
def test_question_answering_heads_follow_the_stream(family, tmp_path, capsys):
    """`qa_outputs` reads the stream at every position: weight matching (stream maps
    included) keeps the start and end logits, and data commands say in one line that rotviz
    cannot score the head."""
    import transformers as T

    base = family_module(family).random_config(Sizes(vocab=98), positions=64)
    prefix = re.split("For|LMHead", base["architectures"][0])[0]
    config = base | {"architectures": [f"{prefix}ForQuestionAnswering"], "num_labels": 2,
                     "id2label": {0: "a", 1: "b"}, "label2id": {"a": 0, "b": 1}}
    for s in (0, 1):
        torch.manual_seed(s)
        model = getattr(T, config["architectures"][0])(T.AutoConfig.for_model(**config))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        model.save_pretrained(tmp_path / f"m{s}")
    capsys.readouterr()  # (transformers' progress bars)
    out = tmp_path / "out"
    rc = main(["match", str(tmp_path / "m0"), str(tmp_path / "m1"), "--out", str(out),
               "--heads", "--residual", "--report", str(tmp_path / "r.json")])
    assert rc == 0, capsys.readouterr().err
    source, matched = load_model(tmp_path / "m1"), load_model(out)
    assert max_output_diff(source, source.state, matched.state) <= TOL
    assert forward(source, probe_inputs(source)).shape[-1] == 2  # start and end logits
    capsys.readouterr()
    rc = main(["eval", str(out), "--data", "pystdlib"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err, err

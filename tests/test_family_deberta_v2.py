"""DeBERTa-v2/v3 in rotviz: disentangled attention, relative embeddings on the stream.

Tiny random models (2 layers, d = 32, 4 heads, FFN 64) in variants: v3 (`share_att_key`: the
relative embeddings go through each layer's own query/key projections), v2 (separate
pos_query_proj / pos_key_proj, which must move like Q / K), v2 with absolute positions and
token types, v2 with one relative term (c2p or p2c), and the masked-LM / token-classification
heads. Function checks in float32 (max logit difference <= 1e-4), recovery in float64
(relative distance <= 1e-5).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import assert_state_equal, clone_state, view_of

from rotviz.arch import spec_named
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.groups import random_orthogonal
from rotviz.match.distances import distances, norm
from rotviz.match.engine import match
from rotviz.match.options import MatchOptions
from rotviz.random_models import random_config
from rotviz.sources.loading import load_model
from rotviz.sources.running import forward, max_output_diff, probe_inputs
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import apply, random_element, transform_qk
from rotviz.symmetry.view import read_view, write_state

FAMILY = "deberta-v2"
F64 = torch.float64
TOL = 1e-4
BROKEN = 1e-2
RECOVERED = 1e-5
VARIANTS = {
    "v3": {},
    "v2": dict(share_att_key=False),
    "v2-abs-types": dict(share_att_key=False, absolute=True, token_types=2),
    "v2-c2p": dict(share_att_key=False, pos_att_type="c2p"),  # pos_key_proj alone
    "v2-p2c": dict(share_att_key=False, pos_att_type="p2c"),  # pos_query_proj alone
}
HEADS = {"seq": {}, "mlm": dict(lm=True), "token": dict(token=True)}
RESIDUAL_ONLY = MatchOptions(ffn=False, attn=False, rescale=False, residual=True)


@pytest.fixture(scope="module")
def deberta(saved):
    """`deberta(variant, seed, dtype, head)`: a cached tiny model (never modify it)."""
    cache: dict[tuple, object] = {}

    def get(variant: str = "v3", seed: int = 0, dtype=None, head: str = "seq"):
        key = (variant, seed, dtype, head)
        if key not in cache:
            path = saved(FAMILY, seed, **VARIANTS[variant], **HEADS[head])
            cache[key] = load_model(path, dtype=dtype)
        return cache[key]

    return get


def _diff(model, view) -> float:
    return max_output_diff(model, model.state, write_state(view))


@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("variant", ["v3", "v2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_bit_exact(deberta, variant, head, dtype):
    model = deberta(variant, head=head)
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in model.state.items()}
    before = clone_state(state)
    view = read_view(model.spec, model.config, state)
    shared = variant == "v3"
    a = view.blocks[0].attn
    assert (a.wpq is None) is shared and (a.wpk is None) is shared
    if not shared:
        assert a.wpq.shape == a.wpk.shape == (4, 8, 32)
        assert a.bpq.shape == a.bpk.shape == (4, 8)
    assert any(k.endswith("rel_embeddings.weight") for k in view.layout.writers)
    out = write_state(view)
    assert list(out) == list(state)
    assert_state_equal(out, state)
    assert_state_equal(state, before)
    assert_state_equal(write_state(view.to(dtype=F64)), state)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_planted_element_keeps_the_function_and_is_recovered(deberta, variant):
    model = deberta(variant)
    view = view_of(model)
    element = random_element(view.dims, 42, heads=True)
    assert _diff(model, apply(view, element)) <= TOL
    original = view_of(deberta(variant, 0, F64))
    image = apply(original, element)
    assert distances(image, original).total / norm(original) > 0.1
    out = match(original, image, MatchOptions(heads=True))
    assert distances(out.view, original).total / norm(original) <= RECOVERED


@pytest.mark.parametrize("kind", ["ffn", "attn", "rescale"])
def test_each_symmetry_alone_is_recovered(deberta, kind):
    only = {"ffn": dict(attn=False, rescale=False), "attn": dict(ffn=False, rescale=False),
            "rescale": dict(ffn=False)}[kind]
    original = view_of(deberta("v2", 0, F64))
    image = apply(original, random_element(original.dims, 3, **only))
    assert _diff(deberta("v2"), apply(view_of(deberta("v2")),
                                      random_element(original.dims, 3, **only))) <= TOL
    out = match(original, image)
    assert distances(out.view, original).total / norm(original) <= RECOVERED


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_planted_stream_permutation_keeps_the_function_and_is_recovered(deberta, variant):
    model = deberta(variant)
    canon, _ = rs.canonicalise(view_of(model))
    assert rs.group_of(canon) == "permutation"
    image = rs.apply_residual(canon, rs.random_map(canon, seed=7))
    assert distances(image, canon).total > 1.0
    assert _diff(model, image) <= TOL
    canon64, _ = rs.canonicalise(view_of(deberta(variant, 0, F64)))
    image64 = rs.apply_residual(canon64, rs.random_map(canon64, seed=7))
    out = match(canon64, image64, RESIDUAL_ONLY)
    assert distances(out.view, canon64).total / norm(canon64) <= RECOVERED


def test_stream_rotation_breaks_the_function(deberta):
    """Negative control: an orthogonal map that is not a permutation is outside the group."""
    model = deberta("v3")
    canon, _ = rs.canonicalise(view_of(model))
    q = random_orthogonal(1, canon.dims.d_model, torch.Generator().manual_seed(0))[0]
    image = rs.apply_residual(canon, q, check=False)
    assert _diff(model, image) > BROKEN
    with pytest.raises(RotvizError):
        rs.apply_residual(canon, q)


def test_qk_map_without_the_position_projections_breaks_the_function(deberta):
    """Negative control (v2): a Q-K map on query_proj / key_proj that leaves pos_query_proj /
    pos_key_proj behind changes the c2p and p2c scores; moving them too keeps the function."""
    model = deberta("v2")
    view = view_of(model)
    a = torch.linalg.qr(torch.randn(4, 8, 8, generator=torch.Generator().manual_seed(1)))[0]
    moved = transform_qk(view.blocks[0].attn, a)
    assert _diff(model, view.with_block(0, replace(view.blocks[0], attn=moved))) <= TOL
    old = view.blocks[0].attn
    left = replace(moved, wpq=old.wpq, bpq=old.bpq, wpk=old.wpk,
                   bpk=old.bpk)
    assert _diff(model, view.with_block(0, replace(view.blocks[0], attn=left))) > BROKEN


def test_masked_lm_and_token_heads_keep_the_function(deberta):
    for head in ("mlm", "token"):
        model = deberta("v2", head=head)
        view = view_of(model)
        assert _diff(model, apply(view, random_element(view.dims, 5, heads=True))) <= TOL
    token = view_of(deberta("v3", head="token"))
    canon, _ = rs.canonicalise(token)
    image = rs.apply_residual(canon, rs.random_map(canon, seed=3))
    assert _diff(deberta("v3", head="token"), image) <= TOL
    # the legacy masked-LM decoder is the word embedding table: residual maps are refused
    assert "untie" in rs.unsupported(view_of(deberta("v3", head="mlm")))


@pytest.mark.parametrize("variant", ["v3", "v2"])
def test_cli_match_writes_a_folder_the_stock_class_loads(deberta, saved, tmp_path, capsys,
                                                          variant):
    import transformers

    a_dir, s_dir = (saved(FAMILY, s, **VARIANTS[variant]) for s in (0, 1))
    out = tmp_path / "matched"
    rc = main(["match", str(a_dir), str(s_dir), "--out", str(out), "--heads", "--residual",
               "--device", "cpu"])
    assert rc == 0, capsys.readouterr().err
    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    assert arch == "DebertaV2ForSequenceClassification"
    stock = getattr(transformers, arch).from_pretrained(str(out)).eval()
    source, matched = deberta(variant, 1), load_model(out)
    x = probe_inputs(source, n=3, seed=7)
    with torch.no_grad():
        ours = stock(**x).logits
    assert (ours - forward(matched, x)).abs().max() <= 1e-5
    assert (ours - forward(source, x)).abs().max() <= TOL
    anchor = deberta(variant, 0)
    assert distances(view_of(matched), view_of(anchor)).total < \
        distances(view_of(source), view_of(anchor)).total


@pytest.mark.parametrize("group", ["orthogonal", "centred"])
def test_larger_residual_group_is_a_one_line_refusal(saved, tmp_path, capsys, group):
    a_dir, s_dir = saved(FAMILY, 0), saved(FAMILY, 1)
    rc = main(["match", str(a_dir), str(s_dir), "--out", str(tmp_path / "o"), "--residual",
               "--residual-group", group, "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert FAMILY in err and group in err and "permutation" in err


@pytest.mark.parametrize("key,value,name", [("conv_kernel_size", 3, "conv_kernel_size"),
                                            ("embedding_size", 16, "embedding_size")])
def test_unsupported_configs_are_refused_in_one_line(key, value, name):
    import transformers as T

    from rotviz.arch import Sizes

    cfg = random_config(FAMILY, Sizes(**{"layers": 2, "d": 32, "heads": 4, "ffn": 64}))
    cfg[key] = value
    torch.manual_seed(0)
    model = T.DebertaV2ForSequenceClassification(T.DebertaV2Config(**cfg))
    with pytest.raises(RotvizError) as e:
        read_view(spec_named(FAMILY), cfg, model.state_dict())
    msg = str(e.value)
    assert "\n" not in msg and FAMILY in msg and name in msg

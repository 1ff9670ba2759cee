"""LLaMA in rotviz's core: SwiGLU FFNs, grouped-query attention, rotary embeddings, RMSNorm.

Tiny random `LlamaForCausalLM` models (2 layers, d = 32, 4 query heads, FFN 64) in four
variants: grouped-query attention (H_kv = 2), plain multi-head (H_kv = 4), multi-query
(H_kv = 1), and head size 12 != d / H with biases on every linear. Function checks run in
float32 (max logit difference <= 1e-4), recovery checks in float64 (relative distance <= 1e-5).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
import torch
from conftest import assert_state_equal, clone_state, view_of
from safetensors.torch import load_file, save_file

from rotviz.arch import LLAMA, spec_for
from rotviz.errors import RotvizError
from rotviz.groups import (
    random_orthogonal,
    random_rope_maps,
    rope_maps,
    rope_pairs,
    rope_procrustes,
)
from rotviz.match.distances import distances, norm
from rotviz.match.engine import match
from rotviz.match.layer_solvers import (
    cross_qk,
    cross_vo,
    ffn_cost,
    ffn_permutation,
    head_permutation,
)
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import match_models
from rotviz.sources.loading import load_model
from rotviz.sources.running import forward, max_output_diff, probe_inputs
from rotviz.sources.writing import save_model
from rotviz.symmetry.actions import (
    LayerTransform,
    apply,
    apply_layer,
    group_permutation,
    permute_heads,
    random_element,
    random_transform,
    rope_structured,
    transform_qk,
)
from rotviz.symmetry.kinds import groups
from rotviz.symmetry.view import Dims, read_view, write_state

F64 = torch.float64
TOL = 1e-4  # float32 logits
BROKEN = 1e-2  # a transform that is not a symmetry moves the logits by far more than this
RECOVERED = 1e-5  # float64, relative to the model's norm

VARIANTS = {
    "gqa": {},  # 4 query heads, 2 key/value heads, d_h = 8 = d / H
    "mha": dict(kv_heads=4),
    "mqa": dict(kv_heads=1),
    "hd12-bias": dict(head_dim=12, bias=True),  # d_h = 12 != d / H, biases everywhere
    "tied": dict(tie_embeddings=True),  # lm_head is the embedding table
}
GROUPED = ["gqa", "mqa", "hd12-bias"]  # H_kv < H


@pytest.fixture(scope="session")
def llama(saved):
    """`llama(variant, seed, dtype)`: a cached tiny random LLaMA (shared: never modify it)."""
    cache: dict[tuple, object] = {}

    def get(variant: str = "gqa", seed: int = 0, dtype: torch.dtype | None = None):
        key = (variant, seed, dtype)
        if key not in cache:
            cache[key] = load_model(saved("llama", seed, **VARIANTS[variant]), dtype=dtype)
        return cache[key]

    return get


@pytest.fixture(params=list(VARIANTS))
def variant(request) -> str:
    return request.param


def _diff(model, view) -> float:
    return max_output_diff(model, model.state, write_state(view))


def _rel(a, b) -> float:
    return distances(a, b).total / norm(b)


# ---- architecture data and the view ----------------------------------------------------------


def test_spec_dims_and_view_shapes(llama, variant):
    model = llama(variant)
    assert model.spec is LLAMA and spec_for(model.config) is LLAMA
    view = view_of(model)
    dims = view.dims
    sizes = VARIANTS[variant]
    h, h_kv = 4, sizes.get("kv_heads", 2)
    dh = sizes.get("head_dim", 8)
    assert (dims.n_layers, dims.d_model, dims.n_heads, dims.n_kv_heads, dims.d_head,
            dims.d_ffn) == (2, 32, h, h_kv, dh, 64)
    assert dims.rope == "rotate_half" and dims.gated and dims.activation == "silu"
    assert dims.group_size == h // h_kv
    bias = sizes.get("bias", False)
    for i, blk in enumerate(view.blocks):
        a, f = blk.attn, blk.ffn
        assert a.wq.shape == (h, dh, 32) and a.wo.shape == (h, 32, dh)
        assert a.wk.shape == a.wv.shape == (h_kv, dh, 32)
        assert f.w_in.shape == f.w_gate.shape == (64, 32) and f.w_out.shape == (32, 64)
        assert (a.bq is not None) == bias and (a.bk is not None) == bias
        assert (f.b_in is not None) == bias and (f.b_gate is not None) == bias
        if bias:
            assert a.bq.shape == (h, dh) and a.bk.shape == a.bv.shape == (h_kv, dh)
        assert set(blk.norms) == {"attn_in", "ffn_in"} and blk.norms["attn_in"].bias is None
        # head h owns rows h*d_h:(h+1)*d_h of q_proj and those columns of o_proj; KV head g
        # owns rows g*d_h:(g+1)*d_h of k_proj and v_proj
        p = f"model.layers.{i}."
        st = model.state
        for hh in range(h):
            rows = slice(hh * dh, (hh + 1) * dh)
            assert torch.equal(a.wq[hh], st[p + "self_attn.q_proj.weight"][rows])
            assert torch.equal(a.wo[hh], st[p + "self_attn.o_proj.weight"][:, rows])
        for g in range(h_kv):
            rows = slice(g * dh, (g + 1) * dh)
            assert torch.equal(a.wk[g], st[p + "self_attn.k_proj.weight"][rows])
            assert torch.equal(a.wv[g], st[p + "self_attn.v_proj.weight"][rows])
        assert torch.equal(f.w_gate, st[p + "mlp.gate_proj.weight"])
        assert torch.equal(f.w_in, st[p + "mlp.up_proj.weight"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_round_trip_is_bit_exact(llama, variant, dtype):
    model = llama(variant)
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in model.state.items()}
    before = clone_state(state)
    out = write_state(read_view(model.spec, model.config, state))
    assert list(out) == list(state)  # same names, same order
    assert_state_equal(out, state)
    assert_state_equal(state, before)  # the input is never modified
    # matching runs in float64: writing back restores the file's dtypes exactly
    view64 = read_view(model.spec, model.config, state).to(dtype=F64)
    assert_state_equal(write_state(view64), state)


def test_groups_count_every_parameter_once(llama, variant):
    """Distances see every tensor once: the gate (as ffn_in) included, and lm_head unless the
    config ties it to the embedding table."""
    model = llama(variant)
    tied = variant == "tied"
    assert model.config["tie_word_embeddings"] is tied
    head, emb = model.state["lm_head.weight"], model.state["model.embed_tokens.weight"]
    assert (head.data_ptr() == emb.data_ptr()) is tied
    got = list(groups(view_of(model)))
    expected = sum(t.numel() for t in model.state.values() if t.is_floating_point())
    expected -= head.numel() if tied else 0
    assert sum(t.numel() for _, _, t in got) == expected
    assert any(t is head for _, _, t in got) is not tied
    gate = model.state["model.layers.0.mlp.gate_proj.weight"]
    assert any(k == "ffn_in" and t is gate for layer, k, t in got if layer == 0)
    kinds = {k for layer, k, _ in got if layer is None}
    assert {"embeddings", "norms"} | (set() if tied else {"head"}) == kinds


def test_config_that_does_not_fit_the_weights_is_a_clear_error(llama):
    model = llama("gqa")
    for key, value in (("num_key_value_heads", 4), ("head_dim", 4)):
        cfg = {**model.config, key: value}
        with pytest.raises(RotvizError, match="do not fit config.json") as e:
            read_view(model.spec, cfg, model.state)
        assert "\n" not in str(e.value)
    with pytest.raises(RotvizError, match="key/value heads"):
        read_view(model.spec, {**model.config, "num_key_value_heads": 3}, model.state)


def test_dims_keep_their_positional_form():
    dims = Dims(2, 32, 4, 8, 64, "gelu")
    assert dims.n_kv_heads == 4 and dims.rope is None and not dims.gated
    assert dims.group_size == 1
    t = LayerTransform(torch.arange(3), None, None, None)  # positional form still works
    assert t.ffn_scale is None


def test_untied_lm_head_must_be_in_the_checkpoint(saved, tmp_path):
    import shutil

    src = saved("llama", 0)
    bad = tmp_path / "no_head"
    shutil.copytree(src, bad)
    st = load_file(str(bad / "model.safetensors"))
    del st["lm_head.weight"]
    save_file(st, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(RotvizError, match=r"missing \['lm_head.weight'\]"):
        load_model(bad)


def test_probe_inputs_fit_the_positions(llama):
    model = llama("gqa")
    x = probe_inputs(model)["input_ids"]
    assert x.shape[1] <= model.config["max_position_embeddings"] and x.shape[1] == 16
    assert forward(model, {"input_ids": x}).shape == (4, 16, model.config["vocab_size"])


# ---- rotary pairs -------------------------------------------------------------------------


def test_rope_pairs_of_both_layouts():
    i, j = rope_pairs(8, "rotate_half")
    assert i.tolist() == [0, 1, 2, 3] and j.tolist() == [4, 5, 6, 7]  # (i, i + d_h/2)
    i, j = rope_pairs(8, "interleaved")
    assert i.tolist() == [0, 2, 4, 6] and j.tolist() == [1, 3, 5, 7]  # (2j, 2j + 1)
    with pytest.raises(RotvizError, match="even head size"):
        rope_pairs(7, "rotate_half")
    with pytest.raises(RotvizError, match="unknown rotary layout"):
        rope_pairs(8, "spiral")


def _rotate(x: torch.Tensor, pos: torch.Tensor, layout: str, base: float = 100.0):
    """Rotary embedding of rows x (T, d_h) at positions pos: Hugging Face's own function for
    rotate_half, a direct implementation for interleaved."""
    dh = x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, dh, 2, dtype=F64) / dh)
    ang = pos[:, None].to(F64) * inv_freq[None, :]  # (T, d_h/2)
    if layout == "rotate_half":
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        emb = torch.cat([ang, ang], dim=-1)
        out, _ = apply_rotary_pos_emb(x[None, None], x[None, None], emb.cos()[None],
                                      emb.sin()[None])
        return out[0, 0]
    out = x.clone()
    c, s = ang.cos(), ang.sin()
    out[:, 0::2] = x[:, 0::2] * c - x[:, 1::2] * s
    out[:, 1::2] = x[:, 1::2] * c + x[:, 0::2] * s
    return out


@pytest.mark.parametrize("layout", ["rotate_half", "interleaved"])
def test_structured_maps_commute_with_the_position_rotations(layout):
    """Scores of rotated queries and keys stay the same under q -> q A, k -> k A^-T exactly
    when A is a rotation-scale on the layout's pairs."""
    gen = torch.Generator().manual_seed(0)
    dh, t = 8, 12
    q, k = (torch.randn(t, dh, generator=gen, dtype=F64) for _ in range(2))
    pos = torch.arange(t)

    def scores(a):
        qa, ka = q @ a, k @ torch.linalg.inv(a).T
        return _rotate(qa, pos, layout) @ _rotate(ka, pos, layout).T

    base = scores(torch.eye(dh, dtype=F64))
    good = random_rope_maps(1, dh, layout, gen, scale_range=(0.5, 2.0))[0]
    assert bool(rope_structured(good, layout)) and (scores(good) - base).abs().max() < 1e-10
    other = "interleaved" if layout == "rotate_half" else "rotate_half"
    wrong_pairs = random_rope_maps(1, dh, other, gen)[0]
    full = random_orthogonal(1, dh, gen)[0]
    for bad in (wrong_pairs, full):
        assert not bool(rope_structured(bad, layout))
        assert (scores(bad) - base).abs().max() > 1e-2


# ---- actions: SwiGLU ----------------------------------------------------------------------


def _ffn_element(view, seed=5):
    """A random SwiGLU permutation with per-unit up/down scales, per layer."""
    out = {}
    for i, t in random_element(view.dims, seed).items():
        assert t.ffn_scale is not None and t.ffn_scale.shape == (view.dims.d_ffn,)
        out[i] = LayerTransform(perm=t.perm, ffn_scale=t.ffn_scale)
    return out


def test_swiglu_permutation_and_scaling_keep_the_function(llama, variant):
    model = llama(variant)
    view = view_of(model)
    element = _ffn_element(view)
    image = apply(view, element)
    assert _diff(model, image) <= TOL
    for i, t in element.items():
        f0, f1 = view.blocks[i].ffn, image.blocks[i].ffn
        assert torch.equal(f1.w_gate, f0.w_gate[t.perm])  # the gate is permuted, never scaled
        s = t.ffn_scale.float()
        torch.testing.assert_close(f1.w_in, f0.w_in[t.perm] * s[:, None])
        torch.testing.assert_close(f1.w_out, f0.w_out[:, t.perm] / s)
        assert (s - 1).abs().max() > 0.2 and not torch.equal(t.perm, torch.arange(64))
    assert distances(image, view).total > 1.0


def test_half_a_swiglu_symmetry_breaks_the_function(llama):
    """Negative controls: the gate left behind, or the gate scaled instead of up."""
    model = llama("gqa")
    view = view_of(model)
    f = view.blocks[0].ffn
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    s = torch.linspace(0.5, 2.0, 64)
    broken = {
        "gate not permuted": dataclasses.replace(f, w_in=f.w_in[perm], w_out=f.w_out[:, perm]),
        "gate scaled": dataclasses.replace(f, w_gate=f.w_gate * s[:, None], w_out=f.w_out / s),
        "up scaled alone": dataclasses.replace(f, w_in=f.w_in * s[:, None]),
    }
    for what, ffn in broken.items():
        blk = dataclasses.replace(view.blocks[0], ffn=ffn)
        assert _diff(model, view.with_block(0, blk)) > BROKEN, what


def test_ffn_scale_is_refused_where_it_is_no_symmetry(loaded):
    view = view_of(loaded("gpt2"))  # a GELU FFN
    t = LayerTransform(ffn_scale=torch.full((view.dims.d_ffn,), 2.0, dtype=F64))
    with pytest.raises(RotvizError, match="only of gated FFNs and ReLU FFNs") as e:
        apply_layer(view, 0, t)
    assert "\n" not in str(e.value)


def test_swiglu_element_is_recovered(llama, variant):
    original = view_of(llama(variant, 0, F64))
    image = apply(original, _ffn_element(original))
    assert _rel(image, original) > 0.05
    result = match(original, image)
    assert _rel(result.view, original) <= RECOVERED
    assert all(len(r.ffn_scale_quantiles) == 5 for r in result.report.layers)
    assert all(result.transforms[i].ffn_scale.shape == (64,) for i in range(2))


# ---- actions: rotary Q-K, V-O per KV group, grouped-query attention ------------------------


def _attn_element(view, seed=7, invertible_vo=False):
    """Per KV group: a random rotary Q-K map (angle and scale per pair) and a V-O map (an
    orthogonal map times a scale, or any invertible map)."""
    gen = torch.Generator().manual_seed(seed)
    dims = view.dims
    out = {}
    for i in range(dims.n_layers):
        qk = random_rope_maps(dims.n_kv_heads, dims.d_head, dims.rope, gen, scale_range=(0.5, 2))
        if invertible_vo:
            vo = torch.eye(dims.d_head, dtype=F64) + 0.3 * torch.randn(
                dims.n_kv_heads, dims.d_head, dims.d_head, generator=gen, dtype=F64)
        else:
            vo = random_orthogonal(dims.n_kv_heads, dims.d_head, gen) * 1.7
        assert not rope_structured(vo, dims.rope).any()  # V-O keeps its full group
        out[i] = LayerTransform(qk=qk, vo=vo)
    return out


@pytest.mark.parametrize("invertible_vo", [False, True])
def test_rotary_qk_and_full_vo_per_group_keep_the_function(llama, variant, invertible_vo):
    model = llama(variant)
    view = view_of(model)
    image = apply(view, _attn_element(view, invertible_vo=invertible_vo))
    assert _diff(model, image) <= TOL
    assert distances(image, view).total > 1.0


def test_rotary_qk_and_vo_per_group_are_recovered(llama, variant):
    original = view_of(llama(variant, 0, F64))
    image = apply(original, _attn_element(original))
    assert _rel(image, original) > 0.05
    result = match(original, image, MatchOptions(ffn=False))
    assert _rel(result.view, original) <= RECOVERED


def test_random_elements_are_valid_for_llama(llama, variant):
    model = llama(variant)
    view = view_of(model)
    dims = view.dims
    h_kv, dh = dims.n_kv_heads, dims.d_head
    for kinds in ({}, {"heads": True}, {"rescale": False}, {"attn": False}):
        element = random_element(dims, 3, **kinds)
        for t in element.values():
            assert t.qk.shape == t.vo.shape == (h_kv, dh, dh)
            assert bool(rope_structured(t.qk, dims.rope).all())
            if kinds.get("rescale", True):
                assert t.ffn_scale is not None and t.ffn_scale.shape == (dims.d_ffn,)
            else:
                assert t.ffn_scale is None
                eye = torch.eye(dh, dtype=F64).expand(h_kv, dh, dh)
                torch.testing.assert_close(t.qk @ t.qk.transpose(-1, -2), eye)
            if kinds.get("heads"):
                group_permutation(t.heads, h_kv)  # keeps KV groups whole (raises otherwise)
        assert _diff(model, apply(view, element)) <= TOL


def _per_query_head_qk(attn, a_h):
    """Q-K maps given per query head (H, d_h, d_h), bypassing rotviz's per-group form; each
    group's K takes the inverse of its first query head's map."""
    r = attn.n_heads // attn.n_kv_heads
    a = a_h.to(attn.wq)
    inv_k = torch.linalg.inv(a[::r])
    return dataclasses.replace(
        attn, wq=a.transpose(-1, -2) @ attn.wq, wk=inv_k @ attn.wk,
        bq=None if attn.bq is None else (attn.bq.unsqueeze(1) @ a).squeeze(1),
        bk=None if attn.bk is None else (attn.bk.unsqueeze(1) @ inv_k.transpose(-1, -2)
                                         ).squeeze(1))


def _per_query_head_vo(attn, b_h):
    """V-O maps per query head; each group's V takes its first query head's map."""
    r = attn.n_heads // attn.n_kv_heads
    b = b_h.to(attn.wv)
    bk = b[::r]
    return dataclasses.replace(
        attn, wv=bk.transpose(-1, -2) @ attn.wv, wo=attn.wo @ torch.linalg.inv(b).transpose(-1, -2),
        bv=None if attn.bv is None else (attn.bv.unsqueeze(1) @ bk).squeeze(1))


@pytest.mark.parametrize("variant", GROUPED)
def test_maps_that_differ_inside_a_kv_group_break_the_function(llama, variant):
    model = llama(variant)
    view = view_of(model)
    dims = view.dims
    h, h_kv, dh, r = dims.n_heads, dims.n_kv_heads, dims.d_head, dims.group_size
    gen = torch.Generator().manual_seed(1)
    a_g = random_rope_maps(h_kv, dh, dims.rope, gen, scale_range=(0.5, 2))
    b_g = random_orthogonal(h_kv, dh, gen) * 1.5
    a_other = random_rope_maps(h, dh, dims.rope, gen, scale_range=(0.5, 2))
    b_other = random_orthogonal(h, dh, gen)
    blk = view.blocks[0]

    def diff_with(attn):
        return _diff(model, view.with_block(0, dataclasses.replace(blk, attn=attn)))

    # shared inside each group (what rotviz's (H_kv, d_h, d_h) maps are): same function
    assert diff_with(_per_query_head_qk(blk.attn, a_g.repeat_interleave(r, 0))) <= TOL
    assert diff_with(_per_query_head_vo(blk.attn, b_g.repeat_interleave(r, 0))) <= TOL
    # one query head of group 0 takes another map: the function breaks
    a_h, b_h = a_g.repeat_interleave(r, 0).clone(), b_g.repeat_interleave(r, 0).clone()
    a_h[1], b_h[1] = a_other[1], b_other[1]
    assert diff_with(_per_query_head_qk(blk.attn, a_h)) > BROKEN
    assert diff_with(_per_query_head_vo(blk.attn, b_h)) > BROKEN
    # and rotviz's representation refuses per-query-head maps outright
    for t in (LayerTransform(qk=a_h), LayerTransform(vo=b_h)):
        with pytest.raises(RotvizError, match="one per key/value group") as e:
            apply_layer(view, 0, t)
        assert "\n" not in str(e.value) and "share their map" in str(e.value)


@pytest.mark.parametrize("variant", ["gqa", "mqa"])
def test_full_qk_rotation_is_refused_under_rope_and_really_breaks(llama, variant):
    model = llama(variant)
    view = view_of(model)
    dims = view.dims
    gen = torch.Generator().manual_seed(2)
    full = random_orthogonal(dims.n_kv_heads, dims.d_head, gen)
    with pytest.raises(RotvizError, match="2x2 rotation-scales per frequency pair") as e:
        apply_layer(view, 0, LayerTransform(qk=full))
    assert "\n" not in str(e.value) and "use attn matching" in str(e.value)
    # pairs of the other layout are refused as well
    wrong = random_rope_maps(dims.n_kv_heads, dims.d_head, "interleaved", gen)
    with pytest.raises(RotvizError, match="rotation-scales"):
        apply_layer(view, 0, LayerTransform(qk=wrong))
    # the check matters: the same maps applied without it change the logits
    blk = view.blocks[0]
    for a in (full, wrong):
        attn = transform_qk(blk.attn, a)  # rope=None: no check
        assert _diff(model, view.with_block(0, dataclasses.replace(blk, attn=attn))) > BROKEN


def test_group_splitting_head_permutation_is_refused(llama):
    view = view_of(llama("gqa"))  # groups {0, 1} and {2, 3}
    with pytest.raises(RotvizError, match="splits a key/value group") as e:
        permute_heads(view.blocks[0].attn, torch.tensor([0, 2, 1, 3]))
    assert "\n" not in str(e.value)
    with pytest.raises(RotvizError, match="each of its 4 heads once"):
        permute_heads(view.blocks[0].attn, torch.tensor([0, 0, 1, 2]))
    moved = permute_heads(view.blocks[0].attn, torch.tensor([3, 2, 0, 1]))
    assert torch.equal(moved.wk, view.blocks[0].attn.wk[[1, 0]])
    assert torch.equal(moved.wq, view.blocks[0].attn.wq[[3, 2, 0, 1]])


def test_composition_with_scales_groups_and_heads(llama, variant):
    view = view_of(llama(variant, 0, F64))
    t1 = random_transform(view.dims, 1, heads=True)
    t2 = random_transform(view.dims, 2, heads=True)
    seq = apply_layer(apply_layer(view, 0, t1), 0, t2)
    once = apply_layer(view, 0, t1.then(t2))
    assert distances(seq, once).total / norm(view) <= 1e-12
    assert bool(rope_structured(t1.then(t2).qk, "rotate_half").all())


# ---- matching: solvers --------------------------------------------------------------------


def _pair(llama, variant, dtype=F64):
    return view_of(llama(variant, 0, dtype)), view_of(llama(variant, 1, dtype))


@pytest.mark.parametrize("variant", ["gqa", "hd12-bias"])
def test_cross_matrices_sum_over_the_query_heads_of_a_group(llama, variant):
    anchor, source = _pair(llama, variant)
    s, a = source.blocks[0].attn, anchor.blocks[0].attn
    r = source.dims.group_size

    def outer(x, y):
        return torch.zeros(()) if x is None else torch.outer(x, y)

    for g in range(source.dims.n_kv_heads):
        heads = range(g * r, (g + 1) * r)
        m_qk = s.wk[g] @ a.wk[g].T + outer(s.bk[g] if s.bk is not None else None,
                                            None if a.bk is None else a.bk[g])
        m_vo = s.wv[g] @ a.wv[g].T + outer(s.bv[g] if s.bv is not None else None,
                                            None if a.bv is None else a.bv[g])
        for h in heads:
            m_qk = m_qk + s.wq[h] @ a.wq[h].T + outer(None if s.bq is None else s.bq[h],
                                                      None if a.bq is None else a.bq[h])
            m_vo = m_vo + s.wo[h].T @ a.wo[h]
        torch.testing.assert_close(cross_qk(s, a)[g], m_qk, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(cross_vo(s, a)[g], m_vo, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", ["gqa", "hd12-bias"])
def test_ffn_cost_includes_the_gate_and_its_assignment_wins(llama, variant):
    anchor, source = _pair(llama, variant)
    fa, fs = anchor.blocks[0].ffn, source.blocks[0].ffn
    c = fs.w_gate @ fa.w_gate.T + fs.w_in @ fa.w_in.T + fs.w_out.T @ fa.w_out
    if fs.b_in is not None:
        c = c + torch.outer(fs.b_in, fa.b_in) + torch.outer(fs.b_gate, fa.b_gate)
    np.testing.assert_allclose(ffn_cost(anchor, source, 0), c.numpy(), rtol=1e-12, atol=1e-12)
    perm = ffn_permutation(anchor, source, 0)

    def dist(p):  # squared distance of gate, up and down (and biases) after permuting by p
        d = ((fs.w_gate[p] - fa.w_gate) ** 2).sum() + ((fs.w_in[p] - fa.w_in) ** 2).sum()
        d = d + ((fs.w_out[:, p] - fa.w_out) ** 2).sum()
        if fs.b_in is not None:
            d = d + ((fs.b_in[p] - fa.b_in) ** 2).sum() + ((fs.b_gate[p] - fa.b_gate) ** 2).sum()
        return float(d)

    gen = torch.Generator().manual_seed(0)
    best = dist(perm)
    assert best < dist(torch.arange(64))
    assert all(best <= dist(torch.randperm(64, generator=gen)) for _ in range(200))


def test_rope_procrustes_is_the_structured_optimum():
    gen = torch.Generator().manual_seed(0)
    for layout in ("rotate_half", "interleaved"):
        m = torch.randn(3, 8, 8, generator=gen, dtype=F64)
        r, pair_gain = rope_procrustes(m, layout)
        assert bool(rope_structured(r, layout).all())
        eye = torch.eye(8, dtype=F64).expand(3, 8, 8)
        torch.testing.assert_close(r @ r.transpose(-1, -2), eye)
        torch.testing.assert_close(torch.linalg.det(r), torch.ones(3, dtype=F64))
        best = (r * m).sum((-2, -1))  # tr(R^T M)
        torch.testing.assert_close(best, pair_gain.sum(-1))
        # beats 2000 random structured rotations, and a fine angle grid on every pair
        cand = random_rope_maps(2000, 8, layout, gen)
        scores = torch.einsum("nij,hij->hn", cand, m)
        assert bool((best[:, None] >= scores - 1e-12).all())
        i, j = rope_pairs(8, layout)
        th = torch.linspace(-math.pi, math.pi, 7201, dtype=F64)
        x = m[:, i, i] + m[:, j, j]
        y = m[:, j, i] - m[:, i, j]
        grid = (x[..., None] * th.cos() + y[..., None] * th.sin()).amax(-1)
        assert bool((pair_gain >= grid - 1e-12).all())


def _qk_distance(a_map, s, a, g, r):
    """Group g's Q-K distance after the map a_map (d_h, d_h): ||A^T W_Q1h - W_Q2h||^2 over the
    group's query heads, ||A^-1 W_K1 - W_K2||^2, biases likewise."""
    inv = torch.linalg.inv(a_map)
    d = ((inv @ s.wk[g] - a.wk[g]) ** 2).sum()
    if s.bk is not None:
        d = d + ((s.bk[g] @ inv.T - a.bk[g]) ** 2).sum()
    for h in range(g * r, (g + 1) * r):
        d = d + ((a_map.T @ s.wq[h] - a.wq[h]) ** 2).sum()
        if s.bq is not None:
            d = d + ((s.bq[h] @ a_map - a.bq[h]) ** 2).sum()
    return float(d)


@pytest.mark.parametrize("variant", ["gqa", "mqa", "hd12-bias"])
def test_matched_qk_rotation_and_pair_scales_are_optimal(llama, variant):
    """As in the seed paper, rotation first, then scale: the matched rotation of each group
    beats random rotary rotations and small turns of itself on the group's Q-K distance to
    the anchor, and each pair's scale beats a grid given that rotation."""
    anchor, source = _pair(llama, variant)
    dims = source.dims
    rotated = match(anchor, source, MatchOptions(ffn=False, rescale=False))
    scaled = match(anchor, source, MatchOptions(ffn=False))
    gen = torch.Generator().manual_seed(4)
    r, dh = dims.group_size, dims.d_head
    i, j = rope_pairs(dh, dims.rope)
    grid = torch.cat([torch.logspace(-2, 2, 801, dtype=F64), -torch.logspace(-2, 2, 801,
                                                                              dtype=F64)])
    for layer in range(dims.n_layers):
        rot = rotated.transforms[layer].qk
        assert bool(rope_structured(rot, dims.rope).all())
        s, a = source.blocks[layer].attn, anchor.blocks[layer].attn
        for g in range(dims.n_kv_heads):
            best = _qk_distance(rot[g], s, a, g, r)
            assert best < _qk_distance(torch.eye(dh, dtype=F64), s, a, g, r)
            cos, sin = rot[g][i, i], rot[g][j, i]
            for _ in range(100):
                rand = random_rope_maps(1, dh, dims.rope, gen)[0]
                assert best <= _qk_distance(rand, s, a, g, r)
                t = 0.01 * torch.randn(dh // 2, generator=gen, dtype=F64)
                near = rope_maps(cos * t.cos() - sin * t.sin(), sin * t.cos() + cos * t.sin(),
                                 dims.rope)
                assert best <= _qk_distance(near, s, a, g, r) * (1 + 1e-12)
            # per pair, the chosen scale beats a grid of scales on that pair (others fixed)
            pair = torch.tensor(scaled.report.layers[layer].qk_pair_scale[g], dtype=F64)
            torch.testing.assert_close(scaled.transforms[layer].qk[g],
                                       rot[g] * torch.cat([pair, pair])[
                                           torch.argsort(torch.cat([i, j]))])
            full = _qk_distance(scaled.transforms[layer].qk[g], s, a, g, r)
            for p in range(dh // 2):
                for x in grid[::8]:
                    trial = pair.clone()
                    trial[p] = x
                    per_dim = torch.empty(dh, dtype=F64)
                    per_dim[i], per_dim[j] = trial, trial
                    assert full <= _qk_distance(rot[g] * per_dim, s, a, g, r) * (1 + 1e-12)
        # the matched view is exactly the source moved by those maps
        got = _qk_distance(torch.eye(dh, dtype=F64), scaled.view.blocks[layer].attn, a, 0, r)
        ref = _qk_distance(scaled.transforms[layer].qk[0], s, a, 0, r)
        assert math.isclose(got, ref, rel_tol=1e-9)


def test_ffn_unit_scales_beat_a_grid(llama):
    anchor, source = _pair(llama, "hd12-bias")
    res = match(anchor, source, MatchOptions(attn=False))  # ffn + rescale
    grid = torch.cat([torch.logspace(-2, 2, 2001, dtype=F64), -torch.logspace(-2, 2, 2001,
                                                                                dtype=F64)])
    for layer, rep in enumerate(res.report.layers):
        perm = res.transforms[layer].perm
        fs, fa = source.blocks[layer].ffn, anchor.blocks[layer].ffn
        up = torch.cat([fs.w_in[perm], fs.b_in[perm, None]], 1)
        up2 = torch.cat([fa.w_in, fa.b_in[:, None]], 1)
        down, down2 = fs.w_out[:, perm].T, fa.w_out.T

        def f(s, up=up, up2=up2, down=down, down2=down2):
            # per unit ||s up - up2||^2 + ||down / s - down2||^2, s: (m, n)
            return (((s[..., None] * up[:, None] - up2[:, None]) ** 2).sum(-1)
                    + ((down[:, None] / s[..., None] - down2[:, None]) ** 2).sum(-1))

        chosen = res.transforms[layer].ffn_scale
        q = torch.quantile(chosen, torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=F64))
        torch.testing.assert_close(torch.tensor(rep.ffn_scale_quantiles, dtype=F64), q)
        at_chosen = f(chosen[:, None])[:, 0]
        assert bool((at_chosen <= f(grid.expand(64, -1)).amin(1) * (1 + 1e-12)).all())
        assert bool((at_chosen <= f(torch.ones(64, 1, dtype=F64))[:, 0] * (1 + 1e-12)).all())
        # the matched FFN is the permuted source at those scales; the gate is only permuted
        m = res.view.blocks[layer].ffn
        torch.testing.assert_close(m.w_in, fs.w_in[perm] * chosen[:, None])
        assert torch.equal(m.w_gate, fs.w_gate[perm])


def _group_gain(s, a, heads, rope):
    """From scratch: the summed best Q-K (rotary) and V-O (orthogonal) gains of the source
    with its heads permuted by `heads`, per KV group."""
    moved = permute_heads(s, heads)
    m_qk, m_vo = cross_qk(moved, a), cross_vo(moved, a)
    return float(rope_procrustes(m_qk, rope)[1].sum() + torch.linalg.svdvals(m_vo).sum())


@pytest.mark.parametrize("variant", ["gqa", "mqa"])
def test_gqa_head_assignment_is_optimal(llama, variant):
    anchor, source = _pair(llama, variant)
    dims = source.dims
    h_kv, r = dims.n_kv_heads, dims.group_size
    valid = []
    for groups_order in itertools.permutations(range(h_kv)):
        for inner in itertools.product(itertools.permutations(range(r)), repeat=h_kv):
            valid.append(torch.tensor([groups_order[g] * r + inner[g][k]
                                       for g in range(h_kv) for k in range(r)]))
    assert len(valid) == math.factorial(h_kv) * math.factorial(r) ** h_kv
    for layer in range(dims.n_layers):
        s, a = source.blocks[layer].attn, anchor.blocks[layer].attn
        ours = head_permutation(s, a, dims.rope)
        best = max(_group_gain(s, a, p, dims.rope) for p in valid)
        assert _group_gain(s, a, ours, dims.rope) >= best - 1e-9


@pytest.mark.parametrize("variant", ["gqa", "mha", "mqa"])
def test_planted_head_permutation_is_recovered(llama, variant):
    original = view_of(llama(variant, 0, F64))
    element = random_element(original.dims, 42, heads=True)
    assert any(not torch.equal(t.heads, torch.arange(4)) for t in element.values())
    image = apply(original, element)
    with_heads = match(original, image, MatchOptions(heads=True))
    assert _rel(with_heads.view, original) <= RECOVERED
    assert _rel(apply(image, with_heads.transforms), with_heads.view) <= 1e-9
    seed_only = match(original, image)
    assert seed_only.report.after.total > with_heads.report.after.total


# ---- matching: never worse, report, pipeline, saving --------------------------------------

OPTION_SETS = {
    "full": MatchOptions(),
    "ffn": MatchOptions(ffn=True, attn=False, rescale=False),
    "ffn-rescale": MatchOptions(ffn=True, attn=False, rescale=True),
    "attn": MatchOptions(ffn=False, attn=True, rescale=False),
    "rescale": MatchOptions(ffn=False, attn=False, rescale=True),
    "heads": MatchOptions(heads=True),
    "layer1": MatchOptions(layers=(1,)),
}


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_matching_never_increases_the_distance(llama, variant, name):
    anchor, source = _pair(llama, variant, None)
    rep = match(anchor, source, OPTION_SETS[name]).report
    before, after = rep.before.cells, rep.after.cells
    assert set(before) == set(after)
    for layer in range(2):
        for kinds in (("q", "k"), ("v", "o"), ("ffn_in", "ffn_out")):
            b = sum(before[(layer, k)] for k in kinds)
            a = sum(after[(layer, k)] for k in kinds)
            assert a <= b * (1 + 1e-6), (layer, kinds)
    assert rep.after.total < rep.before.total


def test_report_under_rope_and_gqa(llama, variant):
    anchor, source = _pair(llama, variant, None)
    dims = source.dims
    h_kv, dh = dims.n_kv_heads, dims.d_head
    res = match(anchor, source, MatchOptions(heads=True))
    for rep in res.report.layers:
        for key in ("qk_singular", "vo_singular", "qk_angles", "vo_angles"):
            assert np.array(getattr(rep, key)).shape == (h_kv, dh), key
        ang = np.array(rep.qk_angles)  # each pair's angle, twice (eigen-angles +-theta)
        np.testing.assert_allclose(ang[:, 0::2], ang[:, 1::2], atol=1e-5)
        assert np.all((ang >= 0) & (ang <= 180 + 1e-9))
        np.testing.assert_allclose(rep.qk_det, 1.0, atol=1e-9)  # rotations, no reflections
        assert np.allclose(np.abs(rep.vo_det), 1)
        pair = np.array(rep.qk_pair_scale)
        assert pair.shape == (h_kv, dh // 2) and np.all(pair != 0)
        np.testing.assert_allclose(rep.qk_scale, np.exp(np.log(np.abs(pair)).mean(1)))
        assert len(rep.vo_scale) == h_kv and len(rep.ffn_scale_quantiles) == 5
        assert rep.ffn_scale_quantiles == sorted(rep.ffn_scale_quantiles)
        assert 0 < rep.ffn_moved <= dims.d_ffn
        assert sorted(rep.head_perm) == list(range(dims.n_heads))
        group_permutation(torch.tensor(rep.head_perm), h_kv)
    json.dumps(res.report.to_dict())


def test_match_models_keeps_the_function_and_lowers_the_distance(llama, variant):
    anchor, source = llama(variant, 0), llama(variant, 1)
    for options in (MatchOptions(), MatchOptions(heads=True)):
        out = match_models(anchor, source, options)
        assert out.preserved and out.report.max_output_diff <= TOL
        assert out.report.after.total < 0.97 * out.report.before.total
        assert set(out.state) == set(source.state)
        assert all(out.state[k].dtype == source.state[k].dtype for k in out.state)


@pytest.mark.parametrize("variant", ["gqa", "tied"])
def test_matched_model_saves_and_reloads(llama, tmp_path, variant):
    import transformers

    anchor, source = llama(variant, 0), llama(variant, 1)
    out = match_models(anchor, source)
    folder = save_model(source, out.state, tmp_path / "matched")
    again = load_model(folder)
    assert again.spec is LLAMA
    assert_state_equal({k: again.state[k] for k in out.state}, out.state)
    x = probe_inputs(source, n=3, seed=7)
    y_source = forward(source, x)
    assert (forward(again, x) - y_source).abs().max() <= TOL
    assert torch.equal(forward(again, x), forward(source, x, out.state))
    own = transformers.LlamaForCausalLM.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        assert (own(**x).logits - y_source).abs().max() <= TOL
    after = distances(view_of(again), view_of(anchor)).total
    assert math.isclose(after, out.report.after.total, rel_tol=1e-6)
    tied = again.state["lm_head.weight"].data_ptr() == again.state[
        "model.embed_tokens.weight"].data_ptr()
    assert tied is (variant == "tied")  # a tie survives saving and loading; no tie appears

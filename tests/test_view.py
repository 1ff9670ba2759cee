"""The canonical view: bit-exact round trip, no mutation, complete and per-head coverage."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_state_equal, clone_state, view_of

from rotviz.errors import RotvizError
from rotviz.symmetry.kinds import KINDS, groups
from rotviz.symmetry.view import read_view, write_state


def test_round_trip_is_bit_exact(family, loaded):
    model = loaded(family)
    out = write_state(view_of(model))
    assert list(out) == list(model.state)  # same keys, same order
    assert_state_equal(out, model.state)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_round_trip_keeps_other_dtypes(family, loaded, dtype):
    model = loaded(family)
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in model.state.items()}
    assert_state_equal(write_state(read_view(model.spec, model.config, state)), state)


def test_float64_view_writes_back_original_dtype(family, loaded):
    """Matching runs in float64; writing back must restore the file's dtypes exactly."""
    model = loaded(family)
    view64 = view_of(model).to(dtype=torch.float64)
    assert all(t.dtype == torch.float64 for _, _, t in groups(view64))
    assert_state_equal(write_state(view64), model.state)


def test_read_and_write_never_mutate_the_input(family, loaded):
    model = loaded(family)
    before = clone_state(model.state)
    view = view_of(model)
    write_state(view)
    write_state(view.to(dtype=torch.float64))
    assert_state_equal(model.state, before)


def test_view_shapes_follow_dims(family, loaded):
    """Shapes from the config: K and V have one head per key/value group (all heads without
    grouped-query attention), biases are there exactly where the checkpoint has them, and a
    gated FFN's gate has the shape of its up map."""
    model = loaded(family)
    view = view_of(model)
    dims = view.dims
    head = model.config.get("head_dim") or 8  # d / H unless the config sets it (Gemma)
    assert (dims.n_layers, dims.d_model, dims.n_heads, dims.d_head, dims.d_ffn) == \
        (2, 32, 4, head, 64)
    h, h_kv, dh, d, m = dims.n_heads, dims.n_kv_heads, dims.d_head, dims.d_model, dims.d_ffn
    for prefix, blk in zip(view.layout.blocks, view.blocks, strict=True):
        a, f = blk.attn, blk.ffn
        assert a.wq.shape == (h, dh, d)
        for w in (a.wk, a.wv):
            assert w.shape == (h_kv, dh, d)
        assert a.wo.shape == (h, d, dh)
        attn_bias = f"{prefix}{view.layout.roles['qkv' if view.spec.fused else 'q']}.bias"
        for b, n in zip((a.bq, a.bk, a.bv), (h, h_kv, h_kv), strict=True):
            assert (b is not None) == (attn_bias in model.state)
            assert b is None or b.shape == (n, dh)
        assert f.w_in.shape == (m, d) and f.w_out.shape == (d, m)
        ffn_bias = f"{prefix}{view.layout.roles['ffn_in']}.bias"
        assert (f.b_in is not None) == (ffn_bias in model.state)
        assert f.b_in is None or f.b_in.shape == (m,)
        assert (f.w_gate is not None) == dims.gated
        assert f.w_gate is None or f.w_gate.shape == (m, d)
        # every norm the family describes (one shared by parallel branches: Falcon-7B;
        # ModernBERT's block 0 has no attention norm)
        assert len(blk.norms) == len(view.spec.norms) - (
            view.spec.shared_input_norm and "ffn_in" not in blk.norms) - (
            family == "modernbert" and prefix == view.layout.blocks[0])


def test_head_slices_match_the_projection_rows(family, loaded):
    """Head h owns rows h*d_h:(h+1)*d_h of W_Q (in (out, in) layout) and those columns of W_O;
    key/value head g owns rows g*d_h:(g+1)*d_h of W_K."""
    model = loaded(family)
    view = view_of(model)
    dh, h, h_kv = view.dims.d_head, view.dims.n_heads, view.dims.n_kv_heads
    spec, lay = view.spec, view.layout
    for i, prefix in enumerate(lay.blocks):
        if spec.fused:
            w = model.state[prefix + lay.roles["qkv"] + ".weight"]
            w = w.t() if spec.qkv.transposed else w
            if spec.qkv_layout == "heads":  # per head [q; k; v] (GPT-NeoX)
                per = w.reshape(h, 3, dh, -1)
                w = torch.cat([per[:, n].reshape(h * dh, -1) for n in range(3)])
            wq, wk = w[: h * dh], w[h * dh : (h + h_kv) * dh]
        else:
            wq = model.state[prefix + lay.roles["q"] + ".weight"]
            wk = model.state[prefix + lay.roles["k"] + ".weight"]
        wo = model.state[prefix + lay.roles["o"] + ".weight"]
        wo = wo.t() if spec.o.transposed else wo
        a = view.blocks[i].attn
        for hh in range(h):
            rows = slice(hh * dh, (hh + 1) * dh)
            assert torch.equal(a.wq[hh], wq[rows])
            assert torch.equal(a.wo[hh], wo[:, rows])
        for g in range(h_kv):
            rows = slice(g * dh, (g + 1) * dh)
            assert torch.equal(a.wk[g], wk[rows])


def test_groups_cover_every_parameter_once(family, loaded):
    """Distances see every floating tensor of the model, tied copies once."""
    model = loaded(family)
    view = view_of(model)
    seen_storage: set[int] = set()
    expected = 0
    for t in model.state.values():
        if t.is_floating_point() and t.data_ptr() not in seen_storage:
            seen_storage.add(t.data_ptr())
            expected += t.numel()
    got = list(groups(view))
    assert sum(t.numel() for _, _, t in got) == expected
    assert {kind for _, kind, _ in got} <= set(KINDS)
    for i in range(view.dims.n_layers):
        kinds = {kind for layer, kind, _ in got if layer == i}
        assert kinds == {"q", "k", "v", "o", "ffn_in", "ffn_out", "norms"}
    assert any(kind == "embeddings" for layer, kind, _ in got if layer is None)


def test_missing_block_tensor_is_a_clear_error(family, loaded):
    model = loaded(family)
    lay = view_of(model).layout
    drop = lay.blocks[0] + lay.roles["ffn_in"] + ".weight"
    state = {k: v for k, v in model.state.items() if k != drop}
    with pytest.raises(RotvizError, match="ffn|fc|dense|mlp|complete"):
        read_view(model.spec, model.config, state)

"""Symmetry actions: each alone preserves the function, they compose, and they copy."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import assert_state_equal, clone_state, view_of

from rotviz.groups import random_orthogonal, random_rope_maps
from rotviz.sources.running import max_output_diff
from rotviz.symmetry.actions import LayerTransform, apply, random_element, random_transform
from rotviz.symmetry.kinds import groups
from rotviz.symmetry.view import ModelView, read_view, write_state

TOL = 1e-4  # float32 logits
BROKEN = 1e-2  # a transform that is not a symmetry moves the logits by far more than this


def _orth(view: ModelView, seed: int, n: int | None = None) -> dict[int, torch.Tensor]:
    """Random orthogonal maps per layer: one per key/value group (every head without
    grouped-query attention), or `n`."""
    gen = torch.Generator().manual_seed(seed)
    n = view.dims.n_kv_heads if n is None else n
    return {i: random_orthogonal(n, view.dims.d_head, gen) for i in range(view.dims.n_layers)}


def _invertible(view: ModelView, seed: int) -> dict[int, torch.Tensor]:
    """General invertible per-group maps (the actions support any A, not only a R)."""
    gen = torch.Generator().manual_seed(seed)
    h, dh = view.dims.n_kv_heads, view.dims.d_head
    return {i: torch.eye(dh, dtype=torch.float64)
            + 0.3 * torch.randn(h, dh, dh, generator=gen, dtype=torch.float64) / dh**0.5
            for i in range(view.dims.n_layers)}


def _qk(view: ModelView, seed: int, invertible: bool) -> dict[int, torch.Tensor]:
    """Q-K maps of the model's group: under rotary embeddings only maps that commute with the
    position rotations (a rotation, times a scale if `invertible`, per frequency pair)."""
    dims = view.dims
    if dims.qk_norm:  # q/k norms (Qwen3): a sign per frequency pair, for any gains; no scale
        return {i: t.qk for i, t in random_element(dims, seed, ffn=False, rescale=False).items()}
    if dims.rope is None:
        return _invertible(view, seed) if invertible else _orth(view, seed)
    gen = torch.Generator().manual_seed(seed)
    scales = (0.5, 2.0) if invertible else None
    return {i: random_rope_maps(dims.n_kv_heads, dims.d_head, dims.rope, gen,
                                scale_range=scales) for i in range(dims.n_layers)}


def _element(view: ModelView, kind: str) -> dict[int, LayerTransform]:
    dims = view.dims
    if kind == "perm":
        return random_element(dims, 3, attn=False, rescale=False)
    if kind == "qk":
        return {i: LayerTransform(qk=r) for i, r in _qk(view, 4, invertible=False).items()}
    if kind == "vo":
        return {i: LayerTransform(vo=r) for i, r in _orth(view, 5).items()}
    if kind == "rescale":
        return random_element(dims, 6, ffn=False, attn=False, rescale=True)
    if kind == "qk-invertible":
        return {i: LayerTransform(qk=a) for i, a in _qk(view, 7, invertible=True).items()}
    if kind == "vo-invertible":
        return {i: LayerTransform(vo=b) for i, b in _invertible(view, 8).items()}
    if kind == "all":
        return random_element(dims, 9)
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["perm", "qk", "vo", "rescale", "qk-invertible",
                                  "vo-invertible", "all"])
def test_each_action_preserves_the_function(family, loaded, kind):
    model = loaded(family)
    view = view_of(model)
    moved = apply(view, _element(view, kind))
    state = write_state(moved)
    assert max_output_diff(model, model.state, state) <= TOL
    # and it really moved something
    dist = sum(float((a.double() - b.double()).abs().max())
               for (_, _, a), (_, _, b) in zip(groups(view), groups(moved), strict=True))
    assert dist > 1e-2


def test_non_symmetries_are_caught(family, loaded):
    """Negative controls: half of a symmetry breaks the function, so the check can fail."""
    model = loaded(family)
    view = view_of(model)
    blk = view.blocks[0]
    perm = torch.randperm(view.dims.d_ffn, generator=torch.Generator().manual_seed(0))
    r_q = _orth(view, 1, n=view.dims.n_heads)[0].to(blk.attn.wq)
    r_v = _orth(view, 1)[0].to(blk.attn.wv)
    b_in = blk.ffn.b_in
    broken = {
        "w_in rows only": dataclasses.replace(blk, ffn=dataclasses.replace(
            blk.ffn, w_in=blk.ffn.w_in[perm], b_in=None if b_in is None else b_in[perm])),
        "Q only": dataclasses.replace(blk, attn=dataclasses.replace(
            blk.attn, wq=r_q.transpose(-1, -2) @ blk.attn.wq)),
        "V only": dataclasses.replace(blk, attn=dataclasses.replace(
            blk.attn, wv=r_v.transpose(-1, -2) @ blk.attn.wv)),
    }
    for what, b in broken.items():
        state = write_state(view.with_block(0, b))
        assert max_output_diff(model, model.state, state) > BROKEN, what


def test_composition_matches_sequential_application(family, loaded):
    view = view_of(loaded(family, dtype=torch.float64))
    t1, t2 = random_element(view.dims, 11), random_element(view.dims, 12)
    seq = apply(apply(view, t1), t2)
    once = apply(view, {i: t1[i].then(t2[i]) for i in t1})
    # permutations compose exactly; a gated FFN's units are rescaled too, which rounds
    exact = {"norms", "embeddings", "head", "other"}
    if not view.dims.gated:
        exact |= {"ffn_in", "ffn_out"}
    for (_, kind, a), (_, _, b) in zip(groups(seq), groups(once), strict=True):
        if kind in exact:
            assert torch.equal(a, b), kind
        else:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_then_with_identity_parts():
    gen = torch.Generator().manual_seed(0)
    p = torch.randperm(10, generator=gen)
    a = random_orthogonal(3, 4, gen)
    t = LayerTransform(perm=p).then(LayerTransform(qk=a))
    assert torch.equal(t.perm, p) and torch.equal(t.qk, a) and t.vo is None
    p2 = torch.randperm(10, generator=gen)
    assert torch.equal(LayerTransform(perm=p).then(LayerTransform(perm=p2)).perm, p[p2])


def test_actions_return_new_tensors(family, loaded):
    """Inputs unchanged, and writing into the outputs cannot reach the inputs."""
    model = loaded(family)
    state = clone_state(model.state)  # a private copy: this test writes into tensors
    snapshot = clone_state(state)
    view = read_view(model.spec, model.config, state)
    blocks_before = view.blocks
    moved = apply(view, random_element(view.dims, 21))
    assert view.blocks is blocks_before and moved is not view
    assert_state_equal(state, snapshot)
    def tensors(blk):
        a, f = blk.attn, blk.ffn
        return (a.wq, a.wk, a.wv, a.wo, a.bq, a.bk, a.bv, f.w_in, f.b_in, f.w_out, f.w_gate)

    for blk, before in zip(moved.blocks, view.blocks, strict=True):
        for t, t0 in zip(tensors(blk), tensors(before), strict=True):
            assert (t is None) == (t0 is None)  # biases and a gate where the model has them
            if t is not None:
                t.fill_(float("nan"))
    assert_state_equal(state, snapshot)


def test_untouched_layers_are_the_same_tensors(family, loaded):
    view = view_of(loaded(family))
    moved = apply(view, {1: random_transform(view.dims, 5)})
    assert moved.blocks[0] is view.blocks[0]
    assert moved.other is view.other
    assert not torch.equal(moved.blocks[1].attn.wq, view.blocks[1].attn.wq)


def test_random_element_is_seeded(family, loaded):
    dims = view_of(loaded(family)).dims
    a, b, c = random_element(dims, 1), random_element(dims, 1), random_element(dims, 2)
    for i in a:
        assert torch.equal(a[i].perm, b[i].perm) and torch.equal(a[i].qk, b[i].qk)
        assert not torch.equal(a[i].qk, c[i].qk)
    for r in random_element(dims, 1, rescale=False).values():
        eye = torch.eye(dims.d_head, dtype=r.qk.dtype).expand_as(r.qk)
        torch.testing.assert_close(r.qk @ r.qk.transpose(-1, -2), eye)

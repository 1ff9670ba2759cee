"""OLMo-2 in rotviz: q/k RMSNorms over the whole query and key projections (not per head),
and norms on each sub-layer's output.

The group rotviz allows for its Q-K maps (rotviz.symmetry.actions): per KV group an
orthogonal map that turns a frequency pair only where the gains of every query head of the
group and of its key head are equal on the pair, and otherwise flips it; head permutations
that carry each head's gain rows along. Tiny random models (2 layers, d = 32, 4 query heads
in 2 KV groups); function checks in float32 (max logit difference), recovery in float64
(relative distance)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rotviz.arch import spec_for
from rotviz.errors import RotvizError
from rotviz.groups import rope_maps, rope_pairs
from rotviz.match.distances import distances, norm
from rotviz.match.engine import match
from rotviz.match.options import MatchOptions
from rotviz.random_models import random_model
from rotviz.sources.loading import Loaded
from rotviz.sources.running import max_output_diff
from rotviz.symmetry.actions import (
    LayerTransform,
    apply,
    apply_layer,
    qk_fixed_pairs,
    qk_norm_admits,
    transform_qk,
)
from rotviz.symmetry.view import read_view, write_state

F64 = torch.float64
KEPT = 1e-5  # float32 logits under a map of the group
BROKEN = 1e-2


def _olmo2(equal: str = "none") -> Loaded:
    """A random OLMo-2 whose q and k gains are made equal on the first two frequency pairs
    in every head (`equal="all"`), only in query head 0 and key head 0 (`"head0"`), or left
    random (`"none"`)."""
    model, _ = random_model("olmo2", 0)
    dh = model.config.hidden_size // model.config.num_attention_heads
    i, j = rope_pairs(dh, "rotate_half")
    with torch.no_grad():
        for layer in model.model.layers:
            for g in (layer.self_attn.q_norm.weight, layer.self_attn.k_norm.weight):
                rows = g.view(-1, dh)
                picked = rows if equal == "all" else rows[:1] if equal == "head0" else rows[:0]
                picked[:, j[:2]] = picked[:, i[:2]]
    config = model.config.to_dict()
    return Loaded("random:olmo2", Path("."), config, spec_for(config), model,
                  dict(model.state_dict()))


def _turn_first_pairs(view, seed: int) -> torch.Tensor:
    """Per KV group: a random angle on the first two pairs, a random sign on the others."""
    gen = torch.Generator().manual_seed(seed)
    h, n = view.dims.n_kv_heads, view.dims.d_head // 2
    theta = 2 * torch.pi * torch.rand(h, n, generator=gen, dtype=F64)
    theta[:, 2:] = torch.pi * torch.randint(0, 2, (h, n - 2), generator=gen).to(F64)
    return rope_maps(torch.cos(theta), torch.sin(theta), view.dims.rope)


def _unchecked(view, layer: int, attn) -> dict:
    return write_state(view.with_block(layer, replace(view.blocks[layer], attn=attn)))


def test_the_gains_are_read_per_head_and_written_back_bit_for_bit():
    model = _olmo2()
    view = read_view(model.spec, model.config, model.state)
    a = view.blocks[0].attn
    assert tuple(a.gq.shape) == (4, 8) and tuple(a.gk.shape) == (2, 8)
    out = write_state(view)
    assert list(out) == list(model.state)
    assert all(torch.equal(out[k], model.state[k]) for k in out)


def test_rotations_commuting_with_every_heads_gains_keep_the_logits_and_are_recovered():
    """Allowed: per-pair turns where all heads' gains are equal, sign flips elsewhere, with a
    head permutation (moving the gain rows); kept to 1e-5 and recovered to 1e-5."""
    model = _olmo2("all")
    view = read_view(model.spec, model.config, model.state)
    assert qk_fixed_pairs(view.blocks[0].attn, view.dims.rope).tolist() == [False, False,
                                                                            True, True]
    heads = torch.tensor([3, 2, 1, 0])  # swaps the two KV groups and the heads inside each
    element = {i: LayerTransform(qk=_turn_first_pairs(view, i), heads=heads)
               for i in range(view.dims.n_layers)}
    image = apply(view, element)
    assert distances(image, view).total / norm(view) > 0.1
    assert max_output_diff(model, model.state, write_state(image)) <= KEPT
    original = view.to(F64)
    result = match(original, apply(original, element),
                   MatchOptions(ffn=False, rescale=False, heads=True))
    assert distances(result.view, original).total / norm(original) <= 1e-5


def test_a_rotation_commuting_with_one_heads_gains_only_breaks_the_logits():
    """Gains equal on a pair in query head 0 and key head 0 but not in query head 1 (same KV
    group): a per-head norm's rule, read off head 0, would allow turning it; the projection
    norm gives each head its own gains, so the turn changes the logits and is refused."""
    model = _olmo2("head0")
    view = read_view(model.spec, model.config, model.state)
    a = _turn_first_pairs(view, 0)
    attn = view.blocks[0].attn
    assert not qk_norm_admits(attn, a, view.dims.rope)
    assert max_output_diff(model, model.state, _unchecked(view, 0, transform_qk(attn, a))) \
        > BROKEN
    with pytest.raises(RotvizError) as e:
        apply_layer(view, 0, LayerTransform(qk=a))
    assert "\n" not in str(e.value) and "commute with both gains" in str(e.value)


def test_a_per_head_scale_and_unmoved_gains_break_the_logits():
    """A Q-K scale on one KV group changes the RMS of the whole projection (a per-head norm
    would divide it out): refused and breaks. A head permutation that leaves the gain rows
    in place breaks; moved with the heads (permute_heads) it keeps the logits."""
    model = _olmo2()
    view = read_view(model.spec, model.config, model.state)
    attn = view.blocks[0].attn
    eye = torch.eye(8, dtype=F64).expand(2, 8, 8).clone()
    eye[0] *= 2.0
    assert not qk_norm_admits(attn, eye, view.dims.rope)
    assert max_output_diff(model, model.state, _unchecked(view, 0, transform_qk(attn, eye))) \
        > BROKEN
    with pytest.raises(RotvizError):
        apply_layer(view, 0, LayerTransform(qk=eye))
    heads = torch.tensor([2, 3, 0, 1])
    moved = apply_layer(view, 0, LayerTransform(heads=heads))
    assert max_output_diff(model, model.state, write_state(moved)) <= KEPT
    pinned = replace(moved.blocks[0].attn, gq=attn.gq, gk=attn.gk)
    assert max_output_diff(model, model.state, _unchecked(view, 0, pinned)) > BROKEN

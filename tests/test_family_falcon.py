"""Falcon in rotviz: one fused QKV per key/value group, parallel attention and FFN (from one
norm or two), rotary embeddings or ALiBi, and the configs rotviz refuses.

Tiny random models (2 layers, d = 32, 4 heads) in the variants whose tensors differ:
Falcon-7B (multi-query, one shared norm: the default), Falcon-40B's new architecture
(grouped-query, ln_attn and ln_mlp), a sequential multi-head block with biases, and that
block with ALiBi (Falcon-RW). Function checks in float32 (max logit difference), recovery in
float64 (relative distance)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rotviz.arch import Sizes, spec_for
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.groups import random_orthogonal
from rotviz.match.distances import distances, norm
from rotviz.match.engine import match
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import match_models
from rotviz.random_models import random_config, random_model, save_random
from rotviz.sources.loading import Loaded
from rotviz.sources.running import max_output_diff
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import (
    LayerTransform,
    apply,
    apply_layer,
    permute_heads,
    random_element,
)
from rotviz.symmetry.view import read_view, write_state

F64 = torch.float64
KEPT = 1e-5
BROKEN = 1e-2
VARIANTS = {  # (options, key/value heads, norms)
    "7b": ({}, 1, ["attn_in"]),
    "40b": (dict(new_arch=True), 2, ["attn_in", "ffn_in"]),
    "rw-sequential": (dict(multi_query=False, parallel=False, bias=True), 4,
                      ["attn_in", "ffn_in"]),
}
ALIBI = dict(multi_query=False, parallel=False, bias=True, alibi=True)


def _falcon(seed: int = 0, **options) -> Loaded:
    model, _ = random_model("falcon", seed, **options)
    config = model.config.to_dict()
    return Loaded("random:falcon", Path("."), config, spec_for(config), model,
                  dict(model.state_dict()))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_layout_round_trips_keeps_a_planted_element_and_recovers_it(variant):
    options, kv, norms = VARIANTS[variant]
    model = _falcon(tie=False, **options)
    view = read_view(model.spec, model.config, model.state)
    assert view.dims.n_kv_heads == kv and list(view.blocks[0].norms) == norms
    out = write_state(view)
    assert list(out) == list(model.state) and all(torch.equal(out[k], model.state[k])
                                                  for k in out)
    element = random_element(view.dims, seed=5, heads=True)
    image = apply(view, element)
    assert distances(image, view).total / norm(view) > 0.1
    assert max_output_diff(model, model.state, write_state(image)) <= KEPT
    original = view.to(F64)
    result = match(original, apply(original, element), MatchOptions(heads=True))
    assert distances(result.view, original).total / norm(original) <= 1e-5


def test_one_norm_feeding_both_branches_folds_into_both():
    """Falcon-7B's parallel block reads attention and FFN from one norm: its gain folds into
    both (a centred stream rotation then keeps the logits); folded into attention alone, as
    a block with its own FFN norm would be, it changes them."""
    model = _falcon(tie=False)
    view = read_view(model.spec, model.config, model.state)
    assert rs.group_of(view) == "centred"
    canon, _ = rs.canonicalise(view)
    assert max_output_diff(model, model.state, write_state(canon)) <= KEPT
    turned = rs.apply_residual(canon, rs.random_map(canon, seed=2))
    assert distances(turned, canon).total / norm(canon) > 0.1
    assert max_output_diff(model, model.state, write_state(turned)) <= KEPT
    wrong, _ = rs.canonicalise(replace(view, spec=replace(view.spec, shared_input_norm=False)))
    assert max_output_diff(model, model.state, write_state(wrong)) > BROKEN


def test_alibi_keeps_any_qk_map_but_refuses_moving_heads():
    """ALiBi: no rotary constraint (an invertible Q-K map keeps the logits), but each head
    has its own slope: a head permutation breaks the logits and is refused in one line."""
    model = _falcon(**ALIBI)
    view = read_view(model.spec, model.config, model.state)
    assert view.dims.alibi and view.dims.rope is None
    gen = torch.Generator().manual_seed(3)
    a = random_orthogonal(view.dims.n_kv_heads, view.dims.d_head, gen) * 1.7
    kept = apply_layer(view, 0, LayerTransform(qk=a))
    assert max_output_diff(model, model.state, write_state(kept)) <= KEPT
    element = random_element(view.dims, seed=4, heads=True)  # heads stay in place
    assert all(torch.equal(t.heads, torch.arange(4)) for t in element.values())
    assert max_output_diff(model, model.state, write_state(apply(view, element))) <= KEPT
    heads = torch.tensor([1, 0, 2, 3])
    moved = replace(view.blocks[0], attn=permute_heads(view.blocks[0].attn, heads))
    assert max_output_diff(model, model.state, write_state(view.with_block(0, moved))) > BROKEN
    with pytest.raises(RotvizError) as e:
        apply_layer(view, 0, LayerTransform(heads=heads))
    assert "\n" not in str(e.value) and "slope" in str(e.value)
    with pytest.raises(RotvizError) as e:
        match_models(model, _falcon(1, **ALIBI), MatchOptions(heads=True))
    assert "\n" not in str(e.value) and "match without heads" in str(e.value)


def test_a_config_rotviz_does_not_model_is_refused_in_one_line(tmp_path, capsys):
    """A new-architecture block without parallel attention (transformers builds norms its
    forward does not read) is refused from its config, before anything is computed."""
    config = random_config("falcon", Sizes(), new_arch=True, parallel=False)
    with pytest.raises(RotvizError) as e:
        spec_for(config)
    assert "\n" not in str(e.value) and "parallel_attn=False" in str(e.value)
    good = save_random("falcon", tmp_path / "good")
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg |= {"new_decoder_architecture": True, "parallel_attn": False}
    (bad / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    rc = main(["match", str(good), str(bad), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "does not model" in err
    assert not (tmp_path / "out").exists()

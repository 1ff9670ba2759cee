"""ModernBERT, DistilBERT and ELECTRA in rotviz: the quirks that set their groups apart.

Tiny random models (2 layers, d = 32, 4 heads, FFN 64; ELECTRA's embeddings 16 wide, projected
into the stream). Each planted element (heads, Q-K, V-O, FFN maps and a stream permutation)
keeps the logits to 1e-5 and is recovered in float64 to 1e-5; maps just outside each group
break them: a stream rotation (every family: a norm sits on each stream, ModernBERT's on its
embeddings' output though it is pre-norm), a centred stream rotation (which a pre-LayerNorm
stream without that norm would allow), the GeGLU gate moved without its up half, ELECTRA's
embedding tables moved as if they were on the stream. Refusals are one line.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rotviz.arch import Sizes, family_module, spec_for
from rotviz.errors import RotvizError
from rotviz.groups import random_orthogonal
from rotviz.match.distances import distances, norm
from rotviz.match.engine import match
from rotviz.match.options import MatchOptions
from rotviz.random_models import random_model
from rotviz.sources.running import max_output_diff
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import LayerTransform, apply, random_element
from rotviz.symmetry.view import read_view, write_state

F64 = torch.float64
KEPT = 1e-5  # float32 logits under a planted element
BROKEN = 1e-2  # a map outside the group moves them by far more
RECOVERED = 1e-5
VARIANTS = {
    "modernbert": ("modernbert", {}),
    "modernbert-biases": ("modernbert", dict(bias=True)),
    "distilbert": ("distilbert", {}),
    "electra-projected": ("electra", {}),  # embedding_size d / 2: embeddings_project
    "electra-equal": ("electra", dict(embedding=32)),  # tables and their norm on the stream
    "electra-discriminator": ("electra", dict(discriminator=True)),  # ElectraForPreTraining
}
_CACHE: dict[tuple, tuple] = {}


def _model(variant: str, dtype=torch.float32):
    """(module, state, view) of a variant's random model, cached (never modify them)."""
    key = (variant, dtype)
    if key not in _CACHE:
        family, options = VARIANTS[variant]
        module, _ = random_model(family, 0, dtype=dtype, **options)
        config = module.config.to_dict()
        state = dict(module.state_dict())
        _CACHE[key] = (module, state, read_view(spec_for(config), config, state))
    return _CACHE[key]


def _diff(variant: str, view) -> float:
    from pathlib import Path

    from rotviz.sources.loading import Loaded

    module, state, v = _model(variant)
    loaded = Loaded(variant, Path("."), module.config.to_dict(), v.spec, module, state)
    return max_output_diff(loaded, state, write_state(view))


def _stream_element(view, seed: int):
    perm = torch.randperm(view.dims.d_model, generator=torch.Generator().manual_seed(seed))
    return torch.eye(view.dims.d_model, dtype=F64)[perm]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_planted_element_keeps_the_logits_and_is_recovered(variant):
    view = _model(variant)[2]
    assert rs.group_of(view) == "permutation"
    element, q = random_element(view.dims, 11, heads=True), _stream_element(view, 5)
    assert _diff(variant, rs.apply_residual(apply(view, element), q)) <= KEPT
    original = _model(variant, F64)[2]
    image = rs.apply_residual(apply(original, element), q)
    assert distances(image, original).total / norm(original) > 0.1
    out = match(original, image, MatchOptions(heads=True, residual=True))
    assert distances(out.view, original).total / norm(original) <= RECOVERED


@pytest.mark.parametrize("variant", ["modernbert", "distilbert", "electra-projected"])
def test_a_stream_rotation_breaks_the_logits_and_is_refused(variant):
    view = _model(variant)[2]
    q = random_orthogonal(1, view.dims.d_model, torch.Generator().manual_seed(8))[0]
    assert _diff(variant, rs.apply_residual(view, q, check=False)) > BROKEN
    with pytest.raises(RotvizError) as e:
        rs.apply_residual(view, q)
    assert "\n" not in str(e.value)


def test_modernbert_embedding_norm_rules_out_the_centred_rotations_of_pre_layernorm():
    """Pre-LayerNorm streams (GPT-2) allow orthogonal maps with Q 1 = 1 once gains are
    folded; ModernBERT's stream starts at its embedding norm's output, whose gain cannot be
    folded anywhere: such a map breaks it even with every block gain folded, and a request
    for that group is refused in one line."""
    view = _model("modernbert")[2]
    spec = replace(view.spec, stream_norms=())  # as if the embedding norm were not there
    folded, _ = rs.canonicalise(replace(view, spec=spec, layout=replace(view.layout,
                                                                        stream_norms=())))
    assert rs.group_of(folded) == "centred"
    q = rs.random_map(folded, seed=3)
    moved = rs.apply_residual(folded, q)
    assert _diff("modernbert", replace(folded, spec=view.spec, layout=view.layout)) <= KEPT
    assert _diff("modernbert", replace(moved, spec=view.spec, layout=view.layout)) > BROKEN
    with pytest.raises(RotvizError) as e:
        rs.check_group(view, "centred")
    assert "\n" not in str(e.value) and "embeddings' output" in str(e.value)


def test_modernbert_gate_and_up_halves_of_wi_move_together():
    view = _model("modernbert")[2]
    perm = torch.randperm(view.dims.d_ffn, generator=torch.Generator().manual_seed(9))
    assert _diff("modernbert", apply(view, {1: LayerTransform(perm=perm)})) <= KEPT
    ffn = view.blocks[1].ffn
    gate_only = replace(view.blocks[1], ffn=replace(ffn, w_gate=ffn.w_gate[perm]))
    assert _diff("modernbert", view.with_block(1, gate_only)) > BROKEN


def test_modernbert_block_zero_has_no_attention_norm_and_the_others_move():
    view = _model("modernbert")[2]
    assert "attn_in" not in view.blocks[0].norms and "attn_in" in view.blocks[1].norms
    q = _stream_element(view, 2)
    moved = rs.apply_residual(view, q)
    w = view.blocks[1].norms["attn_in"].weight
    assert torch.equal(moved.blocks[1].norms["attn_in"].weight, w @ q.to(w))


def test_electra_projection_carries_the_stream_map_and_the_tables_stay():
    view = _model("electra-projected")[2]
    assert view.layout.writers == ("electra.embeddings_project.weight",
                                   "electra.embeddings_project.bias")
    assert view.layout.stream_norms == ()
    q = _stream_element(view, 4)
    moved = rs.apply_residual(view, q)
    for k in ("electra.embeddings.word_embeddings.weight", "electra.embeddings.LayerNorm.weight"):
        assert torch.equal(moved.other[k], view.other[k])
    w = view.other["electra.embeddings_project.weight"]
    assert torch.equal(moved.other["electra.embeddings_project.weight"], q.t().to(w) @ w)
    # negative control: the tables moved as a stream writer's would be (their last axis is
    # the embedding space, not the stream) with the projection left alone
    e = view.dims.d_model // 2
    qe = random_orthogonal(1, e, torch.Generator().manual_seed(1))[0].to(w)
    other = dict(view.other)
    for k in ("electra.embeddings.word_embeddings.weight",
              "electra.embeddings.position_embeddings.weight",
              "electra.embeddings.token_type_embeddings.weight"):
        other[k] = other[k] @ qe
    assert _diff("electra-projected", replace(view, other=other)) > BROKEN


def test_modernbert_rotary_scaling_is_refused_in_one_line():
    import transformers as T

    config = family_module("modernbert").random_config(Sizes())
    config["rope_parameters"]["full_attention"] |= {"rope_type": "linear", "factor": 2.0}
    torch.manual_seed(0)
    state = T.ModernBertForSequenceClassification(T.AutoConfig.for_model(**config)).state_dict()
    with pytest.raises(RotvizError) as e:
        read_view(spec_for(config), config, state)
    assert "\n" not in str(e.value) and "rope_type" in str(e.value) and "'linear'" in str(e.value)


def test_distilbert_sizes_under_its_own_names_are_checked_in_one_line(tmp_path, capsys):
    """DistilBERT names its sizes dim, n_layers, n_heads, hidden_dim: a config that lies
    about its FFN width is refused before anything is built."""
    import json

    from rotviz.cli import main
    from rotviz.random_models import save_random

    path = save_random("distilbert", tmp_path / "m", seed=0)
    config = json.loads((path / "config.json").read_text()) | {"hidden_dim": 48}
    (path / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    rc = main(["match", str(path), str(path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "48 wide" in err
    assert not (tmp_path / "o").exists()


def _head_cells() -> list[tuple[str, str]]:
    from test_compatibility import head_classes

    return [(f, c) for f in ("modernbert", "distilbert", "electra") for c in head_classes(f)]


@pytest.mark.parametrize(("family", "cls"), _head_cells())
def test_every_head_class_keeps_its_outputs_under_a_stream_permutation(family, cls):
    """Each head reads the stream where its family file says (ELECTRA's multiple-choice
    classifier reads the summary, not the stream; ModernBERT's heads all read head.dense);
    a headless model or a tied decoder reading a space of its own is refused in one line."""
    from pathlib import Path

    import transformers as T

    from rotviz.heads import residual_refusal
    from rotviz.sources.loading import Loaded

    config = family_module(family).random_config(Sizes()) | {"architectures": [cls]}
    if "Classification" in cls or "QuestionAnswering" in cls:
        config |= {"num_labels": 2, "id2label": {0: "a", 1: "b"}, "label2id": {"a": 0, "b": 1}}
    hf = T.AutoConfig.for_model(**config)
    torch.manual_seed(0)
    module = getattr(T, cls)(hf).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # biases and gains off their init
    config, state = hf.to_dict(), dict(module.state_dict())
    view = read_view(spec_for(config), config, state)
    why = rs.unsupported(view) or residual_refusal(config)
    if cls.endswith("Model") or cls.endswith("ForMaskedLM") and family != "electra":
        assert why is not None and "\n" not in why
        return
    assert why is None
    moved = write_state(rs.apply_residual(view, _stream_element(view, 6)))
    loaded = Loaded(cls, Path("."), config, view.spec, module, state)
    assert max_output_diff(loaded, state, moved) <= KEPT
    assert any(not torch.equal(moved[k], state[k]) for k in view.other)  # the head moved


def test_modernbert_probes_reach_past_its_sliding_window():
    """The random model's layer 1 is windowed: the same weights with a window wider than
    the probes give other logits, so the planted elements above are checked on local
    attention too."""
    from pathlib import Path

    import transformers as T

    from rotviz.sources.loading import Loaded
    from rotviz.sources.running import forward, probe_inputs

    module, state, view = _model("modernbert")
    wide = module.config.to_dict() | {"local_attention": 64}
    other = T.ModernBertForSequenceClassification(T.AutoConfig.for_model(**wide)).eval()
    other.load_state_dict(state)
    loaded = Loaded("m", Path("."), module.config.to_dict(), view.spec, module, state)
    x = probe_inputs(loaded)
    assert x["input_ids"].shape[-1] > 4
    with torch.no_grad():
        assert (other(**x).logits - forward(loaded, x)).abs().max() > BROKEN

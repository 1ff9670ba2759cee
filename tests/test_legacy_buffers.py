"""Checkpoints in the format older transformers versions saved (rotviz.sources.legacy): position
ids, per-layer rotary frequencies, causal masks and their fill values beside the weights. Each
loads with exactly the logits of the same weights saved today, a match writes today's format
(what transformers loads with no unexpected key), the streamed match writes what the
in-memory one writes, and a tensor no class reads past is still refused in one line."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rotviz.atsize.blocks import open_streamed
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.match.at_size import match_streamed
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import match_models
from rotviz.sources.checkpoint import SINGLE, Checkpoint
from rotviz.sources.legacy import buffer_like, read_past
from rotviz.sources.loading import Loaded, load_model
from rotviz.sources.plain_torch import LiteGPT2, load_lite
from rotviz.sources.running import forward, probe_inputs
from rotviz.sources.writing import save_model

Tensor = torch.Tensor
ROPE = ("llama", "mistral", "qwen2", "gemma", "phi3")


def _mask(p: int) -> Tensor:
    return torch.tril(torch.ones(p, p, dtype=torch.bool))[None, None]


def _ids(p: int) -> Tensor:
    return torch.arange(p)[None]


def _old_tensors(family: str, clean: Loaded) -> dict[str, Tensor]:
    """What a checkpoint of `clean`'s weights held when older versions saved it, under the
    names they saved it with: BERT-likes' position ids; GPT-2's per-layer causal mask and
    fill value; GPT-NeoX's (Pythia's) mask, fill value and rotary frequencies; LLaMA-likes'
    per-layer rotary frequencies (shaped as the model's one buffer of them today)."""
    cfg = clean.config
    p = cfg.get("n_positions") or cfg["max_position_embeddings"]
    layers = range(cfg.get("n_layer") or cfg["num_hidden_layers"])
    freq = next((t for n, t in clean.model.named_buffers() if n.endswith("rotary_emb.inv_freq")),
                None)
    if family in ("bert", "roberta", "deberta-v2"):
        root = {"bert": "bert", "roberta": "roberta", "deberta-v2": "deberta"}[family]
        return {f"{root}.embeddings.position_ids": _ids(p)}
    if family == "electra":  # (DistilBERT's never saved them)
        return {"electra.embeddings.position_ids": _ids(p)}
    if family == "gpt2":
        return {k: v for i in layers for k, v in (
            (f"transformer.h.{i}.attn.masked_bias", torch.tensor(-1e4)),
            (f"transformer.h.{i}.attn.bias", _mask(p)))}
    if family == "gpt-neox":
        return {k: v for i in layers for k, v in (
            (f"gpt_neox.layers.{i}.attention.rotary_emb.inv_freq", freq.clone()),
            (f"gpt_neox.layers.{i}.attention.bias", _mask(p)),
            (f"gpt_neox.layers.{i}.attention.masked_bias", torch.tensor(-1e9)))}
    assert family in ROPE
    return {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": freq.clone() for i in layers}


@pytest.fixture(scope="module")
def old(saved, loaded, tmp_path_factory) -> Callable[..., Path]:
    """`old(family, seed, bin=False, extra=None)`: the tiny saved model `saved(family, seed)`
    with the tensors older versions saved added (and `extra`), as safetensors or a pickled
    pytorch_model.bin (cached)."""
    root = tmp_path_factory.mktemp("old")
    cache: dict[tuple, Path] = {}

    def get(family: str, seed: int, bin: bool = False,
            extra: dict[str, Tensor] | None = None) -> Path:
        key = (family, seed, bin, tuple(sorted(extra or {})))
        if key not in cache:
            clean = saved(family, seed)
            out = root / f"{family}-{seed}-{len(cache)}"
            shutil.copytree(clean, out)
            state = load_file(clean / SINGLE)
            state.update(_old_tensors(family, loaded(family, seed)))
            state.update(extra or {})
            if bin:
                (out / SINGLE).unlink()
                torch.save(state, out / "pytorch_model.bin")
            else:
                save_file(state, out / SINGLE, metadata={"format": "pt"})
            cache[key] = out
        return cache[key]

    return get


OLD_FAMILIES = ("bert", "roberta", "deberta-v2", "gpt2", "gpt-neox", *ROPE)
OLD_FAMILIES += ("electra",)  # BERT's position ids, saved until transformers 4.31


@pytest.mark.parametrize("family", OLD_FAMILIES)
def test_old_checkpoint_loads_with_the_same_logits(family, old, saved, loaded):
    path = old(family, 0)
    added = set(Checkpoint(path).keys()) - set(Checkpoint(saved(family, 0)).keys())
    assert added == set(_old_tensors(family, loaded(family, 0)))
    mine, clean = load_model(path), loaded(family, 0)
    assert set(mine.state) == set(clean.state)  # the buffers are read past, nothing else
    assert all(torch.equal(mine.state[k], t) for k, t in clean.state.items())
    x = probe_inputs(clean)
    assert torch.equal(forward(mine, x), forward(clean, x))


def _hf_report(folder: Path) -> dict:
    """transformers' own loading report of a written folder, by the class it names."""
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(folder)
    cls = getattr(transformers, cfg.architectures[0])
    _, info = cls.from_pretrained(folder, output_loading_info=True)
    return info


@pytest.mark.parametrize("family", OLD_FAMILIES)
def test_match_writes_todays_format_in_memory_and_streamed(family, old, saved, loaded,
                                                           tmp_path):
    """A clean anchor and an old-format source: the matched source is written without the
    old tensors (exactly the clean checkpoint's names), transformers loads it with nothing
    unexpected or missing, and the streamed match writes what the in-memory one writes."""
    anchor, source = saved(family, 0), old(family, 1)
    options = MatchOptions()
    src = load_model(source)
    res = match_models(loaded(family, 0), src, options)
    assert res.report.max_output_diff < 1e-4
    mem = save_model(src, res.state, tmp_path / "mem")
    (tmp_path / "st").mkdir()
    rep = match_streamed(open_streamed(anchor), open_streamed(source), tmp_path / "st", options)
    assert rep.max_output_diff < 1e-4
    # the same distances (the old tensors counted in neither); matching closed some
    for mine, ref in ((rep.before, res.report.before), (rep.after, res.report.after)):
        assert set(mine.cells) == set(ref.cells)
        assert mine.total == pytest.approx(ref.total, rel=1e-5)
    inside = [c for c in rep.before.cells if c[0] is not None]  # blocks: what maps move
    assert sum(rep.after.cells[c] for c in inside) < sum(rep.before.cells[c] for c in inside)
    today = set(Checkpoint(saved(family, 1)).keys())
    a, b = load_file(mem / SINGLE), load_file(tmp_path / "st" / SINGLE)
    assert set(a) == set(b) == today
    for k, t in a.items():
        assert t.dtype == b[k].dtype
        assert float((t.double() - b[k].double()).abs().max()) <= 1e-6 * max(
            1.0, float(t.double().abs().max())), k
    for folder in (mem, tmp_path / "st"):
        info = _hf_report(folder)
        assert not info["unexpected_keys"] and not info["missing_keys"], info


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_a_pickled_old_checkpoint_loads(family, old, loaded):
    """pytorch_model.bin, read with weights_only: GPT-2's masked_bias is reported by
    transformers itself and read past by rotviz; BERT's position ids by both."""
    path = old(family, 0, bin=True)
    assert not (path / SINGLE).exists()
    mine, clean = load_model(path), loaded(family, 0)
    x = probe_inputs(clean)
    assert torch.equal(forward(mine, x), forward(clean, x))


def test_lite_reads_an_old_gpt2_and_mirrors_transformers(old, saved, loaded):
    import transformers

    lite, clean = load_lite(old("gpt2", 0)), load_lite(saved("gpt2", 0))
    assert isinstance(lite.model, LiteGPT2) and set(lite.state) == set(clean.state)
    x = probe_inputs(loaded("gpt2", 0))
    assert torch.equal(forward(lite, x), forward(clean, x))
    assert set(LiteGPT2._keys_to_ignore_on_load_unexpected) == set(
        transformers.GPT2LMHeadModel._keys_to_ignore_on_load_unexpected)


@pytest.mark.parametrize(("family", "name", "tensor"), [
    ("bert", "bert.embeddings.foo", torch.zeros(3)),  # a name no class reads past
    ("bert", "bert.embeddings.position_ids", torch.zeros(32, 32)),  # weight-shaped
    ("gpt2", "transformer.h.0.attn.masked_bias", torch.ones(4, 32)),  # not a fill value
])
def test_other_extra_tensors_are_refused_in_one_line(family, name, tensor, saved, tmp_path,
                                                     capsys):
    path = tmp_path / "m"
    shutil.copytree(saved(family, 0), path)
    state = load_file(path / SINGLE)
    if name in state:
        del state[name]
    state[name] = tensor
    save_file(state, path / SINGLE, metadata={"format": "pt"})
    with pytest.raises(RotvizError, match=r"do not fit its config \(unexpected \[") as e:
        load_model(path)
    assert name in str(e.value) and "\n" not in str(e.value)
    for extra in ([], ["--max-memory", "0"]):
        capsys.readouterr()
        rc = main(["match", str(path), str(path), "--out", str(tmp_path / "o"), *extra])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and err.count("\n") == 0 and name in err, err
        assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("family", "name", "tensor"), [
    # a table DeBERTa's class lists (position_biased_input is off: its module has none)
    ("deberta-v2", "deberta.embeddings.position_embeddings.weight", torch.ones(32, 32)),
    ("gpt2", "transformer.h.0.attn.bias", torch.ones(1, 1, 33, 33)),  # GPT-2 lists attn.bias
])
def test_names_the_class_lists_are_read_past_whatever_their_shape(family, name, tensor, saved,
                                                                  loaded, tmp_path):
    """As transformers does: the class's own ignore list holds; the function is the clean
    checkpoint's, and the tensor is not written back."""
    path = tmp_path / "m"
    shutil.copytree(saved(family, 0), path)
    state = load_file(path / SINGLE)
    state[name] = tensor
    save_file(state, path / SINGLE, metadata={"format": "pt"})
    mine, clean = load_model(path), loaded(family, 0)
    assert name not in mine.state and set(mine.state) == set(clean.state)
    x = probe_inputs(clean)
    assert torch.equal(forward(mine, x), forward(clean, x))
    assert main(["match", str(path), str(path), "--out", str(tmp_path / "o")]) == 0
    assert name not in load_file(tmp_path / "o" / SINGLE)


@pytest.mark.parametrize(("shape", "ok"), [
    ((), True), ((1,), True), ((40,), True), ((1, 40), True),  # values, frequencies, ids
    ((41,), False), ((1, 41), False),  # longer than positions and width
    ((1, 1, 40, 40), True), ((1, 1, 41, 41), False), ((1, 1, 40, 39), False),  # masks
    ((40, 40), False), ((4, 10), False), ((2, 1, 40, 40), False),  # weights, batches
])
def test_buffer_like(shape, ok):
    assert buffer_like(shape, 40) is ok


def test_read_past_without_transformers_method(loaded, monkeypatch):
    """A transformers whose `_adjust_missing_and_unexpected_keys` takes other arguments
    (4.x) gives the same answer from the patterns it adds."""
    m = loaded("llama", 0)
    names = {"model.layers.0.self_attn.rotary_emb.inv_freq": (4,), "model.foo": (4,),
             "model.layers.0.self_attn.rotary_emb.other": (4,)}
    want = {"model.layers.0.self_attn.rotary_emb.inv_freq"}
    assert read_past(m.model, m.spec, m.config, names) == want
    monkeypatch.setattr(type(m.model), "_adjust_missing_and_unexpected_keys",
                        lambda self, missing, unexpected, task: (missing, unexpected))
    assert read_past(m.model, m.spec, m.config, names) == want

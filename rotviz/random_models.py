"""Random models of every supported family, built locally: for tests, benchmarks and demos.

Each family's module (rotviz/arch/families) gives the config of its random model, its
`random_config(sizes, **options)`; its keyword options (`tie`, `lm`, `kv_heads`, ...) are
options of `random_model` for that family. The module is built by the family's weight source
(rotviz.sources). Weights are drawn with a seeded generator and biases and norm parameters are
randomised too, so that every symmetry has something to act on (a fresh HF init leaves biases
at zero).
"""

from __future__ import annotations

import inspect
import math
import os
from pathlib import Path

import torch
from torch import Tensor, nn

from rotviz.arch import FAMILIES, Sizes, family_module, spec_named
from rotviz.data.tokens import CHARS, VOCAB_KEY
from rotviz.sources.adapters import source_of

__all__ = ["FAMILIES", "options", "random_config", "random_model", "save_random",
           "save_random_sharded"]


def options(family: str) -> dict[str, object]:
    """The keyword options of a family's random model and their defaults."""
    params = inspect.signature(family_module(family).random_config).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def random_config(family: str, sizes: Sizes, head: str | None = None, **given) -> dict:
    """The config (as config.json holds it) of `family`'s random model with the options
    `given`; `head` names another model class of the family (`BertForPreTraining`,
    `GPT2Model`, `LlamaForQuestionAnswering`, ...: rotviz.heads) in place of its default.
    An option of other families only (llama's `kv_heads`, gpt2's `tie`, ...) is an error
    unless it has their default value."""
    own = options(family)
    for name, value in given.items():
        if name in own:
            continue
        owners = [f for f in FAMILIES if name in options(f)]
        if not owners:
            raise TypeError(f"random_model() got an unexpected keyword argument '{name}'")
        if value != options(owners[0])[name]:
            raise ValueError(f"{name} is an option of {', '.join(owners)}, not {family}'s")
    config = family_module(family).random_config(
        sizes, **{k: v for k, v in given.items() if k in own})
    if spec_named(family).inputs != "pixels":  # rotviz's own text models read characters
        config[VOCAB_KEY] = CHARS                # (a tokenizer saved beside one takes over)
    if head is not None:
        config["architectures"] = [head]
    return config


def random_model(
    family: str,
    seed: int = 0,
    layers: int = 2,
    d: int = 32,
    heads: int = 4,
    ffn: int = 64,
    vocab: int = 61,
    image: int = 8,
    patch: int = 2,
    channels: int = 1,
    labels: int = 5,
    dtype: torch.dtype = torch.float32,
    head: str | None = None,
    **options,
) -> tuple[nn.Module, dict]:
    """A model of `family` with random weights (seeded) and its config as a dict.

    The sizes apply where the family has them (`vocab` to text models, `image`, `patch` and
    `channels` to image models); `options` are the family's own, see its `random_config`:
    llama `kv_heads`, `head_dim`, `bias`, `tie_embeddings`; gpt2 `tie` (False: an output head
    of its own, which residual maps need); bert `lm` (a causal LM head instead of a sequence
    classifier); text families `positions` (default 32; the pystdlib data needs 64).
    `head`: another model class of the family (see `random_config`)."""
    sizes = Sizes(layers, d, heads, ffn, vocab, image, patch, channels, labels)
    config = random_config(family, sizes, head, **options)
    spec = spec_named(family)
    torch.manual_seed(seed)
    model, _ = source_of(spec).build(config, spec)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(_draw(name, p.shape, gen))
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.to(dtype).eval(), config


def _draw(name: str, shape: torch.Size | tuple[int, ...], gen: torch.Generator) -> Tensor:
    """A random value of the parameter `name`: noise scaled by 1 / sqrt(fan-in) (vectors by
    0.1), plus 1 for a norm's gain."""
    scale = 0.1 if len(shape) == 1 else 1.0 / max(1, shape[-1]) ** 0.5
    noise = torch.randn(shape, generator=gen) * scale
    gain = len(shape) == 1 and name.endswith("weight") and any(
        t in name.lower() for t in ("norm", "ln_"))
    return noise + (1.0 if gain else 0.0)


def save_random(family: str, out: str | os.PathLike, seed: int = 0, **sizes) -> Path:
    """Save a random model in its source's checkpoint layout (save_pretrained; timm:
    config.json + model.safetensors)."""
    model, config = random_model(family, seed, **sizes)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    source_of(spec_named(family)).save_module(model, config, out)
    return out


def save_random_sharded(family: str, out: str | os.PathLike, seed: int = 0,
                        dtype: torch.dtype = torch.bfloat16, shards: int = 4,
                        **sizes) -> Path:
    """A random model of `family` written tensor by tensor into `shards` safetensors shards,
    never whole in memory: models larger than this machine's memory, for the streamed
    matching's tests and benchmarks. Weights as `random_model` draws them (seeded per tensor,
    so not the same numbers), `sizes` as its keywords."""
    from rotviz.atsize.runtime import build_meta
    from rotviz.sources.shards import ShardWriter

    keys = ("layers", "d", "heads", "ffn", "vocab", "image", "patch", "channels", "labels")
    defaults = inspect.signature(random_model).parameters
    given = {k: sizes.pop(k, defaults[k].default) for k in keys}
    config = random_config(family, Sizes(**given), **sizes)
    spec = spec_named(family)
    module, _ = build_meta(spec, config)
    state = module.state_dict()
    tied = config.get("tie_word_embeddings") is not False
    ties = {alias for alias, _ in spec.tied} | set(
        getattr(module, "_tied_weights_keys", None) or ()) if tied else set()
    names = [n for n in state if n not in ties]
    plan = [(n, dtype if state[n].is_floating_point() else state[n].dtype,
             tuple(state[n].shape)) for n in names]
    total = sum(math.prod(s) * d.itemsize for _, d, s in plan)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=False)
    writer = ShardWriter(out, plan, -(-total // shards))
    try:
        for k, (n, dt, shape) in enumerate(plan):
            gen = torch.Generator().manual_seed(seed * 1_000_003 + k)
            if not dt.is_floating_point:
                writer.write(n, state[n].to("cpu") if state[n].device.type != "meta"
                             else torch.zeros(shape, dtype=dt))
                continue
            writer.write(n, _draw(n, shape, gen).to(dt))
        writer.close()
    finally:
        writer.abort()
    import json

    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out

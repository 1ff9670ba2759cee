"""Random models of every supported family, built locally: for tests, benchmarks and demos.

Weights are drawn with a seeded generator and biases and norm parameters are randomised too,
so that every symmetry has something to act on (a fresh HF init leaves biases at zero).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

FAMILIES = ("gpt2", "bert", "roberta", "vit", "timm-vit")


def _hf_config(
    family: str,
    layers: int,
    d: int,
    heads: int,
    ffn: int,
    vocab: int,
    image: int,
    patch: int,
    channels: int,
    labels: int,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    bias: bool = False,
    tie_embeddings: bool = False,
    tie: bool = True,
    positions: int = 32,
    lm: bool = False,
):
    import transformers as T

    if family == "llama":
        if kv_heads is None:
            kv_heads = heads // 2 if heads % 2 == 0 else heads  # grouped-query attention
        return T.LlamaConfig(
            num_hidden_layers=layers,
            hidden_size=d,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim if head_dim is not None else d // heads,
            intermediate_size=ffn,
            vocab_size=vocab,
            max_position_embeddings=positions,
            rope_theta=100.0,  # short contexts: lower base, so every pair turns visibly
            attention_bias=bias,
            mlp_bias=bias,
            tie_word_embeddings=tie_embeddings,
            bos_token_id=0,
            eos_token_id=0,
            architectures=["LlamaForCausalLM"],
        ), T.LlamaForCausalLM

    if family == "gpt2":
        return T.GPT2Config(
            n_layer=layers,
            n_embd=d,
            n_head=heads,
            n_inner=ffn,
            vocab_size=vocab,
            n_positions=positions,
            bos_token_id=0,
            eos_token_id=0,
            tie_word_embeddings=tie,
            architectures=["GPT2LMHeadModel"],
        ), T.GPT2LMHeadModel
    common = dict(
        num_hidden_layers=layers, hidden_size=d, num_attention_heads=heads, intermediate_size=ffn
    )
    if family == "bert":  # a sequence classifier, or with lm=True a causal LM head
        cls = T.BertLMHeadModel if lm else T.BertForSequenceClassification
        head = dict(is_decoder=True) if lm else dict(num_labels=labels)
        return T.BertConfig(vocab_size=vocab, max_position_embeddings=positions,
                            architectures=[cls.__name__], **head, **common), cls
    if family == "roberta":
        return T.RobertaConfig(
            vocab_size=vocab,
            max_position_embeddings=positions + 2,  # counted from pad_token_id + 1
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            architectures=["RobertaForMaskedLM"],
            **common,
        ), T.RobertaForMaskedLM
    if family == "vit":
        return T.ViTConfig(
            image_size=image,
            patch_size=patch,
            num_channels=channels,
            num_labels=labels,
            architectures=["ViTForImageClassification"],
            **common,
        ), T.ViTForImageClassification
    raise ValueError(family)


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
    kv_heads: int | None = None,
    head_dim: int | None = None,
    bias: bool = False,
    tie_embeddings: bool = False,
    tie: bool = True,
    positions: int = 32,
    lm: bool = False,
) -> tuple[nn.Module, dict]:
    """A model of `family` with random weights (seeded) and its config as a dict.

    llama only: `kv_heads` key/value heads (default heads // 2: grouped-query attention),
    `head_dim` (default d // heads), `bias` (biases on attention and FFN linears) and
    `tie_embeddings` (lm_head shares the embedding table; untied by default).
    gpt2: `tie=False` gives it an output head of its own (residual maps need one).
    Text families: `positions` tokens of context (default 32; the pystdlib data needs 64).
    bert: `lm=True` builds BertLMHeadModel (a causal next-token head tied to the embeddings)
    instead of BertForSequenceClassification, whose one label per text fits no text data."""
    if family != "llama" and (kv_heads is not None or head_dim is not None or bias
                              or tie_embeddings):
        raise ValueError(
            f"kv_heads, head_dim, bias and tie_embeddings are llama options, not {family}'s"
        )
    if family != "gpt2" and not tie:
        raise ValueError(f"tie is a gpt2 option, not {family}'s")
    if family != "bert" and lm:
        raise ValueError(f"lm is a bert option, not {family}'s")
    if family in ("vit", "timm-vit") and positions != 32:
        raise ValueError(f"positions is an option of text families, not {family}'s")
    torch.manual_seed(seed)
    if family == "timm-vit":
        import timm

        args = dict(
            img_size=image,
            patch_size=patch,
            in_chans=channels,
            embed_dim=d,
            depth=layers,
            num_heads=heads,
            mlp_ratio=ffn / d,
            num_classes=labels,
        )
        model = timm.create_model("vit_base_patch16_224", pretrained=False, **args)
        config = {
            "architecture": "vit_base_patch16_224",
            "num_classes": labels,
            "model_args": {k: v for k, v in args.items() if k != "num_classes"},
        }
    else:
        cfg, cls = _hf_config(family, layers, d, heads, ffn, vocab, image, patch, channels, labels,
                              kv_heads, head_dim, bias, tie_embeddings, tie, positions, lm)
        model = cls(cfg)
        config = cfg.to_dict()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            scale = 0.1 if p.dim() == 1 else 1.0 / max(1, p.shape[-1]) ** 0.5
            noise = torch.randn(p.shape, generator=gen) * scale
            p.copy_(noise + (1.0 if p.dim() == 1 and _is_gain(model, p) else 0.0))
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.to(dtype).eval(), config


def _is_gain(model: nn.Module, p: nn.Parameter) -> bool:
    for name, q in model.named_parameters():
        if q is p:
            return name.endswith("weight") and any(t in name.lower() for t in ("norm", "ln_"))
    return False


def save_random(family: str, out: str | os.PathLike, seed: int = 0, **sizes) -> Path:
    """Save a random model in save_pretrained layout (timm: config.json + model.safetensors)."""
    import json

    from safetensors.torch import save_file

    model, config = random_model(family, seed, **sizes)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if family == "timm-vit":
        (out / "config.json").write_text(json.dumps(config, indent=2))
        save_file(
            {k: v.contiguous() for k, v in model.state_dict().items()},
            str(out / "model.safetensors"),
        )
    else:
        model.save_pretrained(str(out), safe_serialization=True)
    return out

"""Hugging Face Gemma: the LLaMA layout with GeGLU, a head size set apart from d / H, embeddings
scaled by sqrt(d) inside the model (a constant, so it commutes with every stream map) and
RMSNorms that store their gain as an offset from 1: gain = 1 + w (`norm_offset`), which the
residual folding reads."""

from __future__ import annotations

from dataclasses import replace

from rotviz.arch.families import llama
from rotviz.arch.spec import Sizes

ORDER = 8
# Gemma ties lm_head to the embedding table; residual maps need a model saved untied
UNTIED: dict | None = {"tie": False}

SPEC = replace(
    llama.SPEC,
    family="gemma",
    description="Hugging Face Gemma (the LLaMA layout with GeGLU, (1 + w) RMSNorm gains, "
    "scaled embeddings, head size apart from d / H)",
    model_types=("gemma",),
    activation_key=("hidden_activation", "hidden_act"),
    default_activation="gelu_pytorch_tanh",
    norm_offset=1.0,
)


def random_config(s: Sizes, *, kv_heads: int | None = None, head_dim: int | None = None,
                  tie: bool = True, positions: int = 32) -> dict:
    """A GemmaForCausalLM: `kv_heads` key/value heads (default heads // 2), `head_dim`
    (default 2 d / heads: H d_h != d, as in Gemma-2B's 8 x 256 heads on d 2048), `tie`
    (lm_head shares the embedding table, as every Gemma does), `positions` tokens."""
    import transformers as T

    if kv_heads is None:
        kv_heads = s.heads // 2 if s.heads % 2 == 0 else s.heads
    return T.GemmaConfig(
        num_hidden_layers=s.layers, hidden_size=s.d, num_attention_heads=s.heads,
        num_key_value_heads=kv_heads, head_dim=head_dim or 2 * s.d // s.heads,
        intermediate_size=s.ffn, vocab_size=s.vocab, max_position_embeddings=positions,
        rope_theta=100.0, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=tie,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, architectures=["GemmaForCausalLM"],
    ).to_dict()

"""Hugging Face Mistral: the LLaMA layout (pre-RMSNorm decoder, SwiGLU, grouped-query attention,
rotary embeddings). Sliding-window attention masks positions, not weights: the group is LLaMA's."""

from __future__ import annotations

from dataclasses import replace

from rotviz.arch.families import llama
from rotviz.arch.spec import Sizes

ORDER = 6
UNTIED: dict | None = {}  # untied by default

SPEC = replace(
    llama.SPEC,
    family="mistral",
    description="Hugging Face Mistral (the LLaMA layout: pre-RMSNorm decoder, SwiGLU FFN, "
    "grouped-query attention, rotary embeddings)",
    model_types=("mistral",),
)


def random_config(s: Sizes, *, kv_heads: int | None = None, tie: bool = False,
                  positions: int = 32) -> dict:
    """A MistralForCausalLM: `kv_heads` key/value heads (default heads // 2), `tie` (lm_head
    shares the embedding table), `positions` tokens of context."""
    import transformers as T

    if kv_heads is None:
        kv_heads = s.heads // 2 if s.heads % 2 == 0 else s.heads
    return T.MistralConfig(
        num_hidden_layers=s.layers, hidden_size=s.d, num_attention_heads=s.heads,
        num_key_value_heads=kv_heads, head_dim=s.d // s.heads, intermediate_size=s.ffn,
        vocab_size=s.vocab, max_position_embeddings=positions, rope_theta=100.0,
        sliding_window=None, tie_word_embeddings=tie, bos_token_id=0, eos_token_id=0,
        architectures=["MistralForCausalLM"],
    ).to_dict()

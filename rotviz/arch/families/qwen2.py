"""Hugging Face Qwen2 / Qwen2.5: the LLaMA layout plus biases on Q, K and V (none on O). The
biases move with their rows: by the RoPE-commuting Q-K maps and by the V-O maps."""

from __future__ import annotations

from dataclasses import replace

from rotviz.arch.families import llama
from rotviz.arch.spec import Sizes

ORDER = 7
# Small Qwen2 checkpoints tie lm_head to the embedding table; residual maps need it untied
UNTIED: dict | None = {"tie": False}

SPEC = replace(
    llama.SPEC,
    family="qwen2",
    description="Hugging Face Qwen2 (the LLaMA layout with Q/K/V biases)",
    model_types=("qwen2",),
)


def random_config(s: Sizes, *, kv_heads: int | None = None, tie: bool = True,
                  positions: int = 32) -> dict:
    """A Qwen2ForCausalLM: `kv_heads` key/value heads (default heads // 2), `tie` (lm_head
    shares the embedding table, as in Qwen2-0.5B and 1.5B), `positions` tokens of context."""
    import transformers as T

    if kv_heads is None:
        kv_heads = s.heads // 2 if s.heads % 2 == 0 else s.heads
    return T.Qwen2Config(
        num_hidden_layers=s.layers, hidden_size=s.d, num_attention_heads=s.heads,
        num_key_value_heads=kv_heads, intermediate_size=s.ffn, vocab_size=s.vocab,
        max_position_embeddings=positions, rope_theta=100.0, use_sliding_window=False,
        tie_word_embeddings=tie, bos_token_id=0, eos_token_id=0,
        architectures=["Qwen2ForCausalLM"],
    ).to_dict()

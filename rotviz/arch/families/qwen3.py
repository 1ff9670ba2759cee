"""Hugging Face Qwen3: the LLaMA layout plus per-head RMSNorms on queries and keys before RoPE
(`q_norm`, `k_norm`). Their gains shrink the Q-K group to orthogonal maps that commute with
them: per frequency pair a free angle where both gains are equal on the pair, else a sign
flip (derivation: rotviz.symmetry.actions). V-O, heads, FFN and the stream are LLaMA's."""

from __future__ import annotations

from dataclasses import replace

from rotviz.arch.families import llama
from rotviz.arch.spec import Sizes

ORDER = 12
# Small Qwen3 checkpoints tie lm_head to the embedding table; residual maps need it untied
UNTIED: dict | None = {"tie": False}

SPEC = replace(
    llama.SPEC,
    family="qwen3",
    description="Hugging Face Qwen3 (the LLaMA layout with per-head q/k RMSNorms)",
    model_types=("qwen3",),
    qk_norms=(("self_attn.q_norm",), ("self_attn.k_norm",)),
)


def random_config(s: Sizes, *, kv_heads: int | None = None, tie: bool = True,
                  positions: int = 32) -> dict:
    """A Qwen3ForCausalLM: `kv_heads` key/value heads (default heads // 2), `tie` (lm_head
    shares the embedding table, as in Qwen3-0.6B), `positions` tokens of context."""
    import transformers as T

    if kv_heads is None:
        kv_heads = s.heads // 2 if s.heads % 2 == 0 else s.heads
    return T.Qwen3Config(
        num_hidden_layers=s.layers, hidden_size=s.d, num_attention_heads=s.heads,
        num_key_value_heads=kv_heads, head_dim=s.d // s.heads, intermediate_size=s.ffn,
        vocab_size=s.vocab, max_position_embeddings=positions, rope_theta=100.0,
        use_sliding_window=False, tie_word_embeddings=tie, bos_token_id=0, eos_token_id=0,
        architectures=["Qwen3ForCausalLM"],
    ).to_dict()

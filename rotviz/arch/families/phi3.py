"""Hugging Face Phi-3: the LLaMA layout with fused linears, `qkv_proj` = [Q; K; V] (grouped
query attention) and `gate_up_proj` = [gate; up] (`ffn_gate_up`): the SwiGLU permutation
moves both halves' rows together. Partial rotary where the config sets
`partial_rotary_factor`."""

from __future__ import annotations

from dataclasses import replace

from rotviz.arch.families import llama
from rotviz.arch.spec import LinearSpec, Sizes

ORDER = 11
UNTIED: dict | None = {}  # untied by default

SPEC = replace(
    llama.SPEC,
    family="phi3",
    description="Hugging Face Phi-3 (the LLaMA layout with fused QKV and fused gate/up)",
    model_types=("phi3",),
    qkv=LinearSpec(("self_attn.qkv_proj",)),
    q=None,
    k=None,
    v=None,
    ffn_in=LinearSpec(("mlp.gate_up_proj",)),
    ffn_gate=None,
    ffn_gate_up=True,
    rope_fraction_key=("partial_rotary_factor",),
)


def random_config(s: Sizes, *, kv_heads: int | None = None, rotary: float = 1.0,
                  positions: int = 32) -> dict:
    """A Phi3ForCausalLM: `kv_heads` key/value heads (default heads // 2), `rotary` the
    share of each head's dims rotary embeddings turn (Phi-3's 1.0 by default)."""
    import transformers as T

    if kv_heads is None:
        kv_heads = s.heads // 2 if s.heads % 2 == 0 else s.heads
    return T.Phi3Config(
        num_hidden_layers=s.layers, hidden_size=s.d, num_attention_heads=s.heads,
        num_key_value_heads=kv_heads, intermediate_size=s.ffn, vocab_size=s.vocab,
        max_position_embeddings=positions, original_max_position_embeddings=positions,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0,
                         "partial_rotary_factor": rotary},
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        architectures=["Phi3ForCausalLM"],
    ).to_dict()

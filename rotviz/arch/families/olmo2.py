"""Hugging Face OLMo-2 (AI2's open models with published training checkpoints): the LLaMA
tensors (SwiGLU FFN, grouped-query attention, RoPE), no norm on a sub-layer's input but an
RMSNorm on each sub-layer's output before the residual add (`post_attention_layernorm`,
`post_feedforward_layernorm`), and q/k RMSNorms over the whole query and key projections
(`q_norm` over H x d_h values, `k_norm` over H_kv x d_h: `qk_norm_scope="projection"`).

Group (derivation: rotviz.symmetry.actions): a Q-K map must be orthogonal per KV group and
commute with the gains of each of its heads (a pair turns only where they are equal on it,
else flips its sign); a head permutation keeps the projection norm's RMS and moves each
head's gain rows with it; V-O maps, FFN permutations and gated scales are LLaMA's. The branch
norms' gains fix the stream's coordinates, so the residual group is permutations (as
Gemma 2's)."""

from __future__ import annotations

from dataclasses import replace

from rotviz.arch.families import llama
from rotviz.arch.spec import NormSpec, Sizes

ORDER = 14
UNTIED: dict | None = {}  # its output head is its own by default

SPEC = replace(
    llama.SPEC,
    family="olmo2",
    description="Hugging Face OLMo-2 (the LLaMA tensors with norms on each sub-layer's output "
    "and q/k RMSNorms over the whole projections)",
    model_types=("olmo2",),
    roots=("model.", ""),
    norms=(
        NormSpec(("post_attention_layernorm",), "attn_post"),
        NormSpec(("post_feedforward_layernorm",), "ffn_post"),
    ),
    readers=("lm_head", "score"),
    qk_norms=(("self_attn.q_norm",), ("self_attn.k_norm",)),
    qk_norm_scope="projection",
)


def random_config(s: Sizes, *, kv_heads: int | None = None, tie: bool = False,
                  positions: int = 32) -> dict:
    """An Olmo2ForCausalLM: `kv_heads` key/value heads (default heads // 2), `tie` (lm_head
    shares the embedding table; OLMo-2 checkpoints do not), `positions` tokens of context."""
    import transformers as T

    if kv_heads is None:
        kv_heads = s.heads // 2 if s.heads % 2 == 0 else s.heads
    return T.Olmo2Config(
        num_hidden_layers=s.layers, hidden_size=s.d, num_attention_heads=s.heads,
        num_key_value_heads=kv_heads, intermediate_size=s.ffn, vocab_size=s.vocab,
        max_position_embeddings=positions, rope_theta=100.0, tie_word_embeddings=tie,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, architectures=["Olmo2ForCausalLM"],
    ).to_dict()

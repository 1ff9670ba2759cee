"""Hugging Face Gemma 2: Gemma plus a norm on each sub-layer's output before the residual add
(`post_attention_layernorm`, `post_feedforward_layernorm`; the FFN reads
`pre_feedforward_layernorm`), and soft-capped attention scores and logits.

Per-layer maps keep every sub-layer's output, so those norms and the soft caps (monotone on
unchanged scores and logits) leave the per-layer group as Gemma's. On the stream, a branch
norm's gain multiplies what each layer writes coordinate by coordinate, which only a
permutation (with the gains permuted) commutes with: the residual group is permutations."""

from __future__ import annotations

from dataclasses import replace

from rotviz.arch.families import gemma
from rotviz.arch.spec import NormSpec, Sizes

ORDER = 9
UNTIED: dict | None = {"tie": False}

SPEC = replace(
    gemma.SPEC,
    family="gemma2",
    description="Hugging Face Gemma 2 (Gemma with norms on each sub-layer's output and "
    "soft-capped scores)",
    model_types=("gemma2",),
    norms=(
        NormSpec(("input_layernorm",), "attn_in"),
        NormSpec(("post_attention_layernorm",), "attn_post"),
        NormSpec(("pre_feedforward_layernorm",), "ffn_in"),
        NormSpec(("post_feedforward_layernorm",), "ffn_post"),
    ),
)


def random_config(s: Sizes, *, kv_heads: int | None = None, head_dim: int | None = None,
                  tie: bool = True, positions: int = 32) -> dict:
    """A Gemma2ForCausalLM with soft caps low enough to bend the random model's scores and
    logits (so the tests see them), every other layer windowed; options as Gemma's."""
    import transformers as T

    if kv_heads is None:
        kv_heads = s.heads // 2 if s.heads % 2 == 0 else s.heads
    return T.Gemma2Config(
        num_hidden_layers=s.layers, hidden_size=s.d, num_attention_heads=s.heads,
        num_key_value_heads=kv_heads, head_dim=head_dim or 2 * s.d // s.heads,
        intermediate_size=s.ffn, vocab_size=s.vocab, max_position_embeddings=positions,
        rope_theta=100.0, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=tie,
        attn_logit_softcapping=5.0, final_logit_softcapping=10.0, sliding_window=8,
        query_pre_attn_scalar=16, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        architectures=["Gemma2ForCausalLM"],
    ).to_dict()

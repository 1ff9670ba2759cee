"""Hugging Face GPT-NeoX (EleutherAI's Pythia suites): a pre-LayerNorm decoder whose fused
`query_key_value` holds each head's [q; k; v] together (`qkv_layout="heads"`, unlike GPT-2's
[Q; K; V]), with partial rotary embeddings (`rotary_pct`: only the first dims of each head
turn, so Q-K maps are per-pair rotation-scales there and any orthogonal map times a scale on
the rest) and, by default, parallel attention and FFN (both read the same stream and both
write to it, which changes no map)."""

from __future__ import annotations

from rotviz.arch.spec import ArchSpec, LinearSpec, NormSpec, Sizes

ORDER = 10
UNTIED: dict | None = {}  # its output head is its own (embed_out / lm_head)

SPEC = ArchSpec(
    family="gpt-neox",
    description="Hugging Face GPT-NeoX / Pythia (pre-LayerNorm decoder, per-head fused QKV, "
    "partial rotary embeddings, parallel residual)",
    source="hf",
    model_types=("gpt_neox",),
    inputs="tokens",
    n_layers_key=("num_hidden_layers",),
    d_model_key=("hidden_size",),
    n_heads_key=("num_attention_heads",),
    activation_key=("hidden_act",),
    default_activation="gelu",
    roots=("gpt_neox.", ""),
    block=("layers.{i}.",),
    qkv=LinearSpec(("attention.query_key_value",)),
    q=None,
    k=None,
    v=None,
    o=LinearSpec(("attention.dense",)),
    ffn_in=LinearSpec(("mlp.dense_h_to_4h",)),
    ffn_out=LinearSpec(("mlp.dense_4h_to_h",)),
    norms=(
        NormSpec(("input_layernorm",), "attn_in"),
        NormSpec(("post_attention_layernorm",), "ffn_in"),
    ),
    placement="pre",
    final_norm=("final_layer_norm",),
    writers=("embed_in",),
    stream_norms=(),
    readers=("lm_head", "embed_out", "score", "classifier", "qa_outputs"),
    tied=(("lm_head.weight", "gpt_neox.embed_in.weight"),),
    rope="rotate_half",
    rope_fraction_key=("partial_rotary_factor", "rotary_pct"),
    qkv_layout="heads",
)


def random_config(s: Sizes, *, rotary_pct: float = 0.25, parallel: bool = True,
                  positions: int = 32) -> dict:
    """A GPTNeoXForCausalLM turning `rotary_pct` of each head's dims (Pythia's 0.25),
    with parallel attention and FFN (`parallel`, Pythia's) or sequential ones."""
    import transformers as T

    return T.GPTNeoXConfig(
        num_hidden_layers=s.layers, hidden_size=s.d, num_attention_heads=s.heads,
        intermediate_size=s.ffn, vocab_size=s.vocab, max_position_embeddings=positions,
        rotary_pct=rotary_pct, rotary_emb_base=100, use_parallel_residual=parallel,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
        architectures=["GPTNeoXForCausalLM"],
    ).to_dict()

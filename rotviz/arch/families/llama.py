"""Hugging Face LLaMA: pre-RMSNorm decoder, SwiGLU FFN, grouped-query attention, RoPE."""

from __future__ import annotations

from rotviz.arch.spec import ArchSpec, LinearSpec, NormSpec, Sizes

ORDER = 5
# random_config options of a variant whose output head is its own: the default's (untied)
UNTIED: dict | None = {}

SPEC = ArchSpec(
    family="llama",
    description="Hugging Face LLaMA (pre-RMSNorm decoder, SwiGLU FFN, grouped-query attention, "
    "rotary embeddings)",
    source="hf",
    model_types=("llama",),
    inputs="tokens",
    n_layers_key=("num_hidden_layers",),
    d_model_key=("hidden_size",),
    n_heads_key=("num_attention_heads",),
    activation_key=("hidden_act",),
    default_activation="silu",
    roots=("model.", "transformer.", ""),  # transformer.: LlamaForQuestionAnswering
    block=("layers.{i}.",),
    qkv=None,
    q=LinearSpec(("self_attn.q_proj",)),
    k=LinearSpec(("self_attn.k_proj",)),
    v=LinearSpec(("self_attn.v_proj",)),
    o=LinearSpec(("self_attn.o_proj",)),
    ffn_in=LinearSpec(("mlp.up_proj",)),
    ffn_out=LinearSpec(("mlp.down_proj",)),
    norms=(
        NormSpec(("input_layernorm",), "attn_in"),
        NormSpec(("post_attention_layernorm",), "ffn_in"),
    ),
    placement="pre",
    final_norm=("norm",),
    writers=("embed_tokens",),
    stream_norms=(),
    readers=("lm_head", "score", "qa_outputs"),  # qa_outputs: every position
    tied=(("lm_head.weight", "model.embed_tokens.weight"),),
    norm_kind="rmsnorm",
    ffn_gate=LinearSpec(("mlp.gate_proj",)),
    n_kv_heads_key=("num_key_value_heads",),
    head_dim_key=("head_dim",),
    rope="rotate_half",
)


def random_config(s: Sizes, *, kv_heads: int | None = None, head_dim: int | None = None,
                  bias: bool = False, tie_embeddings: bool = False, positions: int = 32) -> dict:
    """A LlamaForCausalLM: `kv_heads` key/value heads (default heads // 2: grouped-query
    attention), `head_dim` (default d // heads), `bias` (biases on attention and FFN linears),
    `tie_embeddings` (lm_head shares the embedding table; untied by default), `positions`
    tokens of context."""
    import transformers as T

    if kv_heads is None:
        kv_heads = s.heads // 2 if s.heads % 2 == 0 else s.heads  # grouped-query attention
    return T.LlamaConfig(
        num_hidden_layers=s.layers,
        hidden_size=s.d,
        num_attention_heads=s.heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim if head_dim is not None else s.d // s.heads,
        intermediate_size=s.ffn,
        vocab_size=s.vocab,
        max_position_embeddings=positions,
        rope_theta=100.0,  # short contexts: lower base, so every pair turns visibly
        attention_bias=bias,
        mlp_bias=bias,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=0,
        eos_token_id=0,
        architectures=["LlamaForCausalLM"],
    ).to_dict()

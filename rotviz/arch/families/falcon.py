"""Hugging Face Falcon (TII): a pre-LayerNorm decoder whose attention and FFN run in parallel
from the same stream, with one fused `query_key_value` laid out per key/value group as
[q_1; ...; q_r; k; v] (`qkv_layout="groups"`), which covers its three attention variants:
multi-query (Falcon-7B, `multi_query`: one key/value head), grouped-query
(`new_decoder_architecture`, Falcon-40B/180B: `num_kv_heads`) and plain multi-head (neither
flag: one group per head, as GPT-NeoX's [q; k; v]).

Norms: `parallel_attn` with one norm (`input_layernorm` feeds both sub-layers:
`shared_input_norm`), the new architecture's two (`ln_attn`, `ln_mlp`), or a sequential block
(`input_layernorm`, `post_attention_layernorm`). Parallel branches change no map: each
sub-layer's output is kept by its own maps. Positions: rotary embeddings (per-pair Q-K
rotation-scales, as LLaMA), or ALiBi (`alibi`, Falcon-RW): any invertible Q-K map per
group, but each head adds its own slope times the distance to its scores, so heads keep
their places (all of Falcon's slopes differ: the only head permutation is the identity).
The stream is a LayerNorm stream (centred orthogonal maps). A new-architecture block without
`parallel_attn` (transformers builds norms its forward does not use) is refused."""

from __future__ import annotations

from rotviz.arch.spec import ArchSpec, LinearSpec, NormSpec, Sizes

ORDER = 15
UNTIED: dict | None = {"tie": False}  # Falcon ties lm_head to the embeddings by default

SPEC = ArchSpec(
    family="falcon",
    description="Hugging Face Falcon (pre-LayerNorm decoder, parallel attention and FFN, "
    "multi-query or grouped-query fused QKV, rotary embeddings or ALiBi)",
    source="hf",
    model_types=("falcon",),
    inputs="tokens",
    n_layers_key=("num_hidden_layers",),
    d_model_key=("hidden_size",),
    n_heads_key=("num_attention_heads",),
    activation_key=("activation",),
    default_activation="gelu",
    roots=("transformer.", ""),
    block=("h.{i}.",),
    qkv=LinearSpec(("self_attention.query_key_value",)),
    q=None,
    k=None,
    v=None,
    o=LinearSpec(("self_attention.dense",)),
    ffn_in=LinearSpec(("mlp.dense_h_to_4h",)),
    ffn_out=LinearSpec(("mlp.dense_4h_to_h",)),
    norms=(
        NormSpec(("input_layernorm", "ln_attn"), "attn_in"),
        NormSpec(("post_attention_layernorm", "ln_mlp"), "ffn_in"),
    ),
    placement="pre",
    final_norm=("ln_f",),
    writers=("word_embeddings",),
    stream_norms=(),
    readers=("lm_head", "score", "classifier", "qa_outputs"),
    tied=(("lm_head.weight", "transformer.word_embeddings.weight"),),
    n_kv_heads_key=("num_kv_heads",),
    rope="rotate_half",
    qkv_layout="groups",
    kv_heads_flags=("multi_query", "new_decoder_architecture"),
    alibi_key=("alibi",),
    shared_input_norm=True,
    refused_configs=(
        ("a new-architecture block without parallel attention (transformers cannot run it)",
         (("new_decoder_architecture", True), ("parallel_attn", False))),
    ),
)


def random_config(s: Sizes, *, new_arch: bool = False, multi_query: bool = True,
                  parallel: bool = True, norms: int | None = None, alibi: bool = False,
                  bias: bool = False, tie: bool = True, positions: int = 32) -> dict:
    """A FalconForCausalLM, by default as Falcon-7B (multi-query, parallel attention and FFN
    from one norm, rotary, no biases, tied output head). `new_arch`: Falcon-40B's grouped-query
    layout (heads // 2 key/value heads) with `norms` (2: ln_attn and ln_mlp; 1: one shared);
    `multi_query` False: one key/value head per head; `parallel` False: a sequential block;
    `alibi` (Falcon-RW), `bias`, `tie`, `positions` tokens of context."""
    import transformers as T

    return T.FalconConfig(
        num_hidden_layers=s.layers, hidden_size=s.d, num_attention_heads=s.heads,
        num_kv_heads=s.heads // 2 if new_arch and s.heads % 2 == 0 else s.heads,
        new_decoder_architecture=new_arch, multi_query=multi_query, parallel_attn=parallel,
        num_ln_in_parallel_attn=norms, alibi=alibi, bias=bias, ffn_hidden_size=s.ffn,
        vocab_size=s.vocab, max_position_embeddings=positions, rope_theta=100.0,
        tie_word_embeddings=tie, bos_token_id=0, eos_token_id=0,
        architectures=["FalconForCausalLM"],
    ).to_dict()

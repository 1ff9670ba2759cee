"""Hugging Face GPT-2: pre-norm decoder, fused QKV in Conv1D layout (stored (in, out))."""

from __future__ import annotations

from rotviz.arch.spec import ArchSpec, LinearSpec, NormSpec, Sizes

ORDER = 0
# random_config options of a variant whose output head is its own (residual maps need one)
UNTIED: dict | None = {"tie": False}

SPEC = ArchSpec(
    family="gpt2",
    description="Hugging Face GPT-2 (pre-norm decoder, fused Conv1D QKV)",
    source="hf",
    model_types=("gpt2",),
    inputs="tokens",
    n_layers_key=("n_layer", "num_hidden_layers"),
    d_model_key=("n_embd", "hidden_size"),
    n_heads_key=("n_head", "num_attention_heads"),
    activation_key=("activation_function",),
    default_activation="gelu_new",
    roots=("transformer.", ""),
    block=("h.{i}.",),
    qkv=LinearSpec(("attn.c_attn",), transposed=True),
    q=None,
    k=None,
    v=None,
    o=LinearSpec(("attn.c_proj",), transposed=True),
    ffn_in=LinearSpec(("mlp.c_fc",), transposed=True),
    ffn_out=LinearSpec(("mlp.c_proj",), transposed=True),
    norms=(NormSpec(("ln_1",), "attn_in"), NormSpec(("ln_2",), "ffn_in")),
    placement="pre",
    final_norm=("ln_f",),
    writers=("wte", "wpe"),
    stream_norms=(),
    readers=("lm_head", "score", "classifier", "qa_outputs"),  # per position: token cls, QA
    tied=(("lm_head.weight", "transformer.wte.weight"),),
    # older transformers versions saved each layer's attention fill value (-1e4); today's
    # GPT2Attention has no such buffer and GPT-2's classes list only `attn.bias`
    legacy_buffers=(r"(^|\.)h\.\d+\.attn\.masked_bias$",),
)


def random_config(s: Sizes, *, tie: bool = True, positions: int = 32,
                  scale_by_layer: bool = False, reorder_upcast: bool = False) -> dict:
    """A GPT2LMHeadModel; `tie=False` gives it an output head of its own (residual maps need
    one); `positions` tokens of context. `scale_by_layer` and `reorder_upcast` set the flags of
    Stanford CRFM's GPT-2 seeds (`scale_attn_by_inverse_layer_idx`: scores divided by the layer
    number; `reorder_and_upcast_attn`: scores computed in float32, scaled before the product).
    Both change a scalar or the rounding, not the symmetry group."""
    import transformers as T

    return T.GPT2Config(
        n_layer=s.layers,
        n_embd=s.d,
        n_head=s.heads,
        n_inner=s.ffn,
        vocab_size=s.vocab,
        n_positions=positions,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=tie,
        scale_attn_by_inverse_layer_idx=scale_by_layer,
        reorder_and_upcast_attn=reorder_upcast,
        architectures=["GPT2LMHeadModel"],
    ).to_dict()

"""Architectures described as data.

Each supported family is an `ArchSpec`: where its Q/K/V/O and FFN tensors live, whether QKV
is fused and whether linears are stored transposed (GPT-2's Conv1D), where the norms sit,
and which tensors write to and read from the residual stream. Every transform in rotviz is
derived from these descriptions; no code path is written per family.

Names are tuples of alternatives (the first present in a state dict wins), which is how one
spec covers both transformers 4.x and 5.x module names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Names = tuple[str, ...]


@dataclass(frozen=True)
class LinearSpec:
    """A linear layer `<name>.weight` / `<name>.bias` inside a block."""

    names: Names
    transposed: bool = False  # stored (in, out), as GPT-2's Conv1D


@dataclass(frozen=True)
class NormSpec:
    """A normalisation layer inside a block.

    `site` says what it normalises: `attn_in` / `ffn_in` (pre-norm: the input of the
    sub-layer, the stream itself is untouched) or `attn_out` / `ffn_out` (post-norm: the
    stream after the residual add, so the norm sits on the stream).
    """

    names: Names
    site: str


@dataclass(frozen=True)
class ArchSpec:
    """Where everything lives in one architecture family."""

    family: str
    description: str
    source: str  # "hf" (transformers) or "timm"
    model_types: Names  # config.model_type values (hf) or architecture prefixes (timm)
    inputs: str  # "tokens" or "pixels"
    # config keys, alternatives in order
    n_layers_key: Names
    d_model_key: Names
    n_heads_key: Names
    activation_key: Names
    default_activation: str
    roots: Names  # prefixes of the backbone inside the full model, tried in order
    block: Names  # block prefix templates relative to a root, with {i}
    qkv: LinearSpec | None  # fused Q, K, V (three blocks of d rows, in that order)
    q: LinearSpec | None
    k: LinearSpec | None
    v: LinearSpec | None
    o: LinearSpec
    ffn_in: LinearSpec
    ffn_out: LinearSpec
    norms: tuple[NormSpec, ...]
    placement: str  # "pre" or "post" norm
    final_norm: Names  # relative to a root; empty for none
    # Residual stream, outside the blocks (relative to a root). Writers add to the stream
    # (embedding tables, position / class tokens, patch projections); embedding norms of
    # post-norm models sit on the stream. Readers (relative to the full model) read it.
    writers: Names
    stream_norms: Names
    readers: Names
    tied: tuple[tuple[str, str], ...] = ()  # (alias, owner) full tensor names
    # Writers above that are linear or convolution layers (output channels first, e.g. a
    # patch projection): their weight's rows live in the stream. Every other writer is a
    # table or token whose last dimension is the stream (embeddings, position, class tokens).
    projections: Names = ()
    # "layernorm" (mean and variance, gain and bias) or "rmsnorm" (gain only)
    norm_kind: str = "layernorm"
    # Gated FFN (SwiGLU): the gate linear, read from the stream like ffn_in (the "up" map);
    # act(gate x) * (up x) feeds ffn_out. None for a plain FFN.
    ffn_gate: LinearSpec | None = None
    n_kv_heads_key: Names = ()  # grouped-query attention: key/value heads (default n_heads)
    head_dim_key: Names = ()  # explicit head size (default d_model / n_heads)
    # Rotary position embeddings on Q and K: None, "rotate_half" (Hugging Face: dim i pairs
    # with i + d_h/2) or "interleaved" (dims 2j and 2j+1 pair)
    rope: str | None = None

    @property
    def fused(self) -> bool:
        return self.qkv is not None

    @property
    def gated(self) -> bool:
        return self.ffn_gate is not None


GPT2 = ArchSpec(
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
    readers=("lm_head", "score"),
    tied=(("lm_head.weight", "transformer.wte.weight"),),
)

_BERT_BLOCK = dict(
    n_layers_key=("num_hidden_layers",),
    d_model_key=("hidden_size",),
    n_heads_key=("num_attention_heads",),
    activation_key=("hidden_act",),
    default_activation="gelu",
    block=("encoder.layer.{i}.", "layers.{i}."),
    qkv=None,
    q=LinearSpec(("attention.self.query", "attention.q_proj", "attention.self.q_proj")),
    k=LinearSpec(("attention.self.key", "attention.k_proj", "attention.self.k_proj")),
    v=LinearSpec(("attention.self.value", "attention.v_proj", "attention.self.v_proj")),
    o=LinearSpec(("attention.output.dense", "attention.o_proj")),
    ffn_in=LinearSpec(("intermediate.dense", "mlp.fc1")),
    ffn_out=LinearSpec(("output.dense", "mlp.fc2")),
    norms=(
        NormSpec(("attention.output.LayerNorm", "attention_norm"), "attn_out"),
        NormSpec(("output.LayerNorm", "output_norm"), "ffn_out"),
    ),
    placement="post",
    final_norm=(),
    writers=(
        "embeddings.word_embeddings",
        "embeddings.position_embeddings",
        "embeddings.token_type_embeddings",
    ),
    stream_norms=("embeddings.LayerNorm",),
    inputs="tokens",
    source="hf",
)

BERT = ArchSpec(
    family="bert",
    description="Hugging Face BERT (post-norm encoder, split QKV)",
    model_types=("bert",),
    roots=("bert.", ""),
    readers=("bert.pooler.dense", "pooler.dense", "cls.predictions.transform.dense"),
    tied=(
        ("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
        ("cls.predictions.decoder.bias", "cls.predictions.bias"),
    ),
    **_BERT_BLOCK,
)

ROBERTA = ArchSpec(
    family="roberta",
    description="Hugging Face RoBERTa (post-norm encoder, split QKV)",
    model_types=("roberta",),
    roots=("roberta.", ""),
    readers=("roberta.pooler.dense", "pooler.dense", "lm_head.dense", "classifier.dense"),
    tied=(
        ("lm_head.decoder.weight", "roberta.embeddings.word_embeddings.weight"),
        ("lm_head.decoder.bias", "lm_head.bias"),
    ),
    **_BERT_BLOCK,
)

VIT = ArchSpec(
    family="vit",
    description="Hugging Face ViT (pre-norm encoder, split QKV)",
    source="hf",
    model_types=("vit",),
    inputs="pixels",
    n_layers_key=("num_hidden_layers",),
    d_model_key=("hidden_size",),
    n_heads_key=("num_attention_heads",),
    activation_key=("hidden_act",),
    default_activation="gelu",
    roots=("vit.", ""),
    block=("layers.{i}.", "encoder.layer.{i}."),
    qkv=None,
    q=LinearSpec(("attention.q_proj", "attention.attention.query")),
    k=LinearSpec(("attention.k_proj", "attention.attention.key")),
    v=LinearSpec(("attention.v_proj", "attention.attention.value")),
    o=LinearSpec(("attention.o_proj", "attention.output.dense")),
    ffn_in=LinearSpec(("mlp.fc1", "intermediate.dense")),
    ffn_out=LinearSpec(("mlp.fc2", "output.dense")),
    norms=(NormSpec(("layernorm_before",), "attn_in"), NormSpec(("layernorm_after",), "ffn_in")),
    placement="pre",
    final_norm=("layernorm",),
    writers=(
        "embeddings.cls_token",
        "embeddings.position_embeddings",
        "embeddings.patch_embeddings.projection",
    ),
    stream_norms=(),
    readers=("classifier", "pooler.dense"),
    projections=("embeddings.patch_embeddings.projection",),
)

TIMM_VIT = ArchSpec(
    family="timm-vit",
    description="timm VisionTransformer (pre-norm encoder, fused Linear QKV)",
    source="timm",
    model_types=("vit_",),
    inputs="pixels",
    n_layers_key=("depth",),
    d_model_key=("embed_dim",),
    n_heads_key=("num_heads",),
    activation_key=("act_layer",),
    default_activation="gelu",
    roots=("",),
    block=("blocks.{i}.",),
    qkv=LinearSpec(("attn.qkv",)),
    q=None,
    k=None,
    v=None,
    o=LinearSpec(("attn.proj",)),
    ffn_in=LinearSpec(("mlp.fc1",)),
    ffn_out=LinearSpec(("mlp.fc2",)),
    norms=(NormSpec(("norm1",), "attn_in"), NormSpec(("norm2",), "ffn_in")),
    placement="pre",
    final_norm=("norm", "fc_norm"),
    writers=("cls_token", "pos_embed", "reg_token", "patch_embed.proj"),
    stream_norms=(),
    readers=("head",),
    projections=("patch_embed.proj",),
)

LLAMA = ArchSpec(
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
    roots=("model.", ""),
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
    readers=("lm_head", "score"),
    tied=(("lm_head.weight", "model.embed_tokens.weight"),),
    norm_kind="rmsnorm",
    ffn_gate=LinearSpec(("mlp.gate_proj",)),
    n_kv_heads_key=("num_key_value_heads",),
    head_dim_key=("head_dim",),
    rope="rotate_half",
)

SPECS: tuple[ArchSpec, ...] = (GPT2, BERT, ROBERTA, VIT, TIMM_VIT, LLAMA)


def supported() -> str:
    """A human list of the supported families, for error messages."""
    return ", ".join(f"{s.family} ({s.description})" for s in SPECS)


def spec_for(config: Mapping) -> ArchSpec:
    """Pick the spec for a model config (an HF config dict or a timm config dict)."""
    from rotviz.errors import RotvizError

    model_type = config.get("model_type")
    arch = config.get("architecture")
    for spec in SPECS:
        if spec.source == "hf" and model_type in spec.model_types:
            return spec
        if spec.source == "timm" and isinstance(arch, str) and arch.startswith(spec.model_types):
            return spec
    found = model_type or arch or "unknown"
    raise RotvizError(f"unsupported model type '{found}'; supported: {supported()}")


def config_value(config: Mapping, keys: Names, default=None):
    """The first present key of `keys` in a (possibly nested timm) config."""
    sources = [config, config.get("model_args") or {}]
    for src in sources:
        for key in keys:
            if key in src and src[key] is not None:
                return src[key]
    return default

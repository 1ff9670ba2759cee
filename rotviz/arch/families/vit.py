"""Hugging Face ViT: pre-norm encoder, split QKV, a patch projection writing the stream."""

from __future__ import annotations

from rotviz.arch.spec import ArchSpec, LinearSpec, NormSpec, Sizes

ORDER = 3
# random_config options of a variant whose output head is its own: the default's
UNTIED: dict | None = {}

SPEC = ArchSpec(
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


def random_config(s: Sizes) -> dict:
    """A ViTForImageClassification on `channels` x `image` x `image` images."""
    import transformers as T

    return T.ViTConfig(
        image_size=s.image,
        patch_size=s.patch,
        num_channels=s.channels,
        num_labels=s.labels,
        architectures=["ViTForImageClassification"],
        num_hidden_layers=s.layers,
        hidden_size=s.d,
        num_attention_heads=s.heads,
        intermediate_size=s.ffn,
    ).to_dict()

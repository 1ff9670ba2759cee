"""timm's VisionTransformer: pre-norm encoder, fused Linear QKV (a timm config.json: the
`architecture` name and its `model_args`)."""

from __future__ import annotations

from rotviz.arch.spec import ArchSpec, LinearSpec, NormSpec, Sizes

ORDER = 4
# random_config options of a variant whose output head is its own: the default's
UNTIED: dict | None = {}

SPEC = ArchSpec(
    family="timm-vit",
    description="timm VisionTransformer (pre-norm encoder, fused Linear QKV)",
    source="timm",
    model_types=("vit_",),
    type_key="architecture",
    type_prefix=True,
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


def random_config(s: Sizes) -> dict:
    """A `vit_base_patch16_224` resized to `channels` x `image` x `image` images."""
    args = dict(
        img_size=s.image,
        patch_size=s.patch,
        in_chans=s.channels,
        embed_dim=s.d,
        depth=s.layers,
        num_heads=s.heads,
        mlp_ratio=s.ffn / s.d,
    )
    return {"architecture": "vit_base_patch16_224", "num_classes": s.labels, "model_args": args}

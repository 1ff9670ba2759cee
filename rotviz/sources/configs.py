"""A model's config.json checked before anything is built from it.

A config names the sizes a loader allocates: `n_layer: 1000000000` would build a billion
blocks (a hang), a huge `vocab_size` an embedding of terabytes, `patch_size: 0` a division
by zero deep inside a library. So every size a family reads is checked here first, the same
way at size and in memory: a positive integer (not a bool, not "32")
within the bound in SIZE_LIMITS (the one place those bounds live), and then against the
checkpoint's own tensor shapes, read from its headers (the number of blocks, the width, the
heads, the vocabulary and position tables, the patch projection). Only then is a module
built, and only on the meta device (rotviz.atsize.runtime.check_fits) until the weights are known
to fit it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from rotviz.arch.spec import ArchSpec, config_value, n_kv_heads, unchecked_option
from rotviz.errors import RotvizError

Tensor = torch.Tensor

# The largest value rotviz accepts for each size a config may hold (top level, or in a timm
# config's `model_args`). Generous for real models (LLaMA-3's 128k vocabulary and positions,
# 16k-wide models), small enough that nothing is allocated for a value that is only a typo.
SIZE_LIMITS: Mapping[str, int] = {
    # blocks
    "n_layer": 10_000, "num_hidden_layers": 10_000, "depth": 10_000,
    # widths
    "n_embd": 1 << 17, "hidden_size": 1 << 17, "embed_dim": 1 << 17,
    "n_inner": 1 << 20, "intermediate_size": 1 << 20,
    "n_head": 1 << 14, "num_attention_heads": 1 << 14, "num_key_value_heads": 1 << 14,
    "num_heads": 1 << 14, "head_dim": 1 << 14,
    "num_kv_heads": 1 << 14, "ffn_hidden_size": 1 << 20,
    "n_layers": 10_000, "dim": 1 << 17, "hidden_dim": 1 << 20, "n_heads": 1 << 14,  # DistilBERT
    "embedding_size": 1 << 17,  # ELECTRA's embeddings
    # tables
    "vocab_size": 1 << 23, "n_positions": 1 << 22, "max_position_embeddings": 1 << 22,
    # images
    "image_size": 1 << 14, "img_size": 1 << 14, "patch_size": 1 << 12,
    "num_channels": 1 << 10, "in_chans": 1 << 10,
    # outputs
    "num_labels": 1 << 20, "num_classes": 1 << 20,
}
# Sizes that may be 0: a timm model without a classifier head
MAY_BE_ZERO = frozenset({"num_classes"})
# Sizes that may be given per side of an image ([224, 224])
PER_SIDE = frozenset({"image_size", "img_size", "patch_size"})

_REMEDY = "fix config.json or re-save the model"


def _shown(value: object) -> str:
    s = repr(value)
    return s if len(s) <= 40 else s[:37] + "..."


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_sizes(config: object, where: Path) -> dict:
    """`config` (the parsed `where`, a config.json) if it is a JSON object whose every size
    field is an integer within SIZE_LIMITS; one line naming the file and the field otherwise.
    `id2label`, where present, must be a non-empty table of label names."""
    if not isinstance(config, dict):
        raise RotvizError(f"'{where}' holds a JSON {type(config).__name__}, not an object of "
                          f"settings; {_REMEDY}")
    args = config.get("model_args")
    if args is not None and not isinstance(args, dict):
        raise RotvizError(f"'{where}' has model_args that are not an object; {_REMEDY}")
    for table in (config, args or {}):
        for key, hi in SIZE_LIMITS.items():
            value = table.get(key)
            if value is None:
                continue
            lo = 0 if key in MAY_BE_ZERO else 1
            values = value if key in PER_SIDE and isinstance(value, list) and value else [value]
            if not all(_is_int(v) and lo <= v <= hi for v in values):
                raise RotvizError(f"'{where}' has {key} {_shown(value)}; it must be an integer "
                                  f"from {lo} to {hi}; {_REMEDY}")
    labels = config.get("id2label")
    if labels is not None and not (isinstance(labels, dict) and labels and all(
            isinstance(v, str) for v in labels.values())):
        raise RotvizError(f"'{where}' has an id2label that is not a non-empty table of label "
                          f"names ({_shown(labels)}); {_REMEDY}")
    return config


def _side(value: object) -> int | None:
    """One side of an image or patch size given as an integer or a list of them."""
    if isinstance(value, list):
        return value[0] if value and all(v == value[0] for v in value) else None
    return value if _is_int(value) else None


def check_against(spec: ArchSpec, config: Mapping, meta: Mapping[str, Tensor], where: Path
                  ) -> None:
    """The config's sizes (already bounded by check_sizes) agree with the checkpoint's tensor
    shapes `meta` (read from its headers): as many blocks, the same width, heads that divide
    it, vocabulary and position tables of the stated rows, the stated patch projection.
    Checked before a module of the config is built, so a config that lies is refused before
    anything of its size is allocated."""
    from rotviz.symmetry.view import resolve_layout

    layout = resolve_layout(spec, meta)
    blocks = len(layout.blocks)
    why = unchecked_option(spec, config)
    if why:
        raise RotvizError(why)

    def refuse(what: str) -> None:
        raise RotvizError(f"'{where}' does not fit the checkpoint's weights: {what}; {_REMEDY}")

    n_layers = config_value(config, spec.n_layers_key)
    if n_layers is not None and n_layers != blocks:
        refuse(f"{spec.n_layers_key[0]} is {n_layers}, the weights hold {blocks} blocks")
    first = layout.blocks[0]
    widths = {meta[f"{first}{alt}.weight"].shape[-1] for alt in layout.norms.values()
              if f"{first}{alt}.weight" in meta}
    d = config_value(config, spec.d_model_key)
    if d is not None and widths and d not in widths:
        refuse(f"{spec.d_model_key[0]} is {d}, the weights' blocks are "
               f"{min(widths)} wide")
    heads = config_value(config, spec.n_heads_key)
    dh = config_value(config, spec.head_dim_key) if spec.head_dim_key else None
    if heads is not None and d is not None:
        if dh is None and d % heads:
            refuse(f"{spec.n_heads_key[0]} {heads} does not divide {spec.d_model_key[0]} {d}")
        dh = dh or d // heads
        kv = n_kv_heads(spec, config, heads)
        if heads % kv:
            refuse(f"{kv} key/value heads do not divide {heads} heads")
        lin = spec.qkv or spec.q
        rows = heads * dh + (2 * kv * dh if spec.qkv else 0)
        w = meta.get(f"{first}{layout.roles.get('qkv' if spec.qkv else 'q')}.weight")
        if lin is not None and w is not None and w.dim() == 2:
            have = w.shape[1] if lin.transposed else w.shape[0]
            if have != rows:
                refuse(f"{heads} heads of {dh} dims make {rows} query rows, the weights "
                       f"have {have}")
    ffn = next((config[k] for k in ("intermediate_size", "n_inner", "hidden_dim")
                if config.get(k) is not None), None)
    w_in = meta.get(f"{first}{layout.roles['ffn_in']}.weight")
    if ffn is not None and w_in is not None and w_in.dim() == 2:
        have = w_in.shape[1] if spec.ffn_in.transposed else w_in.shape[0]
        have = have // 2 if spec.ffn_gate_up else have
        if have != ffn:
            refuse(f"its feed-forward layers are {ffn} wide, the weights' are {have}")
    tables = [meta[k] for k in layout.writers if k.endswith(".weight") and meta[k].dim() == 2
              and (d is None or meta[k].shape[1] == d)]
    vocab = config.get("vocab_size")
    if spec.inputs == "tokens" and vocab is not None and tables and \
            vocab not in {t.shape[0] for t in tables}:
        refuse(f"vocab_size is {vocab}, no embedding table of the weights has that many rows")
    positions = next((config[k] for k in ("n_positions", "max_position_embeddings")
                      if config.get(k) is not None), None)
    pos_tables = [meta[k] for k in layout.writers if k.endswith(".weight")
                  and meta[k].dim() == 2 and ("pos" in k or k.endswith("wpe.weight"))]
    if spec.inputs == "tokens" and positions is not None and pos_tables and \
            positions != pos_tables[0].shape[0]:
        refuse(f"it takes {positions} positions, the weights' position table has "
               f"{pos_tables[0].shape[0]} rows")
    if spec.inputs == "pixels":
        _check_patches(spec, config, meta, layout, refuse)


def _check_patches(spec: ArchSpec, config: Mapping, meta: Mapping[str, Tensor], layout,
                   refuse) -> None:
    image = _side(config_value(config, ("image_size", "img_size")))
    patch = _side(config_value(config, ("patch_size",)))
    channels = config_value(config, ("num_channels", "in_chans"))
    proj = next((meta[k] for k in layout.writers if k.endswith(".weight")
                 and meta[k].dim() == 4), None)
    if proj is not None:
        if patch is not None and tuple(proj.shape[2:]) != (patch, patch):
            refuse(f"patch_size is {patch}, the weights' patch projection is "
                   f"{proj.shape[2]}x{proj.shape[3]}")
        if channels is not None and proj.shape[1] != channels:
            refuse(f"it reads {channels} channels, the weights' patch projection reads "
                   f"{proj.shape[1]}")
    if image is not None and patch is not None and image % patch:
        refuse(f"image_size {image} is not a multiple of patch_size {patch}")

"""timm checkpoints, in the same folder layout as transformers': a config.json holding
`architecture` (a timm model name), `model_args` and optionally `num_classes`, plus
model.safetensors (or a pickled pytorch_model.bin), loaded by rotviz itself."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from rotviz.arch.spec import ArchSpec
from rotviz.confine import ANYWHERE, Confined
from rotviz.sources.base import Source
from rotviz.sources.files import fit_error, floating_dtypes, read_weights
from rotviz.sources.legacy import read_past

Tensor = torch.Tensor


class TimmSource(Source):
    name = "timm"

    def build(self, config: dict, spec: ArchSpec, instantiate: bool = True) -> tuple:
        """Always a module (timm has no class to load through); the full config's
        `model_args` name the sizes the module has (depth, embed_dim, num_heads)."""
        import timm

        args = dict(config.get("model_args") or {})
        if "num_classes" in config and "num_classes" not in args:
            args["num_classes"] = config["num_classes"]
        model = timm.create_model(config["architecture"], pretrained=False, **args)
        blk = model.blocks[0]
        full = dict(config)
        full["model_args"] = {
            **args,
            "depth": len(model.blocks),
            "embed_dim": model.embed_dim,
            "num_heads": blk.attn.num_heads,
        }
        return model, full

    def load(self, path: Path, config: dict, spec: ArchSpec, confined: Confined = ANYWHERE
             ) -> tuple[nn.Module, dict, dict[str, torch.dtype]]:
        """The module is float32 (load_state_dict casts into it); the dtypes are the file's."""
        weights = read_weights(path, confined)
        model, full_cfg = self.build(config, spec)
        # buffers the module no longer saves are read past, as atsize.runtime.check_fits allowed
        past = read_past(model, spec, config, {k: tuple(v.shape) for k, v in weights.items()})
        weights = {k: v for k, v in weights.items() if k not in past}
        own = model.state_dict()
        missing = [k for k in own if k not in weights]
        unexpected = [k for k in weights if k not in own]
        bad_shape = [k for k in weights if k in own and weights[k].shape != own[k].shape]
        fit_error(path, missing, unexpected, bad_shape)
        model.load_state_dict(weights)
        return model, full_cfg, floating_dtypes(weights)

    def save_module(self, module: nn.Module, config: dict, folder: Path) -> None:
        from safetensors.torch import save_file

        (folder / "config.json").write_text(json.dumps(config, indent=2))
        save_file({k: v.contiguous() for k, v in module.state_dict().items()},
                  str(folder / "model.safetensors"))

    def write_state(self, spec: ArchSpec, path: Path, config: dict,
                    state: Mapping[str, Tensor], folder: Path, own: dict | None = None) -> None:
        from safetensors.torch import save_file

        (folder / "config.json").write_text(json.dumps(config if own is None else own,
                                                       indent=2))
        save_file(dict(state), str(folder / "model.safetensors"), metadata={"format": "pt"})

    def arguments(self, spec: ArchSpec, inputs: Mapping[str, Tensor]) -> tuple[tuple, dict]:
        return (inputs[spec.input_key],), {}

    def image_shape(self, module: nn.Module, config: Mapping) -> tuple[int, int]:
        pe = module.patch_embed
        return int(pe.proj.in_channels), int(pe.img_size[0])

    def n_outputs(self, config: Mapping) -> int | None:
        return int(config.get("num_classes")
                   or config.get("model_args", {}).get("num_classes", 0)) or None


TIMM = TimmSource()

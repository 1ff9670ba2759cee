"""One adapter per weight source: how to build, load, write and run a model of a family
whose checkpoints come from that library. A family's `ArchSpec.source` names its adapter.

- `hf` (rotviz.sources.hf): Hugging Face transformers `save_pretrained` folders;
- `timm` (rotviz.sources.timm): timm models in the same folder layout.

`call` is the one way rotviz runs a module with a given parameter set on inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch
from torch import nn

from rotviz.arch.spec import ArchSpec
from rotviz.errors import RotvizError
from rotviz.sources.base import Source
from rotviz.sources.hf import HF
from rotviz.sources.timm import TIMM

__all__ = ["SOURCES", "Source", "call", "source_of"]

SOURCES: Mapping[str, Source] = MappingProxyType({s.name: s for s in (HF, TIMM)})


def source_of(spec: ArchSpec) -> Source:
    """The adapter of `spec`'s weight source."""
    if spec.source not in SOURCES:
        raise RotvizError(f"{spec.family} models come from '{spec.source}', which rotviz cannot "
                          f"read; known sources: {', '.join(SOURCES)}")
    return SOURCES[spec.source]


def call(spec: ArchSpec, module: nn.Module, params: Mapping[str, torch.Tensor] | None,
         inputs: torch.Tensor | Mapping[str, torch.Tensor], strict: bool = False,
         every: bool = False) -> torch.Tensor:
    """Logits of `module` (a model of `spec`) run with `params` on `inputs` (with `every`,
    all its outputs side by side): see `Source.call`."""
    return source_of(spec).call(spec, module, params, inputs, strict, every)

"""Architectures described as data: one module per family in `rotviz/arch/families/`.

Every module there is found here (pkgutil); each defines `SPEC`, its family's `ArchSpec`
(rotviz.arch.spec), the config of a tiny random test model, and where it is listed (see
rotviz/arch/families/__init__.py). Adding a Hugging Face family is one file there; the tests
run on every family found. `rotviz.arch.GPT2` (any family module's name in capitals) is that
family's spec.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType, ModuleType

from rotviz.arch import families as _families
from rotviz.arch.spec import (
    ArchSpec,
    LinearSpec,
    Names,
    NormSpec,
    Sizes,
    check_config,
    config_value,
    max_positions,
    position_offset,
)
from rotviz.errors import RotvizError

__all__ = [
    "FAMILIES", "SPECS", "ArchSpec", "LinearSpec", "Names", "NormSpec", "Sizes",
    "config_value", "family_module", "max_positions", "position_offset", "spec_for",
    "spec_named", "supported",
]


def _discover() -> tuple[ModuleType, ...]:
    found = [importlib.import_module(f"{_families.__name__}.{m.name}")
             for m in pkgutil.iter_modules(_families.__path__) if not m.ispkg]
    last = max((getattr(m, "ORDER", 0) for m in found), default=0) + 1
    return tuple(sorted(found, key=lambda m: (getattr(m, "ORDER", last), m.__name__)))


_MODULES: tuple[ModuleType, ...] = _discover()
SPECS: tuple[ArchSpec, ...] = tuple(m.SPEC for m in _MODULES)
FAMILIES: tuple[str, ...] = tuple(s.family for s in SPECS)
_BY_FAMILY: Mapping[str, ModuleType] = MappingProxyType({m.SPEC.family: m for m in _MODULES})
_BY_CONSTANT: Mapping[str, ArchSpec] = MappingProxyType(
    {m.__name__.rsplit(".", 1)[1].upper(): m.SPEC for m in _MODULES})


def __getattr__(name: str) -> ArchSpec:
    """`GPT2`, `BERT`, `TIMM_VIT`, ...: the spec of the family module of that name."""
    if name in _BY_CONSTANT:
        return _BY_CONSTANT[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def family_module(family: str) -> ModuleType:
    """The module of a family (`gpt2`, `timm-vit`, ...)."""
    if family not in _BY_FAMILY:
        raise RotvizError(f"unknown family '{family}': use one of {', '.join(FAMILIES)}")
    return _BY_FAMILY[family]


def spec_named(family: str) -> ArchSpec:
    """The spec of a family by its name."""
    return family_module(family).SPEC


def supported() -> str:
    """A human list of the supported families, for error messages."""
    return ", ".join(f"{s.family} ({s.description})" for s in SPECS)


def spec_for(config: Mapping) -> ArchSpec:
    """Pick the spec for a model config (an HF config dict or a timm config dict)."""
    for spec in SPECS:
        if spec.describes(config):
            check_config(spec, config)
            return spec
    keys = dict.fromkeys(s.type_key for s in SPECS)
    found = next((config.get(k) for k in keys if config.get(k)), None) or "unknown"
    raise RotvizError(f"unsupported model type '{found}'; supported: {supported()}")

"""ViT's encoder tensor names as checkpoints store them (transformers 4.x names, which 5.x
writes back) and as the loaded 5.x module names them: one table, read both ways
(`runtime_name` when rotviz.sources.plain_torch loads a checkpoint, `stored_name` when
rotviz.sources.plain writes a folder as transformers would). No rotviz imports: both the
loader and the writer's layer use it."""

from __future__ import annotations

import re

_VIT_NAMES = (  # (stored, loaded)
    ("attention.attention.query", "attention.q_proj"),
    ("attention.attention.key", "attention.k_proj"),
    ("attention.attention.value", "attention.v_proj"),
    ("attention.output.dense", "attention.o_proj"),
    ("intermediate.dense", "mlp.fc1"),
    ("output.dense", "mlp.fc2"),
)
_NORMS = r"(layernorm_before|layernorm_after)"  # the same name on both sides


def _renames(src: str, dst: str, pairs) -> list[tuple[re.Pattern, str]]:
    """Patterns from `src`-prefixed names of block i to `dst`-prefixed ones."""
    return [(re.compile(rf"^{re.escape(src)}\.(\d+)\.{a}\."), rf"{dst}.\1.{b}.")
            for a, b in [*((re.escape(x), y) for x, y in pairs), (_NORMS, r"\2")]]


_RENAMES = _renames("vit.encoder.layer", "vit.layers", _VIT_NAMES)
_STORED = _renames("vit.layers", "vit.encoder.layer", [(b, a) for a, b in _VIT_NAMES])


def _renamed(name: str, renames: list[tuple[re.Pattern, str]]) -> str:
    for pattern, repl in renames:
        new, n = pattern.subn(repl, name)
        if n:
            return new
    return name


def runtime_name(name: str) -> str:
    """The loaded module's name for a checkpoint tensor name."""
    return _renamed(name, _RENAMES)


def stored_name(name: str) -> str:
    """The name transformers writes for a module tensor name (ViT's encoder: 4.x names)."""
    return _renamed(name, _STORED)

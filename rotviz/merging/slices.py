"""Layer ranges of models, as mergekit's `slices` name them, and a model stacked from them:
the library under the passthrough merge (rotviz.merging.passthrough).

A slice is one model's blocks start..stop-1 (mergekit's `layer_range: [start, stop]`,
half-open). The command line spells a list of them `a:0-4,b:2-6`: letters name the models
(a the anchor, b the source), and `0-4` is the half-open range [0, 4), blocks 0, 1, 2 and 3,
exactly as mergekit's `layer_range` reads, so a YAML written from it says the same numbers.

Blocks are found by the family's own naming (`ArchSpec.roots` and `ArchSpec.block`, e.g.
`model.layers.{i}.` or `transformer.h.{i}.`), never by one family's names: a tensor is a
block's when its name is a root, the block template with a number, and the rest. A stacked
model's config is the anchor's with every depth key of the family (`n_layers_key`) set to the
new depth, and every per-layer list of the config (a list named for layers, one entry per
block, as `layer_types`: sliding or full attention) rebuilt from the lists of the models
the blocks came from, so that each block keeps the attention it was trained with.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rotviz.errors import RotvizError

if TYPE_CHECKING:
    import torch

    from rotviz.arch.spec import ArchSpec

    Tensor = torch.Tensor

LETTERS = "ab"  # a: the anchor, b: the (matched) source
MODEL_WORDS = ("anchor", "source")
_SLICE = re.compile(r"^([a-z]):(\d+)-(\d+)$")


@dataclass(frozen=True)
class Slice:
    """Blocks start..stop-1 of model `model` (0: the anchor, 1: the source)."""

    model: int
    start: int
    stop: int

    @property
    def text(self) -> str:
        return f"{LETTERS[self.model]}:{self.start}-{self.stop}"

    def __len__(self) -> int:
        return self.stop - self.start


def parse(text: str, n_models: int = 2) -> tuple[Slice, ...]:
    """The slices of `text` (`a:0-4,b:2-6`), checked for their form: a known letter, a range
    that is not empty (one line otherwise). Depths are checked by `check_depths`."""
    letters = LETTERS[:n_models]
    out = []
    for part in str(text).replace(" ", "").split(","):
        found = _SLICE.match(part.lower())
        if found is None:
            raise RotvizError(f"--slices: cannot read '{part}'; write MODEL:START-STOP, e.g. "
                              f"a:0-4,b:2-6 (a: the anchor, b: the source; STOP not included)")
        letter, start, stop = found.group(1), int(found.group(2)), int(found.group(3))
        if letter not in letters:
            raise RotvizError(f"--slices: unknown model '{letter}' in '{part}'; use "
                              f"{' or '.join(letters)} (a: the anchor, b: the source)")
        if stop <= start:
            raise RotvizError(f"--slices: '{part}' is empty (blocks {start} up to, not "
                              f"including, {stop}); give START < STOP, e.g. "
                              f"{letter}:{start}-{start + 1}")
        out.append(Slice(letters.index(letter), start, stop))
    return tuple(out)


def check_depths(slices: Sequence[Slice], depths: Sequence[int]) -> None:
    """Every slice lies inside its model's blocks (one line naming the first that does not)."""
    for s in slices:
        if s.stop > depths[s.model]:
            raise RotvizError(f"--slices: '{s.text}' reaches block {s.stop - 1}, but the "
                              f"{MODEL_WORDS[s.model]} has blocks 0 to {depths[s.model] - 1}; "
                              f"give STOP <= {depths[s.model]}")


def halves(depth: int) -> tuple[Slice, ...]:
    """The default: the anchor's blocks below the middle, the source's from it (the depth
    kept; a model merged with itself is itself)."""
    mid = depth // 2
    return tuple(s for s in (Slice(0, 0, mid), Slice(1, mid, depth)) if len(s))


def plan(slices: Sequence[Slice]) -> tuple[tuple[int, int], ...]:
    """(model, block) of each block of the stacked model, in order."""
    return tuple((s.model, i) for s in slices for i in range(s.start, s.stop))


def _templates(spec: ArchSpec) -> list[re.Pattern]:
    pats = []
    for root in spec.roots:
        for block in spec.block:
            head, _, tail = block.partition("{i}")
            pats.append(re.compile(rf"^({re.escape(root + head)})(\d+)({re.escape(tail)}.*)$"))
    return pats


def block_of(spec: ArchSpec, name: str) -> tuple[str, int, str] | None:
    """(the prefix before the index, the block's index, the rest) of a block's tensor name,
    by the family's block naming; None for a tensor outside the blocks."""
    for pat in _templates(spec):
        found = pat.match(name)
        if found is not None:
            return found.group(1), int(found.group(2)), found.group(3)
    return None


def depth_of(spec: ArchSpec, state: Mapping[str, Any]) -> int:
    """The number of blocks a state dict holds (by its tensor names)."""
    found = {b[1] for b in (block_of(spec, k) for k in state) if b is not None}
    return max(found) + 1 if found else 0


def stack(spec: ArchSpec, states: Sequence[Mapping[str, Tensor]],
          blocks: Sequence[tuple[int, int]], first: int = 0, last: int = 0
          ) -> dict[str, Tensor]:
    """The state dict of a model whose block i is block `blocks[i][1]` of model
    `blocks[i][0]`, renamed to index i. The tensors outside the blocks come from model
    `first` where they come before the blocks in the module's order (embeddings) and from
    model `last` after them (final norm, head). The tensors are the inputs' own (not
    copied): never modify them."""
    names = list(states[first])
    inside = [block_of(spec, k) for k in names]
    start = next((i for i, b in enumerate(inside) if b is not None), len(names))
    out: dict[str, Tensor] = {}
    for k in names[:start]:
        out[k] = states[first][k]
    for j, (model, index) in enumerate(blocks):
        for k in states[model]:
            b = block_of(spec, k)
            if b is not None and b[1] == index:
                out[f"{b[0]}{j}{b[2]}"] = states[model][k]
    for k, b in zip(names[start:], inside[start:], strict=True):
        if b is None:
            out[k] = states[last][k]
    return out


def stacked_config(spec: ArchSpec, configs: Sequence[Mapping[str, Any]],
                   blocks: Sequence[tuple[int, int]], ends: int = 0) -> dict[str, Any]:
    """The config of the stacked model: model `ends`'s, its depth keys set to len(blocks)
    and its per-layer lists rebuilt from the models the blocks came from."""
    import copy

    config = copy.deepcopy(dict(configs[ends]))
    old = [_depth(spec, c) for c in configs]
    for holder in (config, config.get("model_args") or {}):
        for key in spec.n_layers_key:
            if key in holder and holder[key] is not None:
                holder[key] = len(blocks)
        for key, value in list(holder.items()):
            if "layer" in key and isinstance(value, list) and len(value) == old[ends] and all(
                    isinstance(c.get(key), list) and len(c[key]) == d
                    for c, d in zip(configs, old, strict=True)):
                holder[key] = [configs[m][key][i] for m, i in blocks]
    return config


def _depth(spec: ArchSpec, config: Mapping[str, Any]) -> int:
    from rotviz.arch.spec import config_value

    return int(config_value(config, spec.n_layers_key, 0) or 0)

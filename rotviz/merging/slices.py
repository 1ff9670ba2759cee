"""Layer ranges of models, as mergekit's `slices` name them: the passthrough merge's
`--slices` (rotviz.merging.passthrough), read and checked here, and the plan of blocks it
names, which rotviz.sources.stacking stacks into a model with its own config.

A slice is one model's blocks start..stop-1 (mergekit's `layer_range: [start, stop]`,
half-open). The command line spells a list of them `a:0-4,b:2-6`: letters name the models
(a the anchor, b the source), and `0-4` is the half-open range [0, 4), blocks 0, 1, 2 and 3,
exactly as mergekit's `layer_range` reads, so a YAML written from it says the same numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rotviz.errors import RotvizError

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

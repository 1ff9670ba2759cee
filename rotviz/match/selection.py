"""Matching strings (`--match`, stored in results): which symmetries a run matches.

A matching string is `none`, or a comma list of names: the records of
rotviz.symmetry.registry (`ffn`, `attn`, `rescale`, `heads`, `residual`; `act` and `learned`
solve from data) and the shorthands `seed` (the seed paper's three) and `weight` (every
data-free map, alternated: rotviz.match.alternating). `act` or `learned` with no map named
holds every map of `weight`; `learned` with no map named also holds `act`: it starts from
activation matching, whose barrier on the default pair is a third of weight matching's and
which costs a tenth as much, so learned matching needs about a quarter of the steps
(docs/solvers.md). `weight,learned` starts from weight matching.
"""

from __future__ import annotations

from dataclasses import make_dataclass

from rotviz.errors import RotvizError
from rotviz.match.options import MatchOptions
from rotviz.symmetry.registry import DATA_SOLVERS, MAPS, SHORTHANDS, SYMMETRIES

FLAGS = tuple(s.name for s in SYMMETRIES)
NAMES = ("none",) + FLAGS + tuple(SHORTHANDS)


class _Selection:
    """The behaviour of Selection; one boolean field per registered symmetry."""

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(f for f in FLAGS if getattr(self, f))

    @property
    def label(self) -> str:
        """The canonical text: the largest shorthand it holds, then the rest."""
        on = set(self.flags)
        for short in ("weight", "seed"):
            if set(SHORTHANDS[short]) <= on:
                rest = [f for f in self.flags if f not in SHORTHANDS[short]]
                return ",".join([short, *rest])
        return ",".join(self.flags) or "none"

    @property
    def is_none(self) -> bool:
        return not self.flags

    def options(self, layers: tuple[int, ...] | None = None) -> MatchOptions:
        """The `MatchOptions` for this selection."""
        return MatchOptions(**{f: getattr(self, f) for f in FLAGS}, layers=layers)


Selection = make_dataclass("Selection", [(f, bool, False) for f in FLAGS],
                           bases=(_Selection,), frozen=True, kw_only=True)
Selection.__module__ = __name__
Selection.__doc__ = "A parsed matching string: one boolean per registered symmetry."


def parse_selection(text: str | _Selection | None) -> _Selection:
    """'seed' -> Selection(ffn, attn, rescale); 'none' -> Selection(); unknown names are an
    error, and so is an empty SPEC ('', ' , '): taking it as 'none' would quietly measure an
    unmatched pair a user meant to match."""
    if isinstance(text, _Selection):
        return text
    if text is None:
        return Selection()
    if not isinstance(text, str):
        raise RotvizError(f"matching SPEC must be text like 'ffn,attn', not {type(text).__name__}")
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    if not names:
        raise RotvizError(f"empty matching SPEC '{text}': use none, or a comma list of "
                          f"{', '.join(NAMES[1:])}")
    if names == ["none"]:
        return Selection()
    unknown = [n for n in names if n not in NAMES or n == "none"]
    if unknown:
        what = "'none' cannot be combined with other names" if unknown == ["none"] else (
            f"unknown matching option {', '.join(repr(u) for u in unknown)}"
        )
        raise RotvizError(
            f"{what} in SPEC '{text}': use none, or a comma list of {', '.join(NAMES[1:])}"
        )
    on: set[str] = set()
    for n in names:
        on.update(SHORTHANDS.get(n, (n,)))
    if on & set(DATA_SOLVERS) and not on & set(MAPS):  # a solver alone starts from weight,
        on.update(SHORTHANDS["weight"])  # learned from activation matching (the docstring)
        if "learned" in on:
            on.add("act")
    return Selection(**{f: f in on for f in FLAGS})


def match_options(text: str | _Selection | None,
                  layers: tuple[int, ...] | None = None) -> MatchOptions | None:
    """Parse a matching string straight to `MatchOptions`; `none` gives None (no matching)."""
    sel = parse_selection(text)
    return None if sel.is_none else sel.options(layers)


def selection_of(options: MatchOptions | None) -> _Selection:
    """The selection of a `MatchOptions` (None means no matching)."""
    if options is None:
        return Selection()
    return Selection(**{f: bool(getattr(options, f, False)) for f in FLAGS})


def label_of(options: MatchOptions | None) -> str:
    return selection_of(options).label


"""Matching SPEC strings, as typed on the command line and stored in results.

A SPEC is `none`, or a comma list of names:
- groups: `ffn`, `attn`, `rescale` (the seed paper's three), `heads` (head permutation) and
  `residual` (the residual-stream map, alternated with the others);
- solvers that need data: `act` (FFN and residual maps from activations) and `learned`
  (maps tuned so the path has no barrier);
- shorthands: `seed` = ffn,attn,rescale; `weight` = seed,heads,residual: every data-free map,
  alternated (rotviz.match.alternating). `act` or `learned` with no group named starts from
  `weight`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rotviz.errors import RotvizError
from rotviz.match.options import MatchOptions

# name -> the flags it switches on
SHORTHANDS: dict[str, tuple[str, ...]] = {
    "seed": ("ffn", "attn", "rescale"),
    "weight": ("ffn", "attn", "rescale", "heads", "residual"),
}
GROUPS = ("ffn", "attn", "rescale", "heads", "residual")
SOLVERS = ("act", "learned")  # need data
FLAGS = GROUPS + SOLVERS
NAMES = ("none",) + FLAGS + tuple(SHORTHANDS)


@dataclass(frozen=True)
class Spec:
    """A parsed SPEC: one boolean per symmetry or solver. `label` is its canonical text."""

    ffn: bool = False
    attn: bool = False
    rescale: bool = False
    heads: bool = False
    residual: bool = False
    act: bool = False
    learned: bool = False

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(f for f in FLAGS if getattr(self, f))

    @property
    def label(self) -> str:
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
        """The `MatchOptions` for this spec; a flag the engine cannot do yet is an error."""
        fields = {f.name for f in dataclasses.fields(MatchOptions)}
        missing = [f for f in self.flags if f not in fields]
        if missing:
            raise RotvizError(
                f"matching option {', '.join(missing)} is not available yet; "
                f"use a comma list of {', '.join(f for f in FLAGS if f in fields)}, seed or none"
            )
        kwargs = {f: getattr(self, f) for f in FLAGS if f in fields}
        return MatchOptions(**kwargs, layers=layers)


def parse_spec(text: str | Spec | None) -> Spec:
    """'seed' -> Spec(ffn, attn, rescale); 'none' or '' -> Spec(); unknown names are an error."""
    if isinstance(text, Spec):
        return text
    if text is None:
        return Spec()
    if not isinstance(text, str):
        raise RotvizError(f"matching SPEC must be text like 'ffn,attn', not {type(text).__name__}")
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    if not names or names == ["none"]:
        return Spec()
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
    if on & set(SOLVERS) and not on & set(GROUPS):  # a solver alone starts from weight matching
        on.update(SHORTHANDS["weight"])
    return Spec(**{f: f in on for f in FLAGS})


def match_options(text: str | Spec | None,
                  layers: tuple[int, ...] | None = None) -> MatchOptions | None:
    """Parse a SPEC straight to `MatchOptions`; `none` gives None (no matching at all)."""
    spec = parse_spec(text)
    return None if spec.is_none else spec.options(layers)


def spec_of(options: MatchOptions | None) -> Spec:
    """The spec of a `MatchOptions` (None means no matching)."""
    if options is None:
        return Spec()
    return Spec(**{f: bool(getattr(options, f, False)) for f in FLAGS})


def label_of(options: MatchOptions | None) -> str:
    return spec_of(options).label

"""A declared parameter of a measurement or a merge method: one record from which the CLI's
option, the app's widget, the library's keyword and the check of a value are all made.

A parameter names its bound in rotviz.limits (numbers) or its choices (words), so a value
refused in one place is refused, with the same one line, everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rotviz.errors import RotvizError
from rotviz.limits import Bound


@dataclass(frozen=True)
class Param:
    """One parameter: `name` is the Python keyword (`batch_size`), the CLI flag is
    `--batch-size`. Numbers carry a `bound`; words carry `choices` (or none, free text)."""

    name: str
    default: Any
    help: str
    bound: Bound | None = None
    choices: tuple[str, ...] = ()
    label: str = ""  # the app's widget label (default: the name in words)
    widget: tuple[float, float, float] = ()  # the app's slider (lo, hi, step), inside the bound
    metavar: str = ""  # the CLI's name for a free-text value (MODEL); default BOUND or NAME
    # (another parameter, the values of it this one means something with): given otherwise,
    # it would be silently ignored, so `check_needs` refuses it ("--nullity-tol needs
    # --nullity yes"); empty: it always counts
    needs: tuple[str, tuple[str, ...]] = ()
    # shown at a section's first look; the others wait under its one "More options" expander
    # (a teacher's first view of a page holds the few controls that change the picture)
    essential: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def title(self) -> str:
        return self.label or self.name.replace("_", " ").capitalize()

    @property
    def text(self) -> str:
        """What a value may be, in words (for help and errors)."""
        if self.bound is not None:
            return self.bound.text
        if self.choices:
            return "one of " + ", ".join(self.choices)
        return "a word"

    def _bound(self) -> Bound | None:
        """The bound, naming this parameter's flag (its messages name the option given)."""
        b = self.bound
        if b is None or b.flag == self.flag:
            return b
        return Bound(self.flag, b.lo, b.hi, b.integer)

    def check(self, value: Any) -> Any:
        """`value` checked (a one-line RotvizError naming the flag otherwise)."""
        if self.bound is not None:
            return self._bound().check(value)
        if self.choices and value not in self.choices:
            raise RotvizError(f"unknown {self.flag} '{value}': use one of "
                              f"{', '.join(self.choices)}")
        if not isinstance(value, str):
            raise RotvizError(f"{self.flag} must be {self.text}, got {value!r}")
        return value

    def parse(self, text: str) -> Any:
        """A command-line string, parsed and checked."""
        if self.bound is not None:
            return self._bound().parse(text)
        return self.check(str(text).strip())


def read_params(params: tuple[Param, ...], given: Mapping[str, Any],
                owner: str = "") -> dict[str, Any]:
    """Every parameter's value: what `given` holds for it (checked), else its default. A
    name `given` holds that no parameter declares is a one-line error."""
    known = {p.name: p for p in params}
    extra = sorted(set(given) - set(known))
    if extra:
        what = f" of {owner}" if owner else ""
        raise RotvizError(f"unknown parameter{'s' if len(extra) > 1 else ''}{what}: "
                          f"{', '.join(extra)}; use {', '.join(known) or 'none'}")
    return {p.name: p.check(given[p.name]) if given.get(p.name) is not None else p.default
            for p in params}


def check_needs(params: tuple[Param, ...], values: Mapping[str, Any],
                given: set[str]) -> None:
    """Refuse, in one line, a parameter given whose declared condition (`Param.needs`) the
    values do not meet: an option a run would ignore is an error, not a quiet default."""
    flags = {p.name: p.flag for p in params}
    for p in params:
        if p.needs and p.name in given:
            other, ok = p.needs
            needs(p.flag, True, f"{flags[other]} {' or '.join(ok)}", values[other] in ok)


def needs(flag: str, given: bool, requirement: str, ok: bool) -> None:
    """An option that only means something with another one is an error without it."""
    if given and not ok:
        raise RotvizError(f"{flag} needs {requirement}: add it, or drop {flag}")

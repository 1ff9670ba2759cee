"""A registry of named records (measurements, merge methods): registration order, with the
built-ins listed first in a fixed order, and each name registered once.

The record kinds keep their own record type and their own lookup errors; what they share,
the bookkeeping, lives here once.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from rotviz.errors import RotvizError


class Named(Protocol):
    name: str


T = TypeVar("T", bound=Named)


class Records(Generic[T]):
    """Records by name; `what` names the kind in errors ("measurement", "merge method")."""

    def __init__(self, what: str, built_in: tuple[str, ...]) -> None:
        self.what = what
        self.built_in = built_in  # listed first, in this order
        self._by_name: dict[str, T] = {}

    def register(self, record: T) -> T:
        """Add a record (its name must be new and a Python identifier); returns it."""
        if record.name in self._by_name:
            raise RotvizError(f"{self.what} '{record.name}' is registered twice")
        if not record.name.isidentifier():
            raise RotvizError(f"{self.what} name '{record.name}' must be a Python identifier")
        self._by_name[record.name] = record
        return record

    def all(self) -> tuple[T, ...]:
        """Every record, built-ins first, then the others in the order registered."""
        first = [self._by_name[n] for n in self.built_in if n in self._by_name]
        return tuple(first + [r for r in self._by_name.values() if r.name not in self.built_in])

    def get(self, name: str) -> T | None:
        return self._by_name.get(name)

"""A registry of named records (measurements, merge methods, gallery entries): each name
registered once, listed by each record's `order` (then by name), so that menus and help
stay stable whatever order modules were found in.

The record kinds keep their own record type and their own lookup errors; what they share,
the bookkeeping, lives here once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from rotviz.errors import RotvizError


class Named(Protocol):
    name: str
    order: int


T = TypeVar("T", bound=Named)


class Records(Generic[T]):
    """Records by name; `what` names the kind in errors ("measurement", "merge method")."""

    def __init__(self, what: str) -> None:
        self.what = what
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
        """Every record, by its `order`, then by name."""
        return tuple(sorted(self._by_name.values(), key=lambda r: (r.order, r.name)))

    def get(self, name: str) -> T | None:
        return self._by_name.get(name)


def discover(package: str, path: Iterable[str]) -> None:
    """Import every module of a record package (rotviz.measures, rotviz.merging): each one
    that defines a record registers it, so a new record is one module dropped there and no
    list names it. Modules whose name starts with an underscore are skipped; the order does
    not matter (records are listed by `order`)."""
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules(path), key=lambda i: i.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")

"""Results of pure functions of tensors, kept while those exact tensor objects live.

Alternating weight matching re-solves every subproblem each round, but many inputs do not
change between rounds: a layer whose units stayed in place keeps its FFN tensors (the same
objects), and a residual map that comes out the identity leaves the stream untouched. Keyed
by tensor identity, such a re-solve is a look-up and gives the very result a fresh solve
would (the functions are deterministic), so the alternation stays exact. An entry is dropped
as soon as one of its tensors is freed, so the memo never keeps old weights alive; a memo
lives for one matching call (no global state).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from torch import Tensor

T = TypeVar("T")


class TensorMemo:
    """memo.get(tag, tensors, compute): compute() once per (tag, these tensor objects)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[list[weakref.ref], Any]] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, tag: str, tensors: Sequence[Tensor | None]) -> tuple[bool, Any]:
        """(True, value) when `value` was stored for these very tensor objects."""
        hit = self._entries.get(_key(tag, tensors))
        present = [t for t in tensors if t is not None]
        if hit is not None and all(r() is t for r, t in zip(hit[0], present, strict=True)):
            self.hits += 1
            return True, hit[1]
        self.misses += 1
        return False, None

    def put(self, tag: str, tensors: Sequence[Tensor | None], value: Any) -> None:
        key = _key(tag, tensors)
        refs: list[weakref.ref] = []

        def drop(_: weakref.ref, key: tuple = key, token: list = refs) -> None:
            entry = self._entries.get(key)
            if entry is not None and entry[0] is token:  # not a newer entry under a reused id
                del self._entries[key]

        refs.extend(weakref.ref(t, drop) for t in tensors if t is not None)
        self._entries[key] = (refs, value)

    def get(self, tag: str, tensors: Sequence[Tensor | None], compute: Callable[[], T]) -> T:
        found, value = self.find(tag, tensors)
        if not found:
            value = compute()
            self.put(tag, tensors, value)
        return value


def _key(tag: str, tensors: Sequence[Tensor | None]) -> tuple:
    return (tag, *(None if t is None else id(t) for t in tensors))


def cached(memo: TensorMemo | None, tag: str, tensors: Sequence[Tensor | None],
           compute: Callable[[], T]) -> T:
    """compute(), through `memo` when there is one."""
    return compute() if memo is None else memo.get(tag, tensors, compute)

"""The app's result cache and the configuration hashes it is keyed by.

A run's configuration is plain data; its hash is both the cache key and the run id that the
exports carry, so a result and its export name the same configuration.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def canonical(obj: Any) -> Any:
    """A JSON-ready copy with sorted keys, tuples as lists and floats rounded for hashing."""
    if isinstance(obj, Mapping):
        return {str(k): canonical(obj[k]) for k in sorted(obj, key=str)}
    if isinstance(obj, (list, tuple)):
        return [canonical(x) for x in obj]
    if isinstance(obj, float):
        return float(f"{obj:.12g}")
    if isinstance(obj, Path):
        return str(obj)
    return obj


def config_hash(config: Mapping[str, Any]) -> str:
    """A short stable hash of a run configuration: the cache key and the run's id."""
    text = json.dumps(canonical(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ResultCache:
    """Results by configuration hash, least recently used dropped beyond `max_entries`.

    The app computes inside `get_or_compute` rather than inside a Streamlit-cached function,
    so a computation may report progress to the page while it runs (Streamlit replays the
    elements a cached function draws, which breaks for elements drawn outside it) and may be
    interrupted: when `compute` raises, anything at all (Streamlit's stop and rerun signals
    are BaseExceptions), nothing is stored and the next caller computes afresh. One lock per
    key: two callers asking for the same key compute it once. `copy` gives every caller its
    own copy (a deep copy, like st.cache_data); without it the one stored object is shared
    (like st.cache_resource: never modify it).
    """

    def __init__(self, max_entries: int = 256, copy: bool = True):
        self.max_entries = max_entries
        self.copy = copy
        self._data: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def _out(self, value: Any) -> Any:
        import copy

        return copy.deepcopy(value) if self.copy else value

    def get_or_compute(self, key: str, compute: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._out(self._data[key])
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:  # computed by another caller while we waited
                if key in self._data:
                    self._data.move_to_end(key)
                    return self._out(self._data[key])
            value = compute()  # an exception leaves nothing behind
            with self._lock:
                self._data[key] = value
                self._data.move_to_end(key)
                while len(self._data) > self.max_entries:
                    self._data.popitem(last=False)
                self._key_locks.pop(key, None)
        return self._out(value)

    def discard(self, key: str) -> None:
        """Forget `key` (nothing happens if it is not stored)."""
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

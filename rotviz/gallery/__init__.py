"""The paper-figure gallery: one registered record per figure a paper shows (rotviz.gallery.
registry), the built-ins in rotviz.gallery.paper, made with rotviz's registered measurements
(rotviz.gallery.make) into a folder of figures, their data and commands, and one
self-contained report (rotviz.gallery.report). `rotviz figures` and the app's Gallery page
are generated from `entries()`.

Importing this package costs no torch or plotly import.
"""

from __future__ import annotations

from rotviz.gallery import paper  # noqa: F401  (the built-ins)
from rotviz.gallery.registry import (
    Entry,
    Pair,
    Run,
    each,
    entries,
    entry,
    read_table,
    register,
    select,
)

__all__ = ["Entry", "Pair", "Run", "each", "entries", "entry", "read_table", "register",
           "select"]

"""What matching a pair in memory needs, from the safetensors headers alone: whether a
command must run at size. Asked on every command before anything is loaded, so it imports only
the header reader (rotviz.sources.checkpoint), not the path at size (rotviz.atsize.blocks pulls in
matching, views and actions)."""

from __future__ import annotations

import math

from rotviz.confine import ANYWHERE, Confined
from rotviz.errors import RotvizError
from rotviz.sources.checkpoint import Checkpoint
from rotviz.sources.loading import resolve_ref

# The in-memory path holds about 3.5-4.4x the pair's float32 bytes at its peak (both models,
# their views, the matched copy and the checks; bench/RESULTS.md, LLaMA-1B rows).
IN_MEMORY_FACTOR = 4.5


def pair_bytes_in_memory(anchor_ref: str, source_ref: str, confined: Confined = ANYWHERE
                         ) -> int | None:
    """About what matching two model folders in memory needs at its peak, from their
    safetensors headers read through `confined` (None where a folder has none: it can only
    be matched in memory)."""
    total = 0
    for ref in (anchor_ref, source_ref):
        try:
            checkpoint = Checkpoint(resolve_ref(ref, confined), confined)
        except RotvizError:
            return None
        total += 4 * sum(math.prod(e.shape) for e in checkpoint.entries.values())
    return int(IN_MEMORY_FACTOR * total)

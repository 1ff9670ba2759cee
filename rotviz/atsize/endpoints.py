"""Endpoints at size: the `Endpoints` of a pair too large for memory.

The source is matched at size (a block at a time from its safetensors shards) into a
temporary folder; the endpoints are then three checkpoint folders (anchor, source, matched
source) that the measurements at size (rotviz.atsize.points) read a block at a time, and the
match's brief.
Without matching the matched source is the source itself. The folder is removed when the
context ends.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.match.endpoints import MatchInfo, info_of, layers_of, unmeasured
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import Matched
from rotviz.match.selection import label_of


@dataclass(frozen=True)
class StreamedEndpoints:
    """Anchor, source and matched source as checkpoint folders. `info` is rank 0's (None on
    torchrun's other ranks); every rank reads the same matched folder."""

    anchor_ref: str
    source_ref: str
    anchor_path: str
    source_path: str
    matched_path: str
    # the match's brief (`info`), made when first read: the distance of a pair not matched
    # is worked out meanwhile (rotviz.match.at_size_checks.RestLater); brief(False) stops
    # that work and leaves the distance out (`unmeasured`)
    brief: Callable[[bool], MatchInfo | None]
    layers: list[int] | None
    anchor: Any  # the opened anchor (rotviz.atsize.blocks.Streamed)
    at_size: bool = True
    # the match's `different_heads` (None without matching), known before the brief is made
    different_heads: dict | None = None

    @cached_property
    def info(self) -> MatchInfo | None:
        """What matching did, in brief (rank 0's; None on torchrun's other ranks)."""
        return self.brief(True)

    def unmeasured(self) -> MatchInfo | None:
        """The brief of a caller that measures nothing (rotviz.match.endpoints.unmeasured):
        the distance of a pair not matched is neither waited for nor reported, and its thread
        stops after the slice it is on."""
        info = self.brief(False)
        return None if info is None else unmeasured(info)

    @property
    def match(self) -> str:
        return "none" if self.info is None else self.info.match


def refuse(options: MatchOptions | None) -> None:
    """A one-line error when `options` cannot be matched at size."""
    from rotviz.match.at_size_checks import streaming_refusal

    why = None if options is None else streaming_refusal(options)
    if why:
        raise RotvizError(f"the pair is evaluated block by block (--max-memory), and {why}; "
                          "raise --max-memory or drop that option")


@contextmanager
def streamed_endpoints(anchor: Any, source: Any, options: MatchOptions | None, device: Any,
                       group: Group = SINGLE) -> Iterator[StreamedEndpoints]:
    """Match the opened streamed pair (rotviz.atsize.blocks.open_streamed) with `options`
    into a temporary folder shared by every torchrun rank, and yield the endpoints."""
    from rotviz.match.at_size import match_streamed
    from rotviz.match.at_size_checks import RestLater, streamed_distance

    refuse(options)
    rest = None
    with tempfile.TemporaryDirectory(prefix="rotviz-matched-") as tmp:
        matched, info = str(source.ref), None
        if options is not None:
            folder = Path(tmp) / "matched"
            if group.main:
                folder.mkdir()
            rep = match_streamed(anchor, source, folder if group.main else None, options,
                                 device, group=group)
            matched = group.share(str(folder))  # rank 0's folder, read by every rank
            if rep is not None:
                failure = Matched({}, rep).failure
                if failure:
                    raise RotvizError(f"{failure}; please report this as a bug")
                info = info_of(rep, label_of(options))
        elif group.main and anchor.path == source.path:  # one model (a slice): nothing to read
            info = MatchInfo("none", 0.0, 0.0, 0.0, 0.0)
        elif group.main:
            rest = RestLater(anchor, source)

        def brief(measure: bool) -> MatchInfo | None:
            if rest is None:
                return info
            if not measure:
                rest.close()
                return MatchInfo("none", None, None, None, 0.0)
            d = streamed_distance(anchor, source, rest)
            return MatchInfo("none", d.total, d.total, 0.0, 0.0, d.to_dict(), d.to_dict())

        try:
            yield StreamedEndpoints(str(anchor.ref), str(source.ref), str(anchor.ref),
                                    str(source.ref), matched, brief, layers_of(options), anchor,
                                    different_heads=None if info is None else
                                    info.different_heads)
        finally:
            if rest is not None:
                rest.close()

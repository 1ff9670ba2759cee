"""Endpoints: the one product of matching, and what every measurement takes.

Matching is an upstream step. It turns (anchor, source, options) into one value: the anchor,
the source, the source as matched onto the anchor, and what matching did (`MatchInfo`:
distances before and after, the function check, time). Measurements (curves, planes,
merges, spectra, ...) take endpoints and never matching options, so one match serves every
measurement, in the library, the CLI and the app alike.

Two variants share one interface (`Endpoints`):
- `HeldEndpoints`: the three parameter sets held in memory (this module);
- endpoints at size: checkpoint folders read a block at a time (rotviz.atsize.endpoints),
  for pairs larger than memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

import torch

from rotviz.errors import RotvizError
from rotviz.match.distances import distances
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import Matched, body_views, match_models, view_of
from rotviz.match.selection import label_of, match_options
from rotviz.match.widths import check_pair, refuse_narrower
from rotviz.sources.loading import Loaded
from rotviz.sources.pairs import heads_differ
from rotviz.types import Progress

if TYPE_CHECKING:
    from rotviz.data.split import Split
    from rotviz.match.report import MatchReport

Tensor = torch.Tensor


@dataclass
class MatchInfo:
    """What matching did, in brief: for curves, tables and exports."""

    match: str  # canonical matching SPEC ("none" without matching)
    # None: not measured (a pair not matched, merged only to be written: `unmeasured`)
    distance_before: float | None
    distance_after: float | None
    max_output_diff: float | None
    seconds: float
    before: dict = field(default_factory=dict)  # Distances.to_dict(): total, per_layer, per_kind
    after: dict = field(default_factory=dict)
    # one body under two heads (rotviz.sources.pairs.HeadsDiffer.to_dict): distances are over the
    # tensors both hold, and a measurement of the loss is refused
    different_heads: dict | None = None


def unmeasured(info: MatchInfo) -> MatchInfo:
    """`info` as a caller that measures nothing reports it (a merge only written, the work
    mergekit does: `--evaluate no`): a pair not matched without its parameter distance, which
    at size is a pass over both models; a matched pair's brief is its match's, as it was."""
    if info.match != "none":
        return info
    return replace(info, distance_before=None, distance_after=None, before={}, after={})


class Endpoints(Protocol):
    """What a measurement may rely on, held or streamed."""

    anchor_ref: str
    source_ref: str
    info: MatchInfo
    layers: list[int] | None  # the layers matched (None: all)
    at_size: bool  # True: folders read block by block; False: parameter sets in memory

    @property
    def match(self) -> str: ...

    @property
    def different_heads(self) -> dict | None:
        """`info.different_heads`, read without making a brief that is made when first read
        (at size, the distance of a pair not matched)."""


def layers_of(options: MatchOptions | None) -> list[int] | None:
    return None if options is None or options.layers is None else list(options.layers)


def as_options(options: MatchOptions | str | None) -> MatchOptions | None:
    """MatchOptions, a SPEC string, or None (no matching)."""
    if options is None or isinstance(options, MatchOptions):
        return options
    return match_options(options)


@dataclass(frozen=True)
class HeldEndpoints:
    """The anchor, the source and the matched source's parameters, all in memory.

    `matched` is the source's state as matched (the source's own state without matching);
    the loaded models are shared and never modified. `report` is matching's full report
    (per-head angles, residual rounds, learned history), None without matching."""

    anchor: Loaded
    source: Loaded
    matched: Mapping[str, Tensor]
    info: MatchInfo
    layers: list[int] | None = None
    report: MatchReport | None = None
    at_size: bool = False

    @property
    def match(self) -> str:
        return self.info.match

    @property
    def different_heads(self) -> dict | None:
        return self.info.different_heads

    @property
    def anchor_ref(self) -> str:  # type: ignore[override]
        return self.anchor.ref

    @property
    def source_ref(self) -> str:  # type: ignore[override]
        return self.source.ref


def info_of(report: MatchReport, label: str) -> MatchInfo:
    """The brief of a matching report."""
    return MatchInfo(label, report.before.total, report.after.total, report.max_output_diff,
                     report.seconds, report.before.to_dict(), report.after.to_dict(),
                     report.different_heads)


def unmatched(anchor: Loaded, source: Loaded) -> HeldEndpoints:
    """The pair as it is (matching 'none'): the source's own state, its distance twice. A
    narrower source has no place in the anchor's architecture before matching: refused."""
    if check_pair(anchor, source, heads=True):
        refuse_narrower("only matching embeds it into the anchor's width, which every "
                        "comparison needs", "give --match (e.g. seed) instead of none")
    differ = heads_differ(anchor, source)
    if differ is None:
        d = distances(view_of(source), view_of(anchor))
    else:  # one body under two heads: the tensors both hold
        va, vs = body_views(anchor, source, differ)
        d = distances(vs, va)
    info = MatchInfo("none", d.total, d.total, 0.0, 0.0, d.to_dict(), d.to_dict(),
                     None if differ is None else differ.to_dict())
    return HeldEndpoints(anchor, source, dict(source.state), info)


def from_matched(anchor: Loaded, source: Loaded, matched: Matched | None,
                 options: MatchOptions | str | None) -> HeldEndpoints:
    """Endpoints of a match already made (the app keeps `Matched` values in its cache);
    None or options None: the pair unmatched. A match whose function check failed is
    refused in one line."""
    options = as_options(options)
    if matched is None or options is None:
        return unmatched(anchor, source)
    label = label_of(options)
    if not matched.preserved:
        raise RotvizError(f"matching [{label}]: {matched.failure}; please report this as a bug")
    return HeldEndpoints(anchor, source, matched.state, info_of(matched.report, label),
                         layers_of(options), matched.report)


def match_endpoints(anchor: Loaded, source: Loaded, options: MatchOptions | str | None,
                    device: str | torch.device = "cpu", progress: Progress | None = None,
                    data: str | Split | None = None,
                    cancel: Callable[[], bool] | None = None) -> HeldEndpoints:
    """match_endpoints(anchor, source, "seed", device) -> HeldEndpoints

    Match `source` onto `anchor` with `options` (MatchOptions, a SPEC string, or None for
    no matching), check that its function is kept, and return the endpoints. Activation and
    learned matching train on `data`'s train split (validation: its val split). A source
    whose FFN is narrower than the anchor's is matched in the anchor's width
    (rotviz.match.widths): `matched` then has the anchor's shapes, `source` its own."""
    from rotviz.devices import resolve_device

    check_pair(anchor, source, heads=True)  # the measurement says what it needs
    options = as_options(options)
    if options is None:
        return unmatched(anchor, source)
    out = match_models(anchor, source, options, resolve_device(device), progress, data, cancel)
    return from_matched(anchor, source, out, options)

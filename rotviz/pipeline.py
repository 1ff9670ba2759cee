"""Model-level matching: views in, matched state dict and checked report out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rotviz.matching import MatchOptions, MatchReport, Progress, match
from rotviz.models import (
    Loaded,
    check_compatible,
    check_finite,
    max_output_diff,
    wide_device,
)
from rotviz.view import read_view, write_state

# A transform counts as function-preserving when the logits move by less than this
# (float32; every transform in rotviz stays far below it, see tests/).
FUNCTION_TOLERANCE = 1e-3


@dataclass
class Matched:
    state: dict[str, torch.Tensor]
    report: MatchReport

    @property
    def preserved(self) -> bool:
        diff = self.report.max_output_diff
        return diff is not None and diff <= FUNCTION_TOLERANCE


def view_of(loaded: Loaded, device: torch.device | str = "cpu"):
    return read_view(loaded.spec, loaded.config, loaded.state).to(device=device)


def match_models(
    anchor: Loaded,
    source: Loaded,
    options: MatchOptions | None = None,
    device: torch.device | str = "cpu",
    progress: Progress | None = None,
    data: str | None = None,
    cancel: Callable[[], bool] | None = None,
) -> Matched:
    """Match `source` onto `anchor`; check on probe inputs that the function is preserved.

    Activation and learned matching (`options.act`, `options.learned`) read `data` (a data
    reference such as "digits"); learned matching stops early when `cancel()` is true."""
    check_compatible(anchor, source)
    options = options or MatchOptions()
    device = wide_device(device)  # the solvers work in float64, which MPS lacks
    va, vs = view_of(anchor, device), view_of(source, device)
    if options.needs_data:
        from rotviz.datamatch import match_with_data

        result = match_with_data(anchor, va, vs, options, data, torch.device(device), progress,
                                 cancel)
    else:
        result = match(va, vs, options, progress)
    state = {k: v.to("cpu") for k, v in write_state(result.view).items()}
    check_finite(state, "the matched model")
    result.report.max_output_diff = max_output_diff(source, source.state, state)
    return Matched(state, result.report)

"""Which algorithm a choice of options runs: the per-layer maps alone (the seed paper), or
alternated with the residual stream's map. Matching from data needs the loaded models
(rotviz.match.pipeline)."""

from __future__ import annotations

from rotviz.errors import RotvizError
from rotviz.match.alternating import match_residual
from rotviz.match.layers import match_layers
from rotviz.match.options import MatchOptions
from rotviz.match.report import MatchResult
from rotviz.memo import TensorMemo
from rotviz.symmetry.view import ModelView
from rotviz.types import Progress


def match(
    anchor: ModelView,
    source: ModelView,
    options: MatchOptions | None = None,
    progress: Progress | None = None,
    memo: TensorMemo | None = None,
) -> MatchResult:
    """Match `source` onto `anchor`. Returns the matched view, the group element and a report.

    With `options.residual` the residual map is alternated with the per-layer maps
    (rotviz.match.alternating); activation and learned matching need data
    (rotviz.match.pipeline.match_models). `memo` serves repeated calls on partly unchanged
    views."""
    options = options or MatchOptions()
    if options.needs_data:
        raise RotvizError(f"matching [{options.label}] needs data: use "
                          "rotviz.match.pipeline.match_models(..., data=)")
    if options.residual:
        return match_residual(anchor, source, options, progress)
    return match_layers(anchor, source, options, progress, memo)

"""Which algorithm a choice of options runs: the per-layer maps alone (the seed paper), or
alternated with the residual stream's map. Matching from data needs the loaded models
(rotviz.match.pipeline)."""

from __future__ import annotations

from dataclasses import replace

from rotviz.errors import RotvizError
from rotviz.match.layers import match_layers
from rotviz.match.memo import TensorMemo
from rotviz.match.options import MatchOptions
from rotviz.match.report import MatchResult
from rotviz.match.residual import match_residual
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
    views. A matching that lowers nothing returns the source as it is (`kept_if_lower`)."""
    options = options or MatchOptions()
    if options.needs_data:
        raise RotvizError(f"matching [{options.label}] needs data: use "
                          "rotviz.match.pipeline.match_models(..., data=)")
    if options.residual:
        return kept_if_lower(source, match_residual(anchor, source, options, progress))
    return kept_if_lower(source, match_layers(anchor, source, options, progress, memo))


def kept_if_lower(source: ModelView, result: MatchResult) -> MatchResult:
    """`result`, or the source as it is (the identity element) when the solvers did not
    lower their objective: the squared distance to the anchor, taken on the canonical forms
    where the residual map was solved (rotviz.match.alternating), on the views otherwise.

    The identity is in every group, so this never loses anything. It matters where the
    optimum is the identity itself, as for a model matched onto itself: the solvers then
    return it only up to the roundoff of their float32 cross matrices (a Q-K rotation
    I + 1e-7, a scale 1 + 1e-7) and of the canonical forms' fold and unfold, which moves
    weights by an ulp or so (a distance of 1e-5 and a barrier of 4e-8 on the default
    pair's anchor). Returning the source itself makes a self-match exact: distance 0 and
    barrier 0."""
    report = result.report
    objective = (report.residual or {}).get("objective")
    before, after = ((objective[0], objective[-1]) if objective
                     else (report.before.total, report.after.total))
    if after < before:
        return result
    return MatchResult(source, {}, replace(report, after=report.before), residual=None)

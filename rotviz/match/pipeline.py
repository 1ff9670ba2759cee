"""Model-level matching: views in, matched state dict and checked report out."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rotviz.arch.spec import uses_alibi
from rotviz.data.split import Split
from rotviz.devices import pair_params, threads_for, wide_device
from rotviz.errors import RotvizError
from rotviz.match.datamatch import match_with_data
from rotviz.match.engine import match
from rotviz.match.options import MatchOptions
from rotviz.match.report import MatchReport, MatchResult
from rotviz.match.widths import check_pair, embed, refuse_narrower
from rotviz.match.widths import output_diff as embedded_output_diff
from rotviz.match.widths import stored_output_diff as embedded_stored_diff
from rotviz.sources.loading import HALF, Loaded, check_finite
from rotviz.sources.pairs import HeadsDiffer, heads_differ
from rotviz.sources.running import max_output_diff, stored_output_diff
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import ALIBI_HEADS
from rotviz.symmetry.element import Element, apply_element
from rotviz.symmetry.view import ModelView, read_view, write_state
from rotviz.types import Progress

# The largest logit change for which a transform counts as function-preserving, per dtype the
# check runs in.
# - float32 (every model; rotviz computes in float32 or float64): absolute. Every transform
#   in rotviz stays far below it (< 3e-5 on every family, see tests/).
# - float16, bfloat16 (a half checkpoint, run once more as it will be stored: source and
#   matched weights both rounded to that dtype, both run in it): relative to the largest
#   |logit| of the source run in that dtype, since rounding to 11 (fp16) or 8 (bf16)
#   significant bits moves every logit in proportion to its size. Measured, seed and weight
#   matching (--heads --residual), 2- and 8-layer random models of all six families and the
#   zoo's vit-digits and gpt2-pystdlib pairs cast to half: at most 0.0034 (fp16) and 0.033
#   (bf16) of that scale, about 4 units of roundoff (finfo.eps) either way. The tolerances
#   are about 12 units, a margin of 3 or more: 0.0125 and 0.1. A wrongly permuted FFN layer
#   moves the logits by 0.6 to 1.3 of the scale; finer errors are the float32 check's to catch.
FUNCTION_TOLERANCES: dict[torch.dtype, float] = {
    torch.float32: 1e-3,
    torch.float16: 0.0125,
    torch.bfloat16: 0.1,
}
FUNCTION_TOLERANCE = FUNCTION_TOLERANCES[torch.float32]  # the float32 check's, as a number


@dataclass
class Matched:
    """The matched source's state, the report, and the group element that moved the source
    (rotviz.symmetry.element: to move the source's fine-tunes alike, rotviz.match.lineage);
    None where no element describes the result (learned matching tunes the maps further)."""

    state: dict[str, torch.Tensor]
    report: MatchReport
    element: Element | None = None

    @property
    def preserved(self) -> bool:
        """Both checks pass: float32, and the checkpoint's own dtype where it is half."""
        return self.failure is None

    @property
    def failure(self) -> str | None:
        """What the function check found, in one line; None when the function is preserved."""
        return check_failure(self.report, "matched model")


def check_failure(r, what: str) -> str | None:
    """What a function check found, in one line, or None when it passed. `r` holds the check's
    numbers as MatchReport names them (max_output_diff, stored_dtype, stored_output_diff,
    stored_tolerance); `what` names the model checked."""
    if r.max_output_diff is None:
        return "the function check did not run"
    if not r.max_output_diff <= FUNCTION_TOLERANCE:  # NaN fails too
        return (f"{what} changes the function (max logit difference "
                f"{r.max_output_diff:.2e} > {FUNCTION_TOLERANCE:g})")
    if r.stored_output_diff is not None and not r.stored_output_diff <= r.stored_tolerance:
        return (f"{what} changes the function in {r.stored_dtype}, the checkpoint's "
                f"dtype (max logit difference {r.stored_output_diff:.2e} > "
                f"{r.stored_tolerance:.2e})")
    return None


def stored_check_words(report: MatchReport) -> str:
    """The CLI summary's words on the check in a half checkpoint's dtype (empty if none)."""
    if report.stored_dtype is None:
        return ""
    if report.stored_output_diff is None:
        return f" (not checked in {report.stored_dtype}: the source's own logits overflow in it)"
    return (f", {report.stored_output_diff:.2e} in {report.stored_dtype} "
            f"(tolerance {report.stored_tolerance:.2e})")


def view_of(loaded: Loaded, device: torch.device | str = "cpu"):
    return read_view(loaded.spec, loaded.config, loaded.state).to(device=device)


def check_in_stored_dtype(source: Loaded, state: dict[str, torch.Tensor],
                          report: MatchReport) -> None:
    """For a half checkpoint, fill the report's check in that dtype: `state` and the source,
    both rounded to it as they would be stored and run in it, on the usual probe inputs."""
    dtype = source.stored_dtype
    if dtype in HALF:
        record_stored_check(report, dtype, *stored_output_diff(source, state))


def record_stored_check(report, dtype: torch.dtype, diff: float,
                        scale: float) -> None:
    """Put the check in a half `dtype` into the report: the logit change `diff` and its
    tolerance, relative to the source's largest |logit| `scale` (none when that is not
    finite: the checkpoint itself overflows in `dtype`)."""
    report.stored_dtype = str(dtype).removeprefix("torch.")
    if math.isfinite(scale):
        report.stored_output_diff = diff
        report.stored_tolerance = FUNCTION_TOLERANCES[dtype] * scale


def match_models(
    anchor: Loaded,
    source: Loaded,
    options: MatchOptions | None = None,
    device: torch.device | str = "cpu",
    progress: Progress | None = None,
    data: str | Split | None = None,
    cancel: Callable[[], bool] | None = None,
    start: Matched | None = None,
) -> Matched:
    """Match `source` onto `anchor`; check on probe inputs that the function is preserved
    (in float32, and for a half checkpoint in its dtype too).

    A source whose FFN is narrower than the anchor's (all else equal) is first embedded into
    the anchor's width (rotviz.match.widths); the matched state then has the anchor's shapes,
    and the check compares it, run on the anchor's module, with the narrow source.

    Activation and learned matching (`options.act`, `options.learned`) read `data` (a data
    reference such as "digits", or a split read through the anchor); learned matching stops
    early when `cancel()` is true. `start` (learned matching without `act`): this pair's
    match with `options` less `learned`, already made; learned matching starts from it
    instead of solving it again (the symmetry ladder, rotviz.measures.ladder)."""
    narrower = check_pair(anchor, source, heads=True)
    options = options or MatchOptions()
    if options.heads and uses_alibi(source.spec, source.config):  # before any computing
        raise RotvizError(f"no head permutation on this {source.spec.family} model: "
                          f"{ALIBI_HEADS}")
    if options.residual:
        refuse_residual(anchor, source)
    if narrower and options.needs_data:
        refuse_narrower(f"[{options.label}] learns from the source's own activations, which "
                        "have its width", "use weight matching (e.g. --match seed or weight)")
    device = wide_device(device)  # the solvers work in float64, which MPS lacks
    # a small pair matches on one CPU thread, whoever asks (rotviz.devices.SMALL_PAIR: faster,
    # and the same answer from the command line, the app and the library)
    with threads_for(pair_params(anchor.state, source.state), device):
        return _match_models(anchor, source, options, device, progress, data, cancel, start,
                             narrower)


def _match_models(anchor: Loaded, source: Loaded, options: MatchOptions, device: torch.device,
                  progress: Progress | None, data: str | Split | None,
                  cancel: Callable[[], bool] | None, start: Matched | None,
                  narrower: bool) -> Matched:
    differ = heads_differ(anchor, source)
    if differ is not None:
        return _match_bodies(anchor, source, options, device, progress, differ)
    va, vs = view_of(anchor, device), view_of(source, device)
    embedding = None
    if narrower:  # into the anchor's width first (rectangular assignment), then as usual
        vs, embedding = embed(va, vs)
    if options.needs_data:
        begun = None if start is None else _result_of(source, start, device)
        result = match_with_data(anchor, va, vs, options, data, torch.device(device), progress,
                                 cancel, begun)
    else:
        result = match(va, vs, options, progress)
    state = {k: v.to("cpu") for k, v in write_state(result.view).items()}
    check_finite(state, "the matched model")
    if embedding is not None:
        result.report.widths = embedding.to_dict()
        result.report.max_output_diff = embedded_output_diff(anchor, source, state)
        stored = embedded_stored_diff(anchor, source, state)
        if stored is not None:
            record_stored_check(result.report, *stored)
        return Matched(state, result.report)
    result.report.max_output_diff = max_output_diff(source, source.state, state)
    check_in_stored_dtype(source, state, result.report)
    element = None if options.learned else element_of(result.transforms, result.residual, va)
    return Matched(state, result.report, element)


def refuse_residual(*models, views: tuple[ModelView, ...] | None = None) -> None:
    """One line where a model's head exposes its residual stream (rotviz.heads: a headless
    model's output is the stream), so that a residual map would change what it computes; with
    `views` (one per model), also where the model itself takes no residual map
    (`residual_unsupported`)."""
    from rotviz.heads import residual_refusal

    for k, m in enumerate(models):
        why = residual_refusal(m.config) if views is None else residual_unsupported(m, views[k])
        if why:
            raise RotvizError(f"residual matching is unavailable for {m.ref}: {why}")


def residual_unsupported(loaded: Loaded, view: ModelView | None = None) -> str | None:
    """Why residual maps cannot be used on `loaded` (its view `view`, read here when None):
    its head exposes the stream (rotviz.heads.residual_refusal), or its stream's ties and
    norms forbid them (rotviz.symmetry.residual.unsupported); None when they can."""
    from rotviz.heads import residual_refusal

    return residual_refusal(loaded.config) or rs.unsupported(
        view if view is not None else view_of(loaded))


def body_views(anchor: Loaded, source: Loaded, differ: HeadsDiffer,
               device: torch.device | str = "cpu") -> tuple[ModelView, ModelView]:
    """The views of the tensors both models hold (`differ.shared`: their body, and any head
    part they share), each read as a model of its own under the source's tensor names (a
    headless anchor's body is not under the root a headed source's is): what matching two
    models of one body under different heads compares."""
    def body(m: Loaded, names: tuple[str, ...]) -> ModelView:  # under the source's names
        state = {k: m.state[n] for k, n in zip(differ.shared, names, strict=True)}
        return read_view(m.spec, m.config, state).to(device=device)

    return body(anchor, differ.anchor_names or differ.shared), body(source, differ.shared)


def _match_bodies(anchor: Loaded, source: Loaded, options: MatchOptions, device: torch.device,
                  progress: Progress | None, differ: HeadsDiffer) -> Matched:
    """Match two models of one body under different heads: the element is found on the
    tensors both hold (`body_views`), then applied to the whole source, so that its own head
    moves with its body and its function is kept; the anchor's own head is left alone. The
    report says which tensors were matched (`report.different_heads`)."""
    if options.needs_data:
        raise RotvizError(
            f"the models have different heads ({differ.anchor_head or 'no head'} vs "
            f"{differ.source_head or 'no head'}), and [{options.label}] learns from both "
            "models' outputs; use weight matching (e.g. --match seed or weight)")
    whole = view_of(source, device)
    if options.residual:  # the whole models: a head only one holds may tie the stream
        refuse_residual(anchor, source, views=(view_of(anchor, device), whole))
    va, vs = body_views(anchor, source, differ, device)
    result = match(va, vs, options, progress)
    element = element_of(result.transforms, result.residual, va)
    state = {k: v.to("cpu") for k, v in write_state(apply_element(whole, element.to(device)))
             .items()}
    check_finite(state, "the matched model")
    result.report.different_heads = differ.to_dict()
    result.report.max_output_diff = max_output_diff(source, source.state, state)
    check_in_stored_dtype(source, state, result.report)
    return Matched(state, result.report, element)


def _result_of(source: Loaded, matched: Matched, device: torch.device | str) -> MatchResult:
    """A data-free match already made, as the engine returned it: the matched view (read
    back from its state: the view's round trip is exact), its element and its report."""
    if matched.element is None:
        raise ValueError("learned matching starts from a data-free match, which has an element")
    view = read_view(source.spec, source.config, matched.state).to(device=device)
    e = matched.element
    return MatchResult(view, dict(e.transforms), matched.report,
                       residual=None if e.residual is None else e.residual.to(device))


def element_of(transforms, residual: torch.Tensor | None, anchor: ModelView) -> Element:
    """The group element a matching found, on the CPU: its per-block maps, and its residual
    map with the anchor's gauge (the matched source is written in it) where there is one."""
    gauge = None if residual is None else rs.canonicalise(anchor)[1]
    return Element(dict(transforms), residual, gauge).to("cpu")

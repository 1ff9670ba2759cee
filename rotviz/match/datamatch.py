"""Matching from data: activation matching, and learned matching on top of a data-free start.

Activation matching (Git Re-Basin's, extended to the stream): run both models on the same
training examples; the residual map is the Procrustes solution of the summed cross-covariance
of their streams (at every block's input and before the final norm), and each FFN permutation
is the linear assignment that maximises the correlation of hidden units. Attention maps then
come from the weights, given those. Learned matching (rotviz.match.learned) starts from weight
matching, or from activation matching when `act` is also on (as `learned` alone has it).

Activations are read from a private copy of the anchor's module (hooks would otherwise touch
a module that other callers share).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from rotviz.data.inputs import to_device, token_mask, without_padding
from rotviz.data.reading import check_fits, split_for
from rotviz.data.split import Split
from rotviz.errors import RotvizError
from rotviz.groups import assign
from rotviz.match.alternating import check_residual
from rotviz.match.distances import distances
from rotviz.match.engine import match
from rotviz.match.layers import match_layers
from rotviz.match.learned import learn
from rotviz.match.options import MatchOptions
from rotviz.match.report import MatchReport, MatchResult
from rotviz.sources.adapters import call
from rotviz.sources.loading import Loaded, to_wide
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import LayerTransform, apply
from rotviz.symmetry.view import ModelView, read_view, write_state
from rotviz.types import Progress

Tensor = torch.Tensor
ACT_EXAMPLES = 256  # training examples (images, or 64-character windows) for activations


def _module_of(model: torch.nn.Module, prefix: str) -> torch.nn.Module:
    return model.get_submodule(prefix.rstrip("."))


def activations(loaded: Loaded, view: ModelView, split: Split, device: torch.device,
                batch_size: int = 64) -> tuple[list[Tensor], list[Tensor]]:
    """(streams, hidden): the stream entering every block and the final norm (pre-norm) or
    leaving the last block (post-norm), and every FFN's hidden activation, as (tokens, width)
    float64 matrices, for `view`'s weights evaluated on `split`."""
    module = copy.deepcopy(loaded.model).to(device)
    state = write_state(view)
    lay = view.layout
    streams: dict[int, list[Tensor]] = {}
    hidden: dict[int, list[Tensor]] = {}

    real: list[Tensor | None] = [None]  # the batch's real-token mask (None: no padding)

    def keep(store: dict, k: int):
        def hook(_mod, args, kwargs, *out):
            x = out[0] if out else (args[0] if args else next(iter(kwargs.values())))
            x = without_padding((x[0] if isinstance(x, tuple) else x).detach(), real[0])
            store.setdefault(k, []).append(to_wide(x).reshape(-1, x.shape[-1]).cpu())
        return hook

    n = len(lay.blocks)
    for i, prefix in enumerate(lay.blocks):
        _module_of(module, prefix).register_forward_pre_hook(keep(streams, i), with_kwargs=True)
        ffn_out = _module_of(module, prefix + lay.roles["ffn_out"])
        ffn_out.register_forward_pre_hook(keep(hidden, i), with_kwargs=True)
    if view.spec.placement == "pre" and lay.final_norm is not None:
        _module_of(module, lay.final_norm).register_forward_pre_hook(keep(streams, n),
                                                                     with_kwargs=True)
    else:
        _module_of(module, lay.blocks[-1]).register_forward_hook(keep(streams, n),
                                                                 with_kwargs=True)
    names = set(dict(module.named_parameters())) | set(dict(module.named_buffers()))
    params = {k: v.to(device) for k, v in state.items() if k in names}
    with torch.no_grad():
        for x, _ in split.subset(min(split.n, ACT_EXAMPLES)).batches(batch_size):
            x = to_device(x, device)
            real[0] = token_mask(x)
            call(loaded.spec, module, params, x)
    return ([torch.cat(streams[k]) for k in sorted(streams)],
            [torch.cat(hidden[k]) for k in sorted(hidden)])


def _corr(a: Tensor, b: Tensor) -> Tensor:
    """Correlation of every column of a with every column of b."""
    a = (a - a.mean(0)) / (a.std(0) + 1e-8)
    b = (b - b.mean(0)) / (b.std(0) + 1e-8)
    return a.t() @ b / len(a)


def match_activations(anchor: Loaded, anc_c: ModelView, src_c: ModelView, options: MatchOptions,
                      group: str | None, split: Split, device: torch.device,
                      ) -> tuple[ModelView, dict[int, LayerTransform], Tensor | None, dict]:
    """Residual map and FFN permutations from activations (canonical forms), then attention
    maps from weights. Returns the moved canonical source, the per-layer maps, Q and a report."""
    layers = options.layers if options.layers is not None else range(len(anc_c.blocks))
    sa, ha = activations(anchor, anc_c, split, device)
    ss, hs = activations(anchor, src_c, split, device)
    info: dict = {"data": split.data, "split": split.split, "examples": min(split.n, ACT_EXAMPLES)}
    q = None
    if options.residual and group is not None:
        c = sum(s.t() @ a for s, a in zip(ss, sa, strict=True))
        q = rs.solve(c.to(device), group)
        src_c = rs.apply_residual(src_c, q.to(src_c.blocks[0].attn.wq), check=False)
        info["residual_angles"] = rs.angles(q, group)
    transforms: dict[int, LayerTransform] = {}
    if options.ffn:
        corr_before, corr_after = [], []
        for i in layers:
            c = _corr(hs[i], ha[i])
            perm = assign(c.numpy())
            corr_before.append(float(c.diagonal().mean()))
            corr_after.append(float(c[perm, torch.arange(len(perm))].mean()))
            transforms[i] = LayerTransform(perm=perm)
        src_c = apply(src_c, transforms)
        info["ffn_corr_before"], info["ffn_corr_after"] = corr_before, corr_after
    if options.attn or options.rescale:
        step = match_layers(anc_c, src_c, replace(options, ffn=False, residual=False, act=False,
                                           learned=False))
        src_c = step.view
        for i, t in step.transforms.items():
            transforms[i] = transforms[i].then(t) if i in transforms else t
    return src_c, transforms, q, info


def as_written(loaded: Loaded, view: ModelView, device: torch.device) -> ModelView:
    """`view` as its state dict reads back (the same numbers in read_view's layout): how a
    start made earlier reaches learned matching (rotviz.match.pipeline writes the matched
    state and reads it back), so that a start made here is canonicalised bit for bit the
    same (the layout alone moves the canonical forms by float32 roundoff)."""
    return read_view(loaded.spec, loaded.config, write_state(view)).to(device=device)


def match_with_data(anchor: Loaded, anchor_view: ModelView, source_view: ModelView,
                    options: MatchOptions, data: str | Split | None, device: torch.device,
                    progress: Progress | None = None,
                    cancel: Callable[[], bool] | None = None,
                    start: MatchResult | None = None) -> MatchResult:
    """Activation and/or learned matching (`options.act`, `options.learned`) on `data`'s
    training split (learned matching stops early on its validation split). `data` is a data
    reference, read the way the anchor reads it, or a split read that way (its reading, e.g.
    the columns of a CSV, carries over to the training split).

    `start`: the matching learned matching starts from (these views matched with `options`
    less `learned`: activation matching with `act`, else the data-free matching), when the
    caller has already made it (the symmetry ladder matches `act` just before `learned`); it
    is then not solved again. The result is the same: learned matching starts from the
    canonical form of the start's matched view either way."""
    if not data:
        raise RotvizError(
            f"matching [{options.label}] learns from data: give a data reference (--data)"
        )

    t0 = time.perf_counter()
    train = data.sibling("train") if isinstance(data, Split) else split_for(anchor, data, "train")
    check_fits(anchor, train)  # one line for data the model cannot read, before any work
    group = check_residual(source_view, options) if options.residual else None

    def canonical(view: ModelView) -> tuple[ModelView, rs.Gauge]:
        """Canonical forms only where the residual map needs them (a tied head has none)."""
        return rs.canonicalise(view) if group is not None else (view, rs.Gauge({}, {}))

    anc_c, gauge = canonical(anchor_view)
    before_learning = replace(options, learned=False)  # what learned matching starts from
    report_extra: dict = {}
    if start is not None:
        if replace(start.report.options, learn=before_learning.learn) != before_learning:
            raise ValueError(f"learned matching [{options.label}] starts from "
                             f"[{before_learning.label}], not [{start.report.options.label}]")
        if options.act:
            report_extra["act"] = start.report.act
    elif options.act:
        src_c, _ = canonical(source_view)
        if progress:
            progress(0, 1, "activations")
        src_c, transforms, q, report_extra["act"] = match_activations(
            anchor, anc_c, src_c, options, group, train, device)
        start = MatchResult(as_written(anchor, rs.restore(src_c, gauge), device), transforms,
                            None, residual=q)
    else:
        start = match(anchor_view, source_view, before_learning, progress)
    if not options.act:
        report_extra["residual"] = start.report.residual if start.report else None
    layers_rep = start.report.layers if start.report and not options.act else []
    view = start.view
    if options.learned:
        src_c, _ = canonical(start.view)
        val = train.sibling("val")
        tuned, info = learn(anchor, anc_c, src_c, group, train, val, options.learn, device,
                            progress, cancel)
        view = rs.restore(tuned.to(anchor_view.blocks[0].attn.wq.dtype,
                                   anchor_view.blocks[0].attn.wq.device), gauge)
        report_extra["learned"] = info.to_dict()
    before, after = distances(source_view, anchor_view), distances(view, anchor_view)
    report = MatchReport(options, before, after, layers_rep, **report_extra)
    report.seconds = time.perf_counter() - t0
    return MatchResult(view, start.transforms, report, residual=start.residual)

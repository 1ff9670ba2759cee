"""Weight matching with the residual stream: alternate the per-layer maps and the residual map.

The residual map acts on the other side of every matrix than the FFN and head maps, so each
is solved exactly given the others: per-layer maps (the seed paper's) on the canonical forms,
then the residual map, and again, until a round gains less than `options.tol` of the starting
objective. With head permutation on, a second phase then alternates with it too: assigning
heads before the stream is aligned locks in poor choices (on the default pair, barrier 2.44
against 1.65 when heads join after convergence). Every step includes the identity among its choices,
so the objective (squared distance to the anchor) never goes up; the report keeps its history.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from rotviz import residual as rs
from rotviz.actions import LayerTransform
from rotviz.distances import distances
from rotviz.errors import RotvizError
from rotviz.matching import MatchOptions, MatchReport, MatchResult, Progress, match
from rotviz.memo import TensorMemo
from rotviz.view import ModelView


def objective(src: ModelView, anc: ModelView, memo: TensorMemo | None = None) -> float:
    """The squared Euclidean distance that weight matching minimises."""
    return distances(src, anc, memo=memo).total ** 2


def check_residual(view: ModelView, options: MatchOptions) -> str:
    """The residual group to use here, or a one-line error saying what is allowed."""
    why = rs.unsupported(view)
    if why:
        raise RotvizError(f"residual matching is unavailable for {view.spec.family}: {why}")
    return rs.check_group(view, options.residual_group)


def match_residual(anchor: ModelView, source: ModelView, options: MatchOptions,
                   progress: Progress | None = None) -> MatchResult:
    """Weight matching with per-layer maps and the residual map, alternated (see module)."""
    t0 = time.perf_counter()
    group = check_residual(source, options)
    anc_c, gauge = rs.canonicalise(anchor)
    src_c, _ = rs.canonicalise(source)
    per_layer = options.ffn or options.attn or options.rescale
    # Head assignments made before the stream is aligned lock in poor choices, so with heads
    # on, a first phase alternates without them until it converges, then a second with them.
    phases = [replace(options, residual=False, heads=False)]
    if options.heads:
        phases.append(replace(options, residual=False))
    # Rounds re-solve subproblems whose tensors often did not change (units that stayed put,
    # a residual permutation that came out the identity): the memo makes those look-ups.
    memo = TensorMemo()
    history = [objective(src_c, anc_c, memo)]
    q_total: torch.Tensor | None = None
    transforms: dict[int, LayerTransform] = {}
    first = None
    rounds: list[int] = []
    total = options.rounds * len(phases)
    for k, inner in enumerate(phases):
        rounds.append(0)
        for r in range(options.rounds):
            start = history[-1]
            done = k * options.rounds + r
            if progress:
                progress(done, total, f"round {r + 1}{' (heads)' if k else ''}: per-layer maps")
            if per_layer:
                step = match(anc_c, src_c, inner, memo=memo)
                first = first or step
                src_c = step.view
                for i, t in step.transforms.items():
                    transforms[i] = transforms[i].then(t) if i in transforms else t
                history.append(step.report.after.total ** 2)
            if progress:
                progress(done, total, f"round {r + 1}{' (heads)' if k else ''}: residual map")
            q = rs.solve(rs.cross(src_c, anc_c, memo), group)
            if not torch.equal(q, torch.eye(len(q), dtype=q.dtype, device=q.device)):
                src_c = rs.apply_residual(src_c, q.to(src_c.blocks[0].attn.wq), check=False)
            q_total = q if q_total is None else q_total @ q
            history.append(objective(src_c, anc_c, memo))
            rounds[-1] = r + 1
            if start - history[-1] <= options.tol * history[0]:
                break
    if progress:
        progress(total, total, "done")
    view = rs.restore(src_c, gauge)
    before = distances(source, anchor)
    after = distances(view, anchor)
    layers = first.report.layers if first is not None else []
    for rep in layers:  # what the whole element does, not just its first round
        t = transforms.get(rep.layer)
        if t is not None and t.perm is not None:
            rep.ffn_moved = int((t.perm != torch.arange(len(t.perm))).sum())
        if t is not None and t.heads is not None:
            rep.head_perm = t.heads.tolist()
    info = {
        "group": group,
        "rounds": sum(rounds),
        "phase_rounds": rounds,  # without head permutation, then with it (when on)
        "objective": history,  # squared canonical distance after each step
        "distance_canonical_before": history[0] ** 0.5,
        "distance_canonical_after": history[-1] ** 0.5,
        "angles": rs.angles(q_total, group) if q_total is not None else [],
        "moved": int((q_total.diagonal() < 0.5).sum()) if group == "permutation" else None,
    }
    report = MatchReport(options, before, after, layers, residual=info)
    report.seconds = time.perf_counter() - t0
    return MatchResult(view, transforms, report, residual=q_total)

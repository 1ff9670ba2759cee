"""Weight matching with the residual stream: alternate the per-layer maps and the residual map.

The residual map acts on the other side of every matrix than the FFN and head maps, so each
is solved exactly given the others: per-layer maps (the seed paper's) on the canonical forms,
then the residual map, and again, until a round gains less than `options.tol` of the starting
objective. With head permutation on, a second phase then alternates with it too: assigning
heads before the stream is aligned locks in poor choices (a higher barrier than when heads
join after convergence: bench/RESULTS.md). Every step includes the identity among its
choices, so the objective (squared distance to the anchor) never goes up; the report keeps
its history.

On large models the FFN solve (an m x m cost matrix per layer) is most of a round and, once
the units are in place, often moves none. With `options.ffn_backoff`, rounds then hold the
FFN maps and re-solve the rest, a fraction of a round, and the FFN solve comes back after 1,
2, 4, ... rounds and whenever the rest settles; a phase ends only on a round that solved
everything. It is off by default: it reaches a different local optimum (bench/weight.py).

The rounds (`alternate`) run on a state that holds the two canonical models: in memory here,
or read block by block from the checkpoints (rotviz.stream.residual), one pass per round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from rotviz.errors import RotvizError
from rotviz.match.distances import distances
from rotviz.match.layers import match_layers
from rotviz.match.options import MatchOptions
from rotviz.match.report import HeadReport, MatchReport, MatchResult
from rotviz.memo import TensorMemo
from rotviz.memory import release
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import LayerTransform
from rotviz.symmetry.view import ModelView
from rotviz.types import Progress


def objective(src: ModelView, anc: ModelView, memo: TensorMemo | None = None) -> float:
    """The squared Euclidean distance that weight matching minimises."""
    return distances(src, anc, memo=memo).total ** 2


def ended_by_cap(info: dict) -> bool:
    """Whether a report's residual info (`MatchReport.residual`) says the round cap, not
    the tolerance, ended some phase of the alternation."""
    return not all(info.get("converged", [True]))


def check_residual(view: ModelView, options: MatchOptions) -> str:
    """The residual group to use here, or a one-line error saying what is allowed."""
    why = rs.unsupported(view)
    if why:
        raise RotvizError(f"residual matching is unavailable for {view.spec.family}: {why}")
    return rs.check_group(view, options.residual_group)


@dataclass
class Step:
    """One round's per-layer maps: the new maps, the chosen layers' reports and the
    objective after them."""

    transforms: dict[int, LayerTransform]
    layers: list[HeadReport]
    objective: float


class State(Protocol):
    """The two canonical models an alternation works on (in memory, or streamed)."""

    def initial(self) -> float:
        """The objective before the first step (known once a step or turn has run)."""

    def layers(self, options: MatchOptions, full: bool) -> Step:
        """Solve and apply the per-layer maps of `options` (`full`: a round that solves the
        FFN maps, which first catch up with the residual map when they lag behind it)."""

    def turn(self, group: str, settle: bool) -> tuple[torch.Tensor, float]:
        """Solve the residual map, apply it and return it with the objective after it
        (`settle`: the FFN tensors follow it now rather than lag behind)."""


@dataclass
class Alternated:
    """What the rounds found: per-layer maps (composed), the residual map, the first
    round's per-layer reports and the run's residual info for the report."""

    transforms: dict[int, LayerTransform]
    residual: torch.Tensor | None
    layers: list[HeadReport]
    info: dict


def alternate(state: State, options: MatchOptions, group: str,
              progress: Progress | None = None,
              on_round: Callable[[int, int], None] | None = None) -> Alternated:
    """The rounds and phases of the alternation (see module) on `state`. `on_round(phase,
    round)` is called after each round (phase 0 without head permutation, 1 with it; rounds
    from 1), while the state holds that round's result."""
    per_layer = options.ffn or options.attn or options.rescale
    # Head assignments made before the stream is aligned lock in poor choices, so with heads
    # on, a first phase alternates without them until it converges, then a second with them.
    phases = [replace(options, residual=False, heads=False)]
    if options.heads:
        phases.append(replace(options, residual=False))
    history: list[float] = []
    q_total: torch.Tensor | None = None
    transforms: dict[int, LayerTransform] = {}
    first: Step | None = None
    rounds: list[int] = []
    total = options.rounds * len(phases)
    # The FFN solve costs the most (an m x m cost matrix per layer). While it moves units it
    # runs every round; after a solve that moves none it waits 1, then 2, 4, ... rounds
    # (back to every round once it moves units again), and always runs in the round after
    # the others settle, which only then may end the phase. Meanwhile the FFN tensors may lag
    # behind the residual map (the state's business).
    others = options.attn or options.rescale
    held = 0
    converged: list[bool] = []  # per phase: ended by a round gaining < tol (not the cap)

    def record(value: float) -> None:
        if not history:
            history.append(state.initial())
        history.append(value)

    for k, inner in enumerate(phases):
        rounds.append(0)
        converged.append(False)
        wait_next, waiting = 1, 0
        for r in range(options.rounds):
            start = history[-1] if history else None
            done = k * options.rounds + r
            full = waiting == 0 or not (options.ffn and others and options.ffn_backoff)
            held += not full
            step_options = inner if full else replace(inner, ffn=False)
            tag = f"round {r + 1}{' (heads)' if k else ''}{'' if full else ' (FFN held)'}"
            if progress:
                progress(done, total, f"{tag}: per-layer maps")
            if per_layer:
                step = state.layers(step_options, full)
                if full and options.ffn:  # back off while the units stay put
                    moved = any(rep.ffn_moved for rep in step.layers)
                    waiting, wait_next = (0, 1) if moved else (wait_next, 2 * wait_next)
                elif waiting:
                    waiting -= 1
                first = first or step
                for i, t in step.transforms.items():
                    transforms[i] = transforms[i].then(t) if i in transforms else t
                record(step.objective)
            if progress:
                progress(done, total, f"{tag}: residual map")
            q, value = state.turn(group, settle=not options.ffn_backoff)
            q_total = q if q_total is None else q_total @ q
            record(value)
            start = history[0] if start is None else start
            rounds[-1] = r + 1
            if on_round is not None:
                on_round(k, r + 1)
            settled = start - history[-1] <= options.tol * history[0]
            if settled and full:
                converged[-1] = True
                break
            if settled:
                waiting = 0
    if progress:
        progress(total, total, "done")
    layers = first.layers if first is not None else []
    describe(layers, transforms)
    info = {
        "group": group,
        "rounds": sum(rounds),
        "phase_rounds": rounds,  # without head permutation, then with it (when on)
        "converged": converged,  # per phase: False where the round cap ended it
        "ffn_held": held,  # rounds that held the FFN maps (options.ffn_backoff)
        "objective": history,  # squared canonical distance after each step
        "distance_canonical_before": history[0] ** 0.5,
        "distance_canonical_after": history[-1] ** 0.5,
        "angles": rs.angles(q_total, group) if q_total is not None else [],
        "moved": int((q_total.diagonal() < 0.5).sum()) if group == "permutation" else None,
    }
    return Alternated(transforms, q_total, layers, info)


def describe(layers: list[HeadReport], transforms: dict[int, LayerTransform]) -> None:
    """Put into the first round's per-layer reports what the whole element does: units
    moved and head order (the rest of each report describes that round)."""
    for rep in layers:
        t = transforms.get(rep.layer)
        if t is not None and t.perm is not None:
            rep.ffn_moved = int((t.perm != torch.arange(len(t.perm))).sum())
        if t is not None and t.heads is not None:
            rep.head_perm = t.heads.tolist()


# (phase, round, the matched source after it): rotviz.analysis.rounds measures each round
RoundHook = Callable[[int, int, Callable[[], ModelView]], None]


def match_residual(anchor: ModelView, source: ModelView, options: MatchOptions,
                   progress: Progress | None = None,
                   on_round: RoundHook | None = None) -> MatchResult:
    """Weight matching with per-layer maps and the residual map, alternated (see module).
    `on_round(phase, round, matched)` after each round: `matched()` builds the source as
    matched so far (in the anchor's gauge, a new view: nothing of it is kept here)."""
    t0 = time.perf_counter()
    group = check_residual(source, options)
    state = _InMemory(anchor, source)
    hook = None if on_round is None else (lambda k, r: on_round(k, r, state.snapshot))
    out = alternate(state, options, group, progress, hook)
    view = state.finish()
    before = distances(source, anchor)
    after = distances(view, anchor)
    report = MatchReport(options, before, after, out.layers, residual=out.info)
    report.seconds = time.perf_counter() - t0
    return MatchResult(view, out.transforms, report, residual=out.residual)


# layers per match_layers call in a round's per-layer step (_InMemory.layers)
CHUNK = 4


class _InMemory:
    """Both canonical models held whole. Rounds re-solve subproblems whose tensors often did
    not change (units that stayed put, a residual permutation that came out the identity):
    a memo makes those look-ups.

    Memory: the source's canonical form is rotviz's own, so a step that replaces its tensors
    lets the old ones go as it goes (`_settle`, block by block) rather than holding a second
    copy of every FFN, and each step ends by handing freed heap pages back to the system
    (rotviz.memory.release): without that, glibc keeps the fragments of every round's
    copies and the process grew by about a model's size a round (bench/RESULTS.md, `weight`)."""

    def __init__(self, anchor: ModelView, source: ModelView):
        self.anc_c, self.gauge = rs.canonicalise(anchor)
        self.src_c, _ = rs.canonicalise(source)
        self.memo = TensorMemo()
        self.lazy = _LazyFFN(self.anc_c, self.memo)
        self._initial = objective(self.src_c, self.anc_c, self.memo)

    def initial(self) -> float:
        return self._initial

    def layers(self, options: MatchOptions, full: bool) -> Step:
        """The per-layer maps, solved and applied CHUNK layers at a time: each call's new
        blocks replace the old ones before the next call, so the step holds a few layers'
        copies rather than a second source. The maps of a layer depend on that layer alone,
        and the memo serves the distances of the layers done, so the result is the same as
        one call's."""
        if full:
            self._settle()
        todo = (options.layers if options.layers is not None
                else tuple(range(self.src_c.dims.n_layers)))
        transforms: dict[int, LayerTransform] = {}
        reports: list[HeadReport] = []
        after = None
        for k in range(0, max(len(todo), 1), CHUNK):
            part = replace(options, layers=tuple(todo[k:k + CHUNK]))
            step = match_layers(self.anc_c, self.src_c, part, memo=self.memo)
            self.src_c = step.view
            transforms.update(step.transforms)
            reports += step.report.layers
            after = step.report.after.total
            del step
        release()
        return Step(transforms, reports, self.lazy.objective(self.src_c, after ** 2))

    def turn(self, group: str, settle: bool) -> tuple[torch.Tensor, float]:
        q = rs.solve(self.lazy.cross(self.src_c), group)
        if not torch.equal(q, torch.eye(len(q), dtype=q.dtype, device=q.device)):
            self.src_c = self.lazy.turn(self.src_c, q)
            if settle:
                self._settle()
        value = self.lazy.objective(self.src_c, objective(self.src_c, self.anc_c, self.memo))
        release()
        return q, value

    def _settle(self) -> None:
        """The pending map applied to the FFN and norm tensors (`_LazyFFN.settle`), one block
        at a time: each block's old tensors are freed as its new ones are made, unless
        something else still holds the old view (it is never changed)."""
        q = self.lazy.pending
        if q is None:
            return
        blocks = list(self.src_c.blocks)
        self.src_c = replace(self.src_c, blocks=())
        q = q.to(blocks[0].attn.wq)
        for i, blk in enumerate(blocks):
            one = rs.apply_residual(replace(self.src_c, blocks=(blk,)), q, check=False,
                                    which="ffn")
            blocks[i] = one.blocks[0]
        self.src_c = replace(self.src_c, blocks=tuple(blocks))
        self.lazy.pending = None

    def snapshot(self) -> ModelView:
        """The source as matched so far, in the anchor's gauge, leaving the state as it is
        (the pending FFN map applied to a new view)."""
        src, q = self.src_c, self.lazy.pending
        if q is not None:
            src = rs.apply_residual(src, q.to(src.blocks[0].attn.wq), check=False, which="ffn")
        return rs.restore(src, self.gauge)

    def finish(self) -> ModelView:
        """The matched source, its FFN tensors caught up, in the anchor's gauge. The state is
        spent: the anchor's canonical form and the memo are let go before the source is put
        back into the anchor's gauge (a copy of the tensors that gauge touches)."""
        self._settle()
        src = self.src_c
        self.src_c = self.anc_c = self.lazy = self.memo = None
        release()
        return rs.restore(src, self.gauge)


class _LazyFFN:
    """The residual map applied to every tensor but the blocks' FFN and norm groups, which
    keep a pending map P instead: their tensors X stand for X P. Their part of the cross term
    is then P^T M (M summed once, from the tensors as they are) and their part of the squared
    distance exceeds the stored one by 2 tr((I - P)^T M), both exact for orthogonal P."""

    def __init__(self, anchor: ModelView, memo: TensorMemo):
        self.anchor, self.memo = anchor, memo
        self.pending: torch.Tensor | None = None

    def _m(self, src: ModelView) -> torch.Tensor:
        return rs.cross(src, self.anchor, self.memo, which="ffn")

    def cross(self, src: ModelView) -> torch.Tensor:
        if self.pending is None:
            return rs.cross(src, self.anchor, self.memo)
        rest = rs.cross(src, self.anchor, self.memo, which="rest")
        m = self._m(src)
        return rest + self.pending.t() @ m

    def objective(self, src: ModelView, stored: float) -> float:
        """The objective of what `src` stands for, from `stored`, that of its tensors."""
        if self.pending is None:
            return stored
        eye = torch.eye(len(self.pending), dtype=self.pending.dtype, device=self.pending.device)
        return stored + 2.0 * float(((eye - self.pending) * self._m(src)).sum())

    def turn(self, src: ModelView, q: torch.Tensor) -> ModelView:
        out = rs.apply_residual(src, q.to(src.blocks[0].attn.wq), check=False, which="rest")
        self.pending = q if self.pending is None else self.pending @ q
        return out

    def settle(self, src: ModelView) -> ModelView:
        """`src` with the pending map applied to its FFN and norm tensors."""
        if self.pending is None:
            return src
        out = rs.apply_residual(src, self.pending.to(src.blocks[0].attn.wq), check=False,
                                which="ffn")
        self.pending = None
        return out

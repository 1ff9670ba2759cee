"""Weight matching in memory: both canonical models held whole, the rounds of
rotviz.match.alternating run on them (the same rounds run at size in
rotviz.match.at_size_residual, one pass over the blocks per round).

Rounds re-solve subproblems whose tensors often did not change (units that stayed put, a
residual permutation that came out the identity): a memo (rotviz.match.memo) makes those
look-ups.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

import torch

from rotviz.match.alternating import Step, alternate, check_residual, objective
from rotviz.match.distances import distances
from rotviz.match.layers import match_layers
from rotviz.match.memo import TensorMemo
from rotviz.match.options import MatchOptions
from rotviz.match.report import HeadReport, MatchReport, MatchResult
from rotviz.memory import release
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import LayerTransform, apply_layer
from rotviz.symmetry.view import ModelView
from rotviz.types import Progress

T = TypeVar("T")

RoundHook = Callable[[int, int, Callable[[], ModelView]], None]


def match_residual(anchor: ModelView, source: ModelView, options: MatchOptions,
                   progress: Progress | None = None,
                   on_round: RoundHook | None = None,
                   replay: Sequence[int] | None = None) -> MatchResult:
    """Weight matching with per-layer maps and the residual map, alternated (see module).
    `on_round(phase, round, matched)` after each round: `matched()` builds the source as
    matched so far (in the anchor's gauge, a new view: nothing of it is kept here).
    `replay`: the rounds per phase of a run its time limit stopped, for the clock's stop
    (rotviz.match.alternating.alternate)."""
    t0 = time.perf_counter()
    group = check_residual(source, options)
    state = _InMemory(anchor, source)
    hook = None if on_round is None else (lambda k, r: on_round(k, r, state.snapshot))
    out = alternate(state, options, group, progress, hook, replay)
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
        self.source = source
        self.src_c, _ = rs.canonicalise(source)
        self.memo = TensorMemo()
        self.lazy = _LazyFFN(self.anc_c, self.memo)
        self._initial = objective(self.src_c, self.anc_c, self.memo)
        # the composed maps, from which the result is rebuilt: the tensors held are turned
        # at every step, and a hundred joint steps leave float32 roundoff of 1e-5 in them
        self.maps: dict[int, LayerTransform] = {}
        self.q: torch.Tensor | None = None

    def _compose(self, transforms: dict[int, LayerTransform]) -> None:
        for i, t in transforms.items():
            self.maps[i] = self.maps[i].then(t) if i in self.maps else t

    def _turned(self, q: torch.Tensor) -> None:
        self.q = q if self.q is None else self.q @ q

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
        self._compose(transforms)
        release()
        return Step(transforms, reports, self.lazy.objective(self.src_c, after ** 2))

    def turn(self, group: str, settle: bool) -> tuple[torch.Tensor, float]:
        q = rs.solve(self.lazy.cross(self.src_c), group)
        self._turned(q)
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

    def cross(self) -> torch.Tensor:
        return self.lazy.cross(self.src_c)

    def move(self, q: torch.Tensor) -> None:
        self._turned(q)
        if not torch.equal(q, torch.eye(len(q), dtype=q.dtype, device=q.device)):
            self.src_c = self.lazy.turn(self.src_c, q)

    def save(self) -> object:
        # views are never changed in place
        return self.src_c, self.lazy.pending, dict(self.maps), self.q

    def load(self, saved: object) -> None:
        self.src_c, self.lazy.pending, maps, self.q = saved  # type: ignore[misc]
        self.maps = dict(maps)

    def agree(self, decision: T) -> T:
        return decision  # one process

    def _rebuilt(self) -> ModelView:
        """The source as matched so far, in the anchor's gauge: the composed maps applied
        once to its canonical form (as the path at size does), the state left as it is."""
        src, _ = rs.canonicalise(self.source)
        for i, t in sorted(self.maps.items()):
            src = apply_layer(src, i, t)
        if self.q is not None:
            src = rs.apply_residual(src, self.q.to(src.blocks[0].attn.wq), check=False)
        return rs.restore(src, self.gauge)

    def snapshot(self) -> ModelView:
        """The source as matched so far, in the anchor's gauge, leaving the state as it is."""
        return self._rebuilt()

    def finish(self) -> ModelView:
        """The matched source, in the anchor's gauge (`_rebuilt`: the composed maps applied
        once). The state is spent: the canonical forms, the lazy FFN state and the memo are let
        go first, so that the rebuilt copy does not sit beside them."""
        self.src_c = self.anc_c = self.lazy = self.memo = None
        release()
        return self._rebuilt()


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

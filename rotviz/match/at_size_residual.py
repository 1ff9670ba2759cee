"""Weight matching (the residual map, alternated with the per-layer maps) on checkpoints
larger than memory: one pass over the blocks per round.

Each round of the alternation (rotviz.match.alternating) needs every block's per-layer maps,
then the d x d cross term of the whole model for the residual map. One pass gives both:
block i of each checkpoint is read, put in canonical form (gains folded into readers,
writers centred: both local to the block), brought to the current state by the maps found so
far (its composed per-layer map, then the composed residual map), solved, and its cross term
added to the sum. Only the maps are kept between passes, so a pass holds a few blocks. The
tensors outside the blocks (embeddings, output head, final norm) are read in float32 at the
start and the end only: their cross term and distance at a residual map Q follow from Q alone
(X Q against A gives Q^T X^T A), so the largest tensors are never turned until the end. A
last pass writes the matched blocks, put into the anchor's gauge, in the checkpoint's dtypes.

Under torchrun the ranks take the blocks round-robin. The cross terms are summed in block
order on every rank (rotviz.dist.Group.ordered_sum), and rank 0 solves the residual map and
shares it with the objective, so N processes compute the bits of one.

The in-memory alternation turns the tensors it holds each round; here each pass applies the
composed maps to the stored weights, and the objective after a residual step comes from the
cross term (exact for orthogonal maps) rather than from the turned tensors. The two paths
differ by float32 roundoff, about 1e-7 of each tensor's scale (tests/test_streaming.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import torch

from rotviz.atsize.blocks import (
    Streamed,
    as_stored,
    block_tensors,
    open_writer,
    read_block_view,
    write_block_tensors,
    write_config,
)
from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.match.alternating import Step, alternate, check_residual, describe
from rotviz.match.at_size_checks import Dtype, check_function, kind_cells, rest_cells
from rotviz.match.distances import Distances, distances, squared_distance
from rotviz.match.layers import match_layers
from rotviz.match.options import MatchOptions
from rotviz.match.report import HeadReport, MatchReport
from rotviz.memory import release
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import LayerTransform, apply_layer
from rotviz.symmetry.kinds import kind_of
from rotviz.symmetry.view import Layout, ModelView
from rotviz.types import Progress

T = TypeVar("T")

Tensor = torch.Tensor


# A tensor outside the blocks this large (embeddings, output heads: rows in the stream) is
# read, canonicalised, turned and written in slices of rows of about this many elements.
SLICE = 1 << 22


def large_rest(model: Streamed) -> tuple[str, ...]:
    """The tensors outside the blocks handled in row slices: floating, 2-D with the stream
    on the last axis, at least SLICE elements, a writer (not a projection) or a reader's
    weight, and in no tie (a tied pair is read whole, as one tensor)."""
    lay, spec, d = model.layout, model.spec, model.dims.d_model
    tied = {n for pair in model.tied for n in pair}
    out = []
    for n in model.rest:
        e = model.checkpoint.entries[n]
        if (not e.dtype.is_floating_point or len(e.shape) != 2 or e.shape[1] != d
                or math.prod(e.shape) < SLICE or n in tied):
            continue
        projection = any(n.endswith(f"{p}.weight") for p in spec.projections)
        reader = n.endswith(".weight") and n.rsplit(".", 1)[0] in lay.readers
        if (n in lay.writers and not projection) or reader:
            out.append(n)
    for alias, owner in model.spec.tied:  # untied by the config but equal: tied in memory
        if alias in out and owner in out and _equal(model, alias, owner):
            out = [n for n in out if n not in (alias, owner)]
    return tuple(out)


def _equal(model: Streamed, x: str, y: str) -> bool:
    rows = model.checkpoint.entries[x].shape[0]
    step = max(1, SLICE // model.dims.d_model)
    return model.checkpoint.entries[y].shape == model.checkpoint.entries[x].shape and all(
        torch.equal(model.checkpoint.read_rows(x, lo, lo + step),
                    model.checkpoint.read_rows(y, lo, lo + step))
        for lo in range(0, rows, step))


def rest_part(model: Streamed, names: list[str], device: torch.device | str = "cpu",
              rows: tuple[int, int] | None = None, large: tuple[str, ...] = ()) -> ModelView:
    """A view with no blocks of the named tensors outside the blocks, in float32, those in
    `large` only their `rows`; a tie the file leaves out (an output head that is the
    embedding) is the owner's tensor, as in a loaded model's state dict. Its layout names
    only the writers and readers present, so canonical forms, turns and restores apply to
    what it holds."""
    other = {}
    for n in names:
        if n in large and rows is not None:
            t = model.checkpoint.read_rows(n, rows[0], rows[1], torch.float32)
        else:
            t = model.checkpoint.read([n], torch.float32)[n]
        other[n] = t.to(device)
    ties = tuple((a, o) for a, o in model.tied if o in other)
    for alias, owner in ties:
        other.setdefault(alias, other[owner])
    layout = _present(model.layout, other)
    dtypes = {n: model.checkpoint.entries[n].dtype for n in names}
    return ModelView(model.spec, replace(model.dims, n_layers=0), layout, (), other, dtypes,
                     ties)


def _present(lay: Layout, other: Mapping[str, Tensor]) -> Layout:
    """`lay` without blocks, naming only the writers and readers `other` holds."""
    return replace(lay, blocks=(), writers=tuple(w for w in lay.writers if w in other),
                   readers=tuple(r for r in lay.readers if f"{r}.weight" in other))


class _RestSplit:
    """The tensors outside the blocks of a pair: the small ones, held whole when needed, and
    the large ones (`large_rest`), visited a slice of rows at a time with the small tensors
    their canonical form depends on (the final norm, folded into the output head)."""

    def __init__(self, anchor: Streamed, source: Streamed, device: torch.device):
        self.anchor, self.source, self.device = anchor, source, device
        self.large = large_rest(source)
        self.small = [n for n in source.rest
                      if source.checkpoint.entries[n].dtype.is_floating_point
                      and n not in self.large]
        fn = source.layout.final_norm
        self.context = [n for n in (f"{fn}.weight", f"{fn}.bias") if fn and n in self.small]

    def check_view(self, view: ModelView) -> ModelView:
        """The source's small tensors (`view`) and the first row of each large one: what
        deciding whether residual maps exist reads (ties, gains, heads)."""
        other = dict(view.other)
        for n in self.large:
            other[n] = self.source.checkpoint.read_rows(n, 0, 1, torch.float32).to(self.device)
        return replace(view, other=other, layout=_present(self.source.layout, other))

    def small_views(self) -> tuple[ModelView, ModelView]:
        """The anchor's and the source's small tensors."""
        return (rest_part(self.anchor, self.small, self.device),
                rest_part(self.source, self.small, self.device))

    def slices(self, name: str):
        """(anchor, source) views of consecutive row slices of `name`, with its context."""
        names = [name, *(self.context if name not in self.source.layout.writers else [])]
        rows = self.source.checkpoint.entries[name].shape[0]
        step = max(1, SLICE // self.source.dims.d_model)
        for lo in range(0, rows, step):
            span = (lo, min(rows, lo + step))
            yield (rest_part(self.anchor, names, self.device, span, self.large),
                   rest_part(self.source, names, self.device, span, self.large))


def _total(d: Distances) -> float:
    return sum(d.cells.values())


@dataclass
class _Rest:
    """What the rounds need of the tensors outside the blocks (rank 0 only): the cross term
    and squared distance of their canonical forms at the identity map, summed a slice at a
    time for the large ones. The tensors are read again for the last pass."""

    cross: Tensor
    sq: float

    @classmethod
    def read(cls, split: _RestSplit, options: MatchOptions) -> tuple[str, _Rest]:
        """The residual group (a one-line error where the pair has none) and the numbers."""
        a0, s0 = split.small_views()
        kind = check_residual(split.check_view(s0), options)
        a, s = rs.canonicalise(a0)[0], rs.canonicalise(s0)[0]
        d = split.source.dims.d_model
        cross = rs.cross(s, a) if s.other else torch.zeros(d, d, dtype=torch.float64)
        sq = _total(distances(s, a))
        for name in split.large:
            for a_part, s_part in split.slices(name):
                xa = rs.canonicalise(a_part)[0].other[name]
                xs = rs.canonicalise(s_part)[0].other[name]
                cross = cross + (xs.t() @ xa).to(torch.float64).to(cross.device)
                sq += squared_distance(xs, xa)
        return kind, cls(cross.to(split.device), sq)

    def at(self, q: Tensor | None) -> tuple[Tensor, float]:
        """Cross term and squared distance once the source's stream is turned by `q`:
        (X Q)^T A = Q^T M and |X Q - A|^2 = |X - A|^2 + 2 tr((I - Q)^T M)."""
        if q is None:
            return self.cross, self.sq
        eye = torch.eye(len(q), dtype=q.dtype, device=q.device)
        return q.t() @ self.cross, self.sq + 2.0 * float(((eye - q) * self.cross).sum())


def _matched_rest(split: _RestSplit, q: Tensor | None
                  ) -> tuple[dict[str, Tensor], Callable, dict[str, float]]:
    """The matched source's tensors outside the blocks, in the anchor's gauge: the small ones
    (float32), a function giving each large one's row slices (float32; with `count`, their
    squared distances to the anchor's go into the returned cells), and those cells."""
    a0, s = split.small_views()
    _, gauge = rs.canonicalise(a0)
    s = rs.canonicalise(s)[0]
    if q is not None:
        s = rs.apply_residual(s, q, check=False)
    small = rs.restore(s, gauge)
    cells = dict(kind_cells(distances(small, a0)))
    small_out = {n: t for n, t in small.other.items() if n in split.small}

    def slices(name: str, count: bool = False):
        kind = kind_of(name, split.source.layout)
        for a_part, s_part in split.slices(name):
            _, g = rs.canonicalise(a_part)
            x = rs.canonicalise(s_part)[0]
            if q is not None:
                x = rs.apply_residual(x, q, check=False)
            out = rs.restore(x, g).other[name]
            if count:
                cells[kind] = cells.get(kind, 0.0) + squared_distance(out, a_part.other[name])
            yield out

    return small_out, slices, cells


class StreamedState:
    """The alternation's state (rotviz.match.alternating.State) over two checkpoints
    at size: the maps found so far; every pass recomputes the blocks from the files."""

    def __init__(self, anchor: Streamed, source: Streamed, options: MatchOptions,
                 device: torch.device, group: Group, rest: _Rest | None,
                 tick: Callable[[str], None]):
        self.anchor, self.source, self.device, self.group = anchor, source, device, group
        self.n = source.dims.n_layers
        self.chosen = set(range(self.n) if options.layers is None else options.layers)
        self.rest = rest
        self.tick = tick
        self.transforms: dict[int, LayerTransform] = {}  # this rank's blocks, composed
        self.q: Tensor | None = None  # the composed residual map (float64)
        self.cross_m: Tensor | None = None  # of the current state (rank 0)
        self.fresh = False  # whether the last pass saw the current state (no turn since)
        self.value = 0.0  # the objective of the current state
        self._initial: float | None = None

    def block(self, i: int) -> tuple[ModelView, ModelView, ModelView, ModelView, rs.Gauge]:
        """Block i: the anchor's and the source's as stored, the anchor's canonical form and
        gauge, and the source's canonical form in the current state (all float32, on the
        device)."""
        a0 = read_block_view(self.anchor, i).to(device=self.device)
        a, gauge = rs.canonicalise(a0)
        s0 = read_block_view(self.source, i).to(device=self.device)
        return a0, s0, a, self._current(rs.canonicalise(s0)[0], i), gauge

    def canonical(self, i: int) -> tuple[ModelView, ModelView]:
        """Block i's anchor in canonical form and source in the current state, without
        holding either as stored: a pass needs only these, and the stored blocks (two
        float32 copies of a block, about 0.5 GB at d 2048 / FFN 8192) would otherwise stay
        alive through the source's maps, a streamed run's peak."""
        a = rs.canonicalise(read_block_view(self.anchor, i).to(device=self.device))[0]
        return a, self._current(
            rs.canonicalise(read_block_view(self.source, i).to(device=self.device))[0], i)

    def _current(self, s: ModelView, i: int) -> ModelView:
        """The canonical source block i in the current state: its composed per-layer maps,
        then the residual map."""
        if i in self.transforms:
            s = apply_layer(s, 0, self.transforms[i])
        if self.q is not None:
            s = rs.apply_residual(s, self.q.to(s.blocks[0].attn.wq), check=False)
        return s

    def _pass(self, options: MatchOptions | None) -> Step:
        """One pass: the per-layer maps of `options` (None: none) on every chosen block, the
        cross term of the new state and its objective."""
        found: dict[int, tuple[HeadReport | None, float, float, int]] = {}
        maps: dict[int, LayerTransform] = {}

        def part(i: int) -> Tensor:
            self.tick(f"block {i}")
            a, s = self.canonical(i)
            if options is not None and i in self.chosen:
                res = match_layers(a, s, replace(options, layers=None))
                t = maps[i] = res.transforms[0]
                self.transforms[i] = self.transforms[i].then(t) if i in self.transforms else t
                rep = res.report.layers[0]
                rep.layer = i
                units = len(t.perm) if t.perm is not None else 0
                found[i] = (rep, _total(res.report.before), _total(res.report.after), units)
                s = res.view
            else:
                v = _total(distances(s, a))
                found[i] = (None, v, v, 0)
            m = rs.cross(s, a)
            del a, s
            release()
            return m

        d = self.source.dims.d_model
        like = torch.zeros(d, d, dtype=torch.float64, device=self.device)
        blocks = self.group.ordered_sum(part, self.n, like)
        every: dict[int, tuple[HeadReport | None, float, float, int]] = {}
        for piece in self.group.all(found):
            every.update(piece)
        before = sum(every[i][1] for i in range(self.n))
        after = sum(every[i][2] for i in range(self.n))
        numbers = None
        if self.rest is not None:
            rest_cross, rest_sq = self.rest.at(self.q)
            self.cross_m = blocks + rest_cross
            numbers = (before + rest_sq, after + rest_sq)
        first, self.value = self.group.share(numbers)
        if self._initial is None:
            self._initial = first
        self.fresh = True
        reports = [every[i][0] for i in sorted(every) if every[i][0] is not None]
        units = sum(every[i][3] for i in every)  # every rank's blocks
        return Step(maps, reports, self.value, units)  # type: ignore[arg-type]

    def initial(self) -> float:
        assert self._initial is not None, "no pass has run"
        return self._initial

    def layers(self, options: MatchOptions, full: bool) -> Step:
        return self._pass(options)

    def turn(self, group: str, settle: bool) -> tuple[Tensor, float]:
        """The residual map from the last pass's cross term (a pass of its own when the
        round has no per-layer maps). Nothing lags behind it here (`settle` is moot): every
        pass applies the composed maps to all of a block."""
        if not self.fresh:
            self._pass(None)
        numbers = None
        if self.rest is not None:
            assert self.cross_m is not None
            q = rs.solve(self.cross_m, group)
            eye = torch.eye(len(q), dtype=q.dtype, device=q.device)
            value = self.value + 2.0 * float(((eye - q) * self.cross_m).sum())
            numbers = (q.cpu(), value)
        q, self.value = self.group.share(numbers)
        q = q.to(self.device)
        self.q = q if self.q is None else self.q @ q
        self.cross_m, self.fresh = None, False
        return q, self.value

    def cross(self) -> Tensor:
        """The cross term of the current state (a pass of its own when it is not fresh), on
        every rank."""
        if not self.fresh:
            self._pass(None)
        m = self.group.share(None if self.cross_m is None else self.cross_m.cpu())
        return m.to(self.device)

    def move(self, q: Tensor) -> None:
        self.q = q if self.q is None else self.q @ q
        self.cross_m, self.fresh = None, False

    def save(self) -> object:
        return dict(self.transforms), self.q, self.cross_m, self.fresh, self.value

    def load(self, saved: object) -> None:
        transforms, self.q, self.cross_m, self.fresh, self.value = saved  # type: ignore[misc]
        self.transforms = dict(transforms)

    def agree(self, decision: T) -> T:
        """Rank 0's decision on every rank: a branch taken on a number one rank sees
        differently (a clock, this rank's layers' reports) would put the collectives out of
        step."""
        return self.group.share(decision)


def match_streamed_residual(
    anchor: Streamed,
    source: Streamed,
    folder: Path | None,
    options: MatchOptions,
    device: torch.device,
    progress: Progress | None = None,
    group: Group = SINGLE,
    shard_bytes: int | None = None,
    cancel: Callable[[], bool] | None = None,
) -> MatchReport | None:
    """rotviz.match.at_size.match_streamed with `options.residual` (see module)."""
    t0 = time.perf_counter()
    rest = None
    verdict: tuple[str, str] | None = None
    split = _RestSplit(anchor, source, device)
    if group.main:
        try:
            kind, rest = _Rest.read(split, options)
            verdict = ("ok", kind)
        except RotvizError as e:
            verdict = ("error", str(e))
        release()
    status, kind = group.share(verdict)
    if status == "error":
        raise RotvizError(kind)
    now: list = [0, 1, "starting"]

    def report_progress(done: int, total: int, message: str) -> None:
        now[:] = [done, total, message]
        if progress:
            progress(done, total, message)

    def tick(message: str) -> None:
        if cancel is not None and cancel():
            raise KeyboardInterrupt
        if progress:
            progress(now[0], now[1], f"{now[2]}, {message}")

    # Under torchrun every process takes the same joint steps: each pass's cross term and
    # objective come from rank 0 (`Group.share`), the moved units count every rank's blocks
    # (`Step.units`), and every branch the alternation takes (a step kept or undone, a block
    # or a phase ended, the clock) is rank 0's decision (`StreamedState.agree`).
    state = StreamedState(anchor, source, options, device, group, rest, tick)
    out = alternate(state, options, kind, report_progress)
    parts = group.gather(state.transforms)
    if not group.main:
        return None
    assert parts is not None and rest is not None
    for piece in parts:
        state.transforms.update(piece)
    describe(out.layers, state.transforms)  # every rank's blocks now
    q = state.q
    small, slices, rest_after = _matched_rest(split, q)
    release()

    def final(i: int) -> tuple[ModelView, ModelView, ModelView]:
        """Block i of the anchor and the source as stored, and matched (on the CPU)."""
        a0, s0, _, s, gauge = state.block(i)
        return a0, s0, rs.restore(s, gauge).to(device="cpu")

    large = {n: (lambda n=n: slices(n, count=True)) for n in split.large}
    writer = open_writer(source, folder, shard_bytes, {**small, **large})
    before: dict[tuple[int | None, str], float] = {}
    after: dict[tuple[int | None, str], float] = {}
    try:
        for i in range(state.n):
            tick(f"block {i}: writing")
            a0, s0, matched = final(i)
            before.update({(i, k): v for k, v in kind_cells(distances(s0, a0)).items()})
            after.update({(i, k): v for k, v in
                          kind_cells(distances(matched.to(device=device), a0)).items()})
            write_block_tensors(writer, as_stored(matched, source), i, source)
            del a0, s0, matched
            release()
        if folder is not None:
            writer.close()
    finally:
        writer.abort()
    if folder is not None:
        write_config(source, folder)
    if progress:
        progress(1, 1, "checking the function")
    rest_before = rest_cells(anchor, source)
    report = MatchReport(options, Distances({**before, **rest_before}),
                         Distances({**after, **{(None, k): v for k, v in rest_after.items()}}),
                         out.layers, residual=out.info)
    report.seconds = time.perf_counter() - t0
    small_cpu = {n: t.to("cpu") for n, t in small.items()}

    def matched_blocks(dtype: Dtype):
        def provide(i: int):
            view = final(i)[2]
            return block_tensors(view if dtype is not None else as_stored(view, source), i,
                                 source)
        return provide

    def matched_rest(dtype: Dtype):
        def read(names: list[str]):
            out = {}
            for n in names:
                if n in split.large:  # filled a slice at a time: one copy of the tensor
                    e = source.checkpoint.entries[n]
                    t = torch.empty(tuple(e.shape), dtype=torch.float32)
                    lo = 0
                    for x in slices(n):
                        t[lo:lo + len(x)] = x
                        lo += len(x)
                else:
                    t = small_cpu.get(n)
                if t is None:  # not floating: as stored
                    t = source.checkpoint.read([n], None)[n]
                want = source.checkpoint.entries[n].dtype if dtype is None else dtype
                out[n] = t.to(want) if t.is_floating_point() else t
            return out
        return read

    check_function(source, matched_blocks, matched_rest, report, folder)
    return report

"""What both ways of matching at size (rotviz.match.at_size: per-layer maps;
rotviz.match.at_size_residual: weight matching) check, with each checkpoint read a block at a
time: whether the options can be matched at size at all, the parameter distance of two
checkpoints, and the function check of the matched model (in float32 and as stored).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from rotviz.atsize.blocks import (
    Streamed,
    applied_block,
    block_tensors,
    logits_at_size,
    read_block_view,
)
from rotviz.atsize.runtime import Provider, Reader, build_meta
from rotviz.devices import in_order, one_thread
from rotviz.match.distances import Distances, distances, squared_distance
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import record_stored_check
from rotviz.match.report import MatchReport
from rotviz.memory import release
from rotviz.sources.adapters import source_of
from rotviz.sources.checkpoint import Checkpoint
from rotviz.sources.loading import HALF, read_config
from rotviz.sources.running import logit_change
from rotviz.symmetry.kinds import kind_of

Tensor = torch.Tensor


def streaming_refusal(options: MatchOptions) -> str | None:
    """Why `options` cannot be matched block by block, or None."""
    if options.needs_data:
        return f"matching from data ([{options.label}]) cannot be streamed yet"
    return None


def kind_cells(d: Distances) -> dict[str, float]:
    return {kind: v for (_, kind), v in d.cells.items()}


Slices = list[tuple[tuple[int | None, str], str, list[tuple[int, int]]]]


def _rest_slices(anchor: Streamed, source: Streamed) -> Slices:
    """The tensors outside the blocks whose distance counts (tie aliases and integer tensors
    left out), each with its cell and its slices of rows, in the order their sums are added."""
    tied = {alias for alias, _ in source.tied}
    out: Slices = []
    for name in source.rest:
        if name in tied or not source.checkpoint.entries[name].dtype.is_floating_point:
            continue
        shape = source.checkpoint.entries[name].shape
        rows = shape[0] if shape else 1
        step = max(1, (1 << 22) // max(1, math.prod(shape[1:]))) if shape else 1
        out.append(((None, kind_of(name, source.layout)), name,
                    [(lo, lo + step) for lo in range(0, rows, step)]))
    return out


def _jobs(slices: Slices) -> list[tuple[str, tuple[int, int]]]:
    """Every (tensor, rows) of `slices`, in the order their sums are added."""
    return [(name, b) for _, name, bounds in slices for b in bounds]


def _rest_sums(slices: Slices, sums: list[float]) -> dict[tuple[int | None, str], float]:
    """The cells of `slices`, given each slice's squared distance in order: a tensor's
    slices added in order, then the tensors of a cell."""
    cells: dict[tuple[int | None, str], float] = {}
    at = 0
    for key, _, bounds in slices:
        total = 0.0
        for d in sums[at:at + len(bounds)]:
            total += d
        at += len(bounds)
        cells[key] = cells.get(key, 0.0) + total
    return cells


def _squared_slices(anchor: Streamed, source: Streamed, todo: list[tuple[str, tuple[int, int]]]
                    ) -> list[float]:
    """The squared distance of each (tensor, rows) of `todo`, in order, read and summed on
    two threads at once (`in_order`, torch on one thread in each: the reading and casting of
    a vocabulary's rows is most of it)."""
    with one_thread():
        return list(in_order(lambda job: _squared(anchor, source, *job), todo))


def rest_cells(anchor: Streamed, source: Streamed) -> dict[tuple[int | None, str], float]:
    """Distances outside the blocks (unchanged by per-layer maps), one tensor at a time and
    the largest (embeddings, output heads) in slices of rows, in the kinds
    `rotviz.symmetry.kinds.groups` gives them (tie aliases counted once), their slices' sums
    added in order."""
    slices = _rest_slices(anchor, source)
    return _rest_sums(slices, _squared_slices(anchor, source, _jobs(slices)))


class RestLater:
    """`rest_cells`, begun on a thread of its own, so that a caller that reads it only at its
    end (an at-size merge of a pair not matched, which reports the pair's distance) works
    meanwhile: a merge keeps both cores busy only part of the time, and an embedding's
    distance reads and casts both models' rows (seconds, on a vocabulary of 128k).

    The thread sums slices in order while it is allowed to; `cells` stops it after the
    slice it is on and sums the rest as `rest_cells` does. Either way each slice is summed by
    torch on one thread: the thread is made inside `one_thread`, and torch's count is a
    thread's own from then on, so the caller's later counts do not reach it. The cells are
    therefore the same bits however the work was split. `close` stops it (an error, a
    signal) without waiting for more than the slice it is on."""

    def __init__(self, anchor: Streamed, source: Streamed) -> None:
        import threading
        from concurrent.futures import ThreadPoolExecutor

        self.anchor, self.source = anchor, source
        self.slices = _rest_slices(anchor, source)
        self.todo = _jobs(self.slices)
        self.sums: list[float] = []
        self.stop = threading.Event()
        with one_thread():  # the thread starts, and takes torch's count, in here
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="rotviz-distance",
                                           initializer=torch.get_num_threads)
            self.pool.submit(int).result()
        self.running = self.pool.submit(self._run)

    def _run(self) -> None:
        for job in self.todo:
            if self.stop.is_set():
                return
            self.sums.append(_squared(self.anchor, self.source, *job))

    def close(self) -> None:
        """Stop the thread after the slice it is on, and wait for that."""
        self.stop.set()
        self.pool.shutdown(wait=True, cancel_futures=True)

    def cells(self) -> dict[tuple[int | None, str], float]:
        """The rest's cells: the thread's slices, and the ones it had not reached."""
        self.close()
        if not self.running.cancelled():
            self.running.result()  # its error, if any, is raised here
        left = self.todo[len(self.sums):]
        sums = self.sums + (_squared_slices(self.anchor, self.source, left) if left else [])
        return _rest_sums(self.slices, sums)


def _squared(anchor: Streamed, source: Streamed, name: str, bounds: tuple[int, int]) -> float:
    """||source - anchor||^2 of rows lo:hi of tensor `name` (a 0-dimensional one whole)."""
    lo, hi = bounds
    if source.checkpoint.entries[name].shape:
        a = anchor.checkpoint.read_rows(name, lo, hi, torch.float32)
        s = source.checkpoint.read_rows(name, lo, hi, torch.float32)
    else:
        a = anchor.checkpoint.read([name], torch.float32)[name]
        s = source.checkpoint.read([name], torch.float32)[name]
    return squared_distance(s, a)


def streamed_distance(anchor: Streamed, source: Streamed, rest: RestLater | None = None
                      ) -> Distances:
    """The parameter distance of two checkpoints, read block by block (as the in-memory
    `rotviz.match.distances.distances` of the loaded models); the cells outside the blocks
    from `rest` where it was begun earlier."""
    cells: dict[tuple[int | None, str], float] = {}
    for i in range(source.dims.n_layers):
        d = distances(read_block_view(source, i), read_block_view(anchor, i))
        cells.update({(i, k): v for k, v in kind_cells(d).items()})
        release()
    return Distances({**cells, **(rest.cells() if rest is not None else
                                  rest_cells(anchor, source))})


Dtype = torch.dtype | None  # float32, or None: as stored


def check_function(source: Streamed, matched: Callable[[Dtype], Provider],
           matched_rest: Callable[[Dtype], Reader], report: MatchReport,
           folder: Path | None) -> None:
    """Fill the report's function check, as rotviz.match.pipeline does in memory: the source
    against the matched model (`matched(dtype)` gives its blocks, `matched_rest(dtype)` the
    tensors outside them), in float32 and, for a half checkpoint, as stored (read back from
    the written `folder` where there is one)."""
    module, full = build_meta(source.spec, read_config(source.path, source.confined))
    x = source_of(source.spec).probe_inputs(source.spec, full, module, 4, 0)

    def original(dtype: Dtype) -> Provider:
        return lambda i: block_tensors(applied_block(source, i, None, dtype), i, source)

    def stored_rest(dtype: Dtype) -> Reader:
        return lambda ns: source.checkpoint.read(ns, dtype)

    ya = logits_at_size(source, original(torch.float32), stored_rest(torch.float32), x)
    release()
    yb = logits_at_size(source, matched(torch.float32), matched_rest(torch.float32), x)
    release()
    report.max_output_diff = float((ya - yb).abs().max())
    dtype = source.stored_dtype
    if dtype not in HALF:
        return
    xs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in x.items()}
    if folder is not None:  # the written files, as they will be loaded
        written = Checkpoint(folder, source.confined)

        def blocks(i: int) -> Mapping[str, Tensor]:
            return written.read(source.block_keys[i], None)

        def rest(ns: list[str]) -> Mapping[str, Tensor]:
            return written.read(ns, None)
    else:
        blocks, rest = matched(None), matched_rest(None)
    ya = logits_at_size(source, original(None), stored_rest(None), xs)
    release()
    yb = logits_at_size(source, blocks, rest, xs)
    release()
    record_stored_check(report, dtype, *logit_change(ya, yb))

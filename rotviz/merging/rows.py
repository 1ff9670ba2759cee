"""One tensor of N models (and of their base) read a slice of rows at a time, so that the
elementwise merges (rotviz.merging.merges_at_size names them) never hold a
float64 copy of a whole tensor: a 128256 x 2048 embedding is 2.1 GB in float64, and a
merge of two models about a base made several such copies.

A method that merges this way declares `rows` in its record (rotviz.merging.registry):
given a `RowSource`, it yields the merged tensor's slices in order, in float64. What it needs
of the whole tensor (TIES's magnitude threshold, DARE's L1 norms, the angles of SLERP and
Model Stock) it gathers first, in passes over the slices. The same code merges tensors held
in memory (`held`) and tensors read from checkpoints at size (rotviz.atsize.points), with
the same slices, so the two give the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor

# Entries per slice: a merge holds about ten float64 copies of a slice (inputs, task vectors,
# masks), about 20 MB at this size, which the processor's caches mostly keep; larger slices
# run slower per entry (a TIES of two LLaMA tensors: 1.0 s per 8M entries at 2^21, 0.74 s
# at 2^18, one thread).
CHUNK = 1 << 18

# rows lo:hi of every model's tensor (the anchor first) and of the base's (None without a
# base), in float64
Read = Callable[[int, int], "tuple[list[Tensor], Tensor | None]"]


@dataclass(frozen=True)
class RowSource:
    """One tensor of `n` models and their base, read by slices of rows (its first dimension;
    a 0-dimensional tensor is one row) of about `chunk` entries. Slices come in row order,
    and every pass over them reads them again: nothing is kept between passes."""

    shape: tuple[int, ...]
    n: int
    read: Read
    chunk: int = CHUNK
    # read each next slice on a thread of its own while the method merges this one (slices
    # read from files: the reading and its cast overlap the arithmetic); the same reads in
    # the same order, so the same bits. Off for tensors held in memory, whose slices are
    # views and copies a thread would only slow.
    prefetch: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def step(self) -> int:
        """Rows per slice."""
        return max(1, self.chunk // max(1, math.prod(self.shape[1:])))

    def bounds(self) -> Iterator[tuple[int, int]]:
        rows = self.shape[0] if self.shape else 1
        if self.numel == 0:
            return
        for lo in range(0, rows, self.step):
            yield lo, min(rows, lo + self.step)

    def slices(self) -> Iterator[tuple[list[Tensor], Tensor | None]]:
        """Each slice's tensors: one per model, and the base's (None without one); with
        `prefetch`, the next slice read while this one is merged (one slice ahead, so one
        more slice is held)."""
        bounds = list(self.bounds())
        if not self.prefetch or len(bounds) < 2:
            for lo, hi in bounds:
                yield self.read(lo, hi)
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1, thread_name_prefix="rotviz-rows") as ahead:
            coming = ahead.submit(self.read, *bounds[0])
            for k in range(len(bounds)):
                now = coming.result()
                if k + 1 < len(bounds):
                    coming = ahead.submit(self.read, *bounds[k + 1])
                yield now


def held(tensors: Sequence[Tensor], base: Tensor | None = None, chunk: int = CHUNK
         ) -> RowSource:
    """A `RowSource` of tensors in memory: each slice a float64 copy of their rows (views of
    float64 tensors, never written to)."""

    def rows(t: Tensor) -> Tensor:
        return t.reshape(1) if t.dim() == 0 else t

    def read(lo: int, hi: int) -> tuple[list[Tensor], Tensor | None]:
        return ([rows(t)[lo:hi].double() for t in tensors],
                None if base is None else rows(base)[lo:hi].double())

    return RowSource(tuple(tensors[0].shape), len(tensors), read, chunk)


def gather(parts: Iterable[Tensor], shape: Sequence[int], dtype: torch.dtype,
           device: torch.device | str | None = None) -> Tensor:
    """The tensor of `shape` whose rows are the consecutive `parts`, cast to `dtype`."""
    import torch

    out = torch.empty(tuple(shape), dtype=dtype, device=device)
    flat = out.view(-1)
    at = 0
    for p in parts:
        n = p.numel()
        flat[at:at + n] = p.reshape(-1)
        at += n
    if at != flat.numel():
        raise RuntimeError(f"a merge gave {at} of {flat.numel()} entries")
    return out


def whole(rows: Callable[[RowSource], Iterator[Tensor]], tensors: Sequence[Tensor],
          base: Tensor | None, dtype: torch.dtype | None = None,
          chunk: int = CHUNK) -> Tensor:
    """A merge by rows of whole tensors: `rows` run on them (`held`), the slices gathered
    into one tensor of `dtype` (default the base's, else the first tensor's), on one torch
    thread (rotviz.devices.one_thread: slices are small)."""
    from rotviz.devices import one_thread

    src = held(tensors, base, chunk)
    like = base if base is not None else tensors[0]
    with one_thread():
        return gather(rows(src), src.shape, dtype or like.dtype, like.device)

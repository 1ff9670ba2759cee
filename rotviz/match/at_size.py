"""Matching checkpoints larger than memory: read both one block at a time, write as you go.

The seed paper's maps (FFN permutation, Q-K and V-O rotations and scales, head permutation)
are per layer: block i of the matched source depends on block i of the two models only. So
matching at size reads block i of each checkpoint (safetensors, lazily,
rotviz.sources.checkpoint), solves it exactly as the in-memory path does (rotviz.match.layers on a
one-block view), and writes the matched block straight into the output shards in the checkpoint's
own dtypes. Everything outside the blocks is copied unchanged. Peak memory is a few blocks plus the
embeddings, whatever the depth; the result is the in-memory result (tests/test_streaming.py).

Under torchrun each rank solves its share of the blocks; rank 0 gathers the maps, re-applies
them to the source's blocks (the same arithmetic, so the same bits) and writes. The function
check then runs the probe inputs through the source and the matched model, each block loaded
only while it runs (rotviz.atsize.runtime): in float32, and for a half checkpoint in its dtype too.

Weight matching (the residual map, alternated with these) runs at size too, one pass over
the blocks per round: rotviz.match.at_size_residual. Matching from data (activations, learned
maps) needs every block at once; matching at size refuses it in one line. What both share:
rotviz.atsize.blocks (opening a folder, reading and writing a block) and
rotviz.match.at_size_checks (distances, the function check).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from rotviz.atsize.blocks import (
    Streamed,
    applied_block,
    as_stored,
    block_tensors,
    open_writer,
    read_block_view,
    write_block_tensors,
    write_config,
)
from rotviz.atsize.runtime import Provider, Reader
from rotviz.devices import wide_device
from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.match.at_size_checks import (
    Dtype,
    check_function,
    kind_cells,
    rest_cells,
    streaming_refusal,
)
from rotviz.match.at_size_residual import match_streamed_residual
from rotviz.match.distances import Distances, distances
from rotviz.match.layers import match_layers
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import refuse_residual
from rotviz.match.report import HeadReport, MatchReport
from rotviz.memory import mapped_alone, release
from rotviz.sources.pairs import check_compatible
from rotviz.symmetry.actions import LayerTransform
from rotviz.symmetry.view import ModelView
from rotviz.types import Progress

Tensor = torch.Tensor


@dataclass
class _Solved:
    """What solving one block gives: its map, report and distance cells."""

    transform: LayerTransform | None
    report: HeadReport | None
    before: dict[str, float]  # kind -> squared distance
    after: dict[str, float]


def _solve(anchor: Streamed, source: Streamed, i: int, options: MatchOptions,
           chosen: bool, device: torch.device) -> tuple[_Solved, ModelView]:
    """Block i matched (when `chosen`), on `device`; returns what it found and the matched
    one-block view (float32, on the CPU)."""
    va = read_block_view(anchor, i).to(device=device)
    vs = read_block_view(source, i).to(device=device)
    if not chosen:
        d = kind_cells(distances(vs, va))
        return _Solved(None, None, d, d), vs.to(device="cpu")
    res = match_layers(va, vs, replace(options, layers=None))
    rep = res.report.layers[0]
    rep.layer = i
    found = _Solved(res.transforms[0], rep, kind_cells(res.report.before),
                    kind_cells(res.report.after))
    return found, res.view.to(device="cpu")


@mapped_alone()
def match_streamed(
    anchor: Streamed,
    source: Streamed,
    folder: Path | None,
    options: MatchOptions | None = None,
    device: torch.device | str = "cpu",
    progress: Progress | None = None,
    group: Group = SINGLE,
    shard_bytes: int | None = None,
    cancel: Callable[[], bool] | None = None,
) -> MatchReport | None:
    """Match `source` onto `anchor` block by block, writing the matched checkpoint into the
    empty `folder` (rank 0 only; the caller renames it into place) with the config and the
    tokenizer and processor files. Returns the checked report on rank 0, None elsewhere.
    `shard_bytes`: the largest output shard (default: the source's largest)."""
    options = options or MatchOptions()
    why = streaming_refusal(options)
    if why:
        raise RotvizError(f"{why}; match in memory (raise --max-memory) or drop it")
    check_compatible(anchor, source)  # type: ignore[arg-type]  # duck-typed: meta state
    device = wide_device(device)
    if options.residual:  # one pass over the blocks per round (rotviz.match.at_size_residual)
        refuse_residual(anchor, source)
        return match_streamed_residual(anchor, source, folder, options, torch.device(device),
                                       progress, group, shard_bytes, cancel)
    t0 = time.perf_counter()
    n = source.dims.n_layers
    chosen = set(range(n) if options.layers is None else options.layers)
    blocks = list(range(n))
    mine = group.mine(blocks)
    writer = None
    if group.main and group.world == 1:
        writer = open_writer(source, folder, shard_bytes)
    solved: dict[int, _Solved] = {}
    total = len(mine) + (n if group.world > 1 and group.main else 0)
    step = 0

    def tick(message: str) -> None:
        nonlocal step
        if cancel is not None and cancel():
            raise KeyboardInterrupt
        if progress:
            progress(step, total, message)
        step += 1

    try:
        for i in mine:
            tick(f"block {i}: solving")
            solved[i], matched = _solve(anchor, source, i, options, i in chosen, device)
            if writer is not None:
                write_block_tensors(writer, as_stored(matched, source), i, source)
            del matched
            release()
        everything = group.gather(solved)
        if not group.main:
            return None
        assert everything is not None
        for part in everything:
            solved.update(part)
        if writer is None:  # several ranks solved: rank 0 writes every block
            writer = open_writer(source, folder, shard_bytes)
            for i in blocks:
                tick(f"block {i}: writing")
                view = applied_block(source, i, solved[i].transform, None)
                write_block_tensors(writer, view, i, source)
                release()
        if folder is not None:
            writer.close()
    finally:
        if writer is not None:
            writer.abort()
    if folder is not None:
        write_config(source, folder)
    if progress:
        progress(total, total, "checking the function")
    report = _report(anchor, source, options, solved)
    report.seconds = time.perf_counter() - t0

    def matched(dtype: Dtype) -> Provider:
        return lambda i: block_tensors(applied_block(source, i, solved[i].transform, dtype), i,
                                       source)

    def rest(dtype: Dtype) -> Reader:
        return lambda ns: source.checkpoint.read(ns, dtype)

    check_function(source, matched, rest, report, folder)
    return report


def _report(anchor: Streamed, source: Streamed, options: MatchOptions,
            solved: dict[int, _Solved]) -> MatchReport:
    """The report the in-memory path gives: distance cells in its order (blocks, then the
    rest), the per-layer reports of the chosen layers."""
    rest = rest_cells(anchor, source)
    before = {(i, k): v for i in sorted(solved) for k, v in solved[i].before.items()}
    after = {(i, k): v for i in sorted(solved) for k, v in solved[i].after.items()}
    layers = [solved[i].report for i in sorted(solved) if solved[i].report is not None]
    return MatchReport(options, Distances({**before, **rest}), Distances({**after, **rest}),
                       layers)



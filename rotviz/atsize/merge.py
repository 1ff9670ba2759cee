"""Merging a pair at size: a merge holds none of its checkpoints. Each merged tensor is built
once, from slices of rows read from them (rotviz.merging.rows), and written slice by slice to
the output and to a float32 cache that its evaluation reads block by block
(rotviz.atsize.points). The source is taken as given: match it first (rotviz.match.at_size;
the CLI's --max-memory does both).
"""


from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rotviz.analysis.merges import Merged
from rotviz.atsize.blocks import Streamed
from rotviz.atsize.points import Opened, float32, sized_loaded
from rotviz.data.split import Split
from rotviz.devices import one_thread
from rotviz.errors import RotvizError
from rotviz.match.endpoints import MatchInfo
from rotviz.memory import release
from rotviz.merging import check_weight
from rotviz.merging.registry import MergeJob, MergeMethod
from rotviz.sources.checkpoint import Checkpoint
from rotviz.sources.shards import ShardWriter
from rotviz.sources.writing import copy_reading_files

Tensor = torch.Tensor


def sized_merge(anchor: str | os.PathLike | Streamed, source: str | os.PathLike, split: Split,
                weight: float = 0.5, device: str | torch.device = "cpu",
                batch_size: int = 512, folder: Path | None = None,
                match_info: MatchInfo | Callable[[], MatchInfo | None] | None = None,
                layers: list[int] | None = None,
                method: str = "simple", base: str | os.PathLike | None = None,
                evaluate: bool = True, **params) -> Merged:
    """The merge of two checkpoint folders (the source already matched: `match_info`, or a
    function giving it that is called once the merge is written, says how) with a registered
    method that merges a slice of rows at a time without statistics (`MergeMethod.at_size`;
    rotviz.merging.merges_at_size names them) and its `params`, about the checkpoint folder
    `base` for a method that needs one; written as
    shards in the anchor's dtypes into the empty `folder` when given, with its config and
    tokenizer and processor files, and evaluated on `split` with the two endpoints as
    `rotviz.measures.merge.merge` does.

    No checkpoint is held: each tensor is merged once, from slices of rows read from the
    checkpoints (`MergedRows`), and each merged slice is written as it comes, to `folder`
    and, in float32 (the merge the in-memory path evaluates), to a temporary cache in
    TMPDIR that the evaluation then reads block by block (an evaluation runs every block
    once per batch). The peak is about the largest tensor in float32 (an embedding, while
    its module runs) and a slice's float64 working copies. Fisher and RegMean need
    statistics of whole models and are refused. `evaluate=False` only merges and writes (the
    work mergekit does): no float32 cache and no evaluation, so the losses are None; it
    needs `folder`."""
    from rotviz.analysis.merges import method_params
    from rotviz.merging import check_base
    from rotviz.merging import method as method_record
    from rotviz.merging.combine import merge_job

    m = method_record(method)
    weight = check_weight(weight)
    values = method_params(m, params)
    if m.assemble is not None:
        raise RotvizError(f"--method {m.name} builds a model of its own depth from whole "
                          "blocks, and the at-size merge writes and evaluates the anchor's "
                          "blocks in place, one by one; raise --max-memory")
    if not m.at_size:
        raise RotvizError(f"--method {m.name} needs statistics of whole models and cannot merge "
                          "block by block; use a method without statistics, or raise "
                          "--max-memory")
    check_base(m, base is not None)
    if not evaluate and folder is None:
        raise RotvizError("a merge that is not evaluated is only written: give it a folder "
                          "(--out DIR), or evaluate it")
    t0 = time.perf_counter()
    refs = [anchor, source] if base is None else [anchor, source, base]
    opened = Opened(refs, split, device, batch_size)
    first = opened.models[0]
    job = merge_job(sized_loaded(first), m, (1.0 - weight, weight), None, values)
    rows = MergedRows(opened, m, job)
    loss = acc = a_loss = a_acc = s_loss = s_acc = None
    scores: dict[str, float] = {}
    a_scores: dict[str, float] = {}
    s_scores: dict[str, float] = {}
    if not evaluate:
        rows.write_all(None, folder)
    else:
        with tempfile.TemporaryDirectory(prefix="rotviz-merged-") as tmp:
            cache = Path(tmp)
            check_cache_space(first, cache)
            rows.write_all(cache, folder)
            merged = Checkpoint(cache)
            loss, acc, scores = opened.scores(
                lambda ns: float32(merged.read(ns, torch.float32), opened.device))
        a_loss, a_acc, a_scores = opened.scores(lambda ns: opened.read(0, ns))
        s_loss, s_acc, s_scores = opened.scores(lambda ns: opened.read(1, ns))
    if folder is not None:
        shutil.copyfile(first.path / "config.json", folder / "config.json")
        copy_reading_files(first.path, folder)
    # read only now: a pair not matched has its distance worked out beside the merge
    # (rotviz.atsize.endpoints.StreamedEndpoints.info)
    info = (match_info() if callable(match_info) else match_info) or MatchInfo(
        "none", 0.0, 0.0, None, 0.0)
    return Merged(
        method=m.name, match=info.match, weight=weight, loss=loss, acc=acc,
        anchor_loss=a_loss, anchor_acc=a_acc, source_loss=s_loss, source_acc=s_acc,
        data=split.data, split=split.split, stats_split=None, batches=8, batch_size=32,
        alpha=None, device=str(opened.device), n=split.n, seconds=time.perf_counter() - t0,
        match_seconds=info.seconds, stats_seconds=0.0, distance_before=info.distance_before,
        distance_after=info.distance_after, anchor=first.ref, source=opened.models[1].ref,
        layers=layers, scores=scores, anchor_scores=a_scores, source_scores=s_scores,
        base="" if base is None else opened.models[2].ref,
        params={k: v for k, v in values.items() if k in m.extra})


def check_cache_space(model: Streamed, cache: Path) -> None:
    """One line, before any work, where the cache's disk cannot hold the merged model in
    float32."""
    entries = model.checkpoint.entries
    need = sum(math.prod(e.shape) * (4 if e.dtype.is_floating_point else e.dtype.itemsize)
               for e in (entries[n] for n in model.keys))
    free = shutil.disk_usage(cache).free
    if free < need:
        raise RotvizError(f"merging at size caches the merged model in float32 ({need / 1e9:.1f}"
                          f" GB) in {cache.parent}, which has {free / 1e9:.1f} GB free; set "
                          "TMPDIR to a folder on a larger disk")


class MergedRows:
    """The merged tensors of opened checkpoints (anchor, source[, base]) with a method that
    merges by rows: each tensor's slices of rows read from the checkpoints in float64 as the
    method asks for them (rotviz.merging.rows), on the device. A tied alias merges as its
    owner, so they stay one tensor; integer tensors are the anchor's."""

    def __init__(self, opened: Opened, m: MergeMethod, job: MergeJob) -> None:
        from rotviz.sources.adapters import source_of

        self.opened, self.m, self.job = opened, m, job
        first = opened.models[0]
        self.owner = dict(first.tied)
        # the module's name of each tensor, which the method sees (DARE seeds its drop by
        # it), so a merge at size equals the in-memory one
        self.module_name = source_of(first.spec).checkpoint_names(opened.module,
                                                                  list(opened.keys))

    def key(self, n: str) -> str:
        o = self.owner.get(n, n)
        return o if o in self.opened.keys else n

    def parts(self, key: str):
        """The merged slices of the checkpoint tensor `key` (float64, in row order)."""
        from rotviz.merging.rows import RowSource

        checkpoints = [x.checkpoint for x in self.opened.models]
        device = self.opened.device

        def read(lo: int, hi: int):
            ts = [c.read_rows(key, lo, hi, torch.float64).to(device) for c in checkpoints]
            return ts[:2], (ts[2] if len(ts) > 2 else None)

        src = RowSource(tuple(checkpoints[0].entries[key].shape), 2, read, prefetch=True)
        return self.m.rows(self.job, self.module_name.get(key, key), src)

    def write_all(self, cache: Path | None, folder: Path | None) -> None:
        """Every tensor merged once, its slices rounded to float32 and written to `cache`
        when given and, rounded again to the stored dtype (as the in-memory merge is
        written), to `folder` when given."""
        first = self.opened.models[0]
        entries = first.checkpoint.entries
        stored = {n: entries[n].dtype for n in self.opened.keys}
        f32 = {n: torch.float32 if d.is_floating_point else d for n, d in stored.items()}
        kinds, dirs = ([f32], [cache]) if cache is not None else ([], [])
        if folder is not None:
            kinds.append(stored)
            dirs.append(folder)
        size = first.checkpoint.largest_file_bytes()
        out = [(ShardWriter(d, [(n, dt[n], entries[n].shape) for n in dt], size), dt)
               for d, dt in zip(dirs, kinds, strict=True)]
        try:
            with one_thread():  # slices are small: rotviz.devices.one_thread says why
                for n in self.opened.keys:
                    self.write(n, out)
            for w, _ in out:
                w.close()
        finally:
            for w, _ in out:
                w.abort()

    def write(self, n: str, out: list[tuple[ShardWriter, dict[str, torch.dtype]]]) -> None:
        """Tensor `n` merged, a slice at a time, to each writer in its dtype for `n`."""
        key = self.key(n)
        e = self.opened.models[0].checkpoint.entries[n]
        if not e.dtype.is_floating_point or not e.shape:  # no rows to write one by one
            if e.dtype.is_floating_point:
                from rotviz.merging.rows import gather

                t = gather(self.parts(key), e.shape, torch.float32)
            else:
                t = self.opened.models[0].checkpoint.read([key])[key]
            for w, dtypes in out:
                w.write(n, t.to(device="cpu", dtype=dtypes[n]))
            return
        for w, _ in out:
            w.begin(n)
        for p in self.parts(key):
            p = p.float().cpu()
            for w, dtypes in out:
                w.add(p.to(dtypes[n]))
        for w, _ in out:
            w.end()
        release()

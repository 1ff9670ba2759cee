"""Curves, planes and merges of models held in their stored dtype, built one block at a time.

`rotviz.measures.barrier.interpolate` holds the anchor, the source and each point of the
path in float32: 3x a model's float32 bytes, 84 GB for a 7B pair. Here both checkpoints are
held as they are stored (bf16: 2 x 14 GB for 7B) on the device, and each point of the path
is never made whole: every block's weights, (1 - alpha) anchor + alpha source in float32,
are built just before the block runs and dropped after it (rotviz.skeleton); embeddings and
output heads likewise, the small tensors outside the blocks when the point starts. Logits
are bounded per batch as everywhere (rotviz.evaluation.fit_batch). Planes hold three
checkpoints (anchor, source, matched source) and build each grid point the same way. A
merge holds none of its checkpoints: each merged tensor is built once, from slices of rows
read from them (rotviz.merging.rows), and written slice by slice to the output and to a
float32 cache that its evaluation reads block by block. The source is taken as given:
match it first (rotviz.stream.match writes a matched checkpoint; the CLI's --max-memory
does both).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rotviz.analysis.merges import Merged
from rotviz.analysis.paths import Curve, check_path, path_points
from rotviz.analysis.planes import (
    Plane,
    plane_axes,
    plane_coeffs,
    plane_frame,
    plane_grid,
    plane_points,
)
from rotviz.checkpoint import Checkpoint, ShardWriter
from rotviz.data import Split
from rotviz.devices import one_thread, wide_device
from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator, check_split
from rotviz.limits import GRID, MARGIN
from rotviz.match.endpoints import MatchInfo
from rotviz.memory import release
from rotviz.merging import check_weight
from rotviz.merging.registry import MergeJob, MergeMethod
from rotviz.models import Loaded, check_compatible, copy_reading_files, read_config
from rotviz.skeleton import build_meta
from rotviz.stream.blocks import Streamed, open_streamed
from rotviz.types import Progress

Tensor = torch.Tensor


@dataclass
class SizedCurve(Curve):
    """A `Curve` whose points were built block by block; `held_bytes`: both checkpoints as
    stored, on the device."""

    held_bytes: int = 0


def sized_loaded(model: Streamed) -> Loaded:
    """A `Loaded` of `model` whose module has no weights (meta parameters): what data
    reading and evaluation ask of a model (its config, tokenizer, image shape) without the
    model in memory."""
    module, _ = build_meta(model.spec, read_config(model.path), model.stored_dtype)
    return Loaded(model.ref, model.path, model.config, model.spec, module,
                  dict(module.state_dict()), {})


class Opened:
    """Checkpoints of one architecture opened for streaming (headers only), and the anchor's
    module (on meta) with its evaluator on a split: a point runs block by block, its tensors
    given as each block needs them, and nothing is held between points."""

    def __init__(self, refs: list[str | os.PathLike], split: Split,
                 device: str | torch.device = "cpu", batch_size: int = 512):
        check_split(split)
        self.models = [open_streamed(r) for r in refs]
        for m in self.models[1:]:
            check_compatible(self.models[0], m)  # type: ignore[arg-type]  # duck-typed
        self.device = torch.device(wide_device(device))
        self.keys = self.models[0].keys  # old-format buffers left out (rotviz.legacy)
        loaded = sized_loaded(self.models[0])
        self.ev = Evaluator(loaded, split, self.device, batch_size)
        self.module = self.ev.module  # the module evaluations run (rotviz.evaluation)

    def read(self, k: int, names) -> dict[str, Tensor]:
        """Model k's named tensors, floating ones in float32 (cast as they are read, so a
        tensor is never whole in two dtypes), on the device."""
        return float32(self.models[k].checkpoint.read(names, torch.float32), self.device)

    def run(self, rest, provider) -> tuple:
        """`Evaluator.per_sample`'s arrays and scores of the point whose tensors outside the
        blocks `rest(names)` gives and whose block k's tensors `provider(k)` gives, built as
        each is needed (checkpoint names, float32)."""
        runner = self.models[0].runner(self.module, rest, provider)
        try:
            scored: list[dict[str, float]] = []
            return self.ev.per_sample({}, scored), scored[0]
        finally:
            runner.close()
            release()

    def scores(self, tensors) -> tuple[float, float, dict[str, float]]:
        """Loss, accuracy and the task's scores of the point whose named tensors
        `tensors(names)` gives."""
        per, scores = self.run(tensors, lambda k: tensors(self.models[0].block_keys[k]))
        return float(per[0].sum() / per[2].sum()), float(per[1].sum() / per[2].sum()), scores


class Held(Opened):
    """Checkpoints of one architecture held as stored on the device, each point a weighted
    sum of them built block by block while the anchor's module (on meta) runs on a split."""

    def __init__(self, refs: list[str | os.PathLike], split: Split,
                 device: str | torch.device = "cpu", batch_size: int = 512):
        super().__init__(refs, split, device, batch_size)
        self.tensors = [{k: v.to(self.device) for k, v in m.checkpoint.read(self.keys).items()}
                        for m in self.models]
        self.held_bytes = sum(t.numel() * t.element_size()
                              for ts in self.tensors for t in ts.values())

    def mix(self, coeffs: tuple[float, ...], names) -> dict[str, Tensor]:
        """The named tensors of sum_k coeffs[k] model_k, in float32. Two models at
        (1 - alpha, alpha) are lerped, as the in-memory path does."""
        out = {}
        for n in names:
            ts = [t[n] for t in self.tensors]
            if not ts[0].is_floating_point():
                out[n] = ts[0]
            elif len(ts) == 2 and abs(coeffs[0] + coeffs[1] - 1.0) < 1e-15:
                out[n] = torch.lerp(ts[0].float(), ts[1].float(), coeffs[1])
            else:
                acc = coeffs[0] * ts[0].float()
                for c, t in zip(coeffs[1:], ts[1:], strict=True):
                    acc.add_(t.float(), alpha=c)
                out[n] = acc
        return out

    def evaluate(self, coeffs: tuple[float, ...]) -> tuple:
        """`Evaluator.per_sample`'s arrays and scores at that point."""
        return self.run(lambda ns: self.mix(coeffs, ns),
                        lambda k: self.mix(coeffs, self.models[0].block_keys[k]))

    def loss_acc(self, coeffs: tuple[float, ...]) -> tuple[float, float, dict[str, float]]:
        """Loss, accuracy and the task's scores at that point."""
        per, scores = self.evaluate(coeffs)
        return float(per[0].sum() / per[2].sum()), float(per[1].sum() / per[2].sum()), scores


def sized_curve(anchor: str | os.PathLike, source: str | os.PathLike, split: Split,
                points: int = 21, device: str | torch.device = "cpu", batch_size: int = 512,
                progress: Progress | None = None, repeats: int = 1, seed: int = 0,
                group: Group = SINGLE, match_info: MatchInfo | None = None,
                layers: list[int] | None = None) -> SizedCurve | None:
    """The straight path from `anchor` to `source` (checkpoint folders) at `points` alphas on
    `split` (read through the anchor: rotviz.evaluation.split_for(sized_loaded(...))), as
    `rotviz.measures.barrier.interpolate` gives it for a source already matched
    (`match_info` says how; `layers` which layers). Under torchrun (`group`) the points are
    shared and rank 0 returns the curve (None elsewhere)."""
    check_path(points, repeats, split)
    t0 = time.perf_counter()
    held = Held([anchor, source], split, device, batch_size)
    alphas = np.linspace(0.0, 1.0, points).tolist()
    fields = path_points(lambda a: held.evaluate((1.0 - a, a)), alphas, split.n, split.task,
                         repeats, seed, progress, group)
    if fields is None:
        return None
    info = match_info or MatchInfo("none", 0.0, 0.0, None, 0.0)
    a, s = held.models
    return SizedCurve(
        **fields, match=info.match, data=split.data, split=split.split, device=str(held.device),
        seconds=time.perf_counter() - t0, n=split.n, layers=layers, anchor=a.ref, source=s.ref,
        distance_before=info.distance_before, distance_after=info.distance_after,
        max_output_diff=info.max_output_diff, match_seconds=info.seconds,
        held_bytes=held.held_bytes)


def sized_merge(anchor: str | os.PathLike, source: str | os.PathLike, split: Split,
                weight: float = 0.5, device: str | torch.device = "cpu",
                batch_size: int = 512, folder: Path | None = None,
                match_info: MatchInfo | None = None, layers: list[int] | None = None,
                method: str = "simple", base: str | os.PathLike | None = None,
                **params) -> Merged:
    """The merge of two checkpoint folders (the source already matched: `match_info` says
    how) with a registered method that merges a slice of rows at a time without statistics
    (simple, task arithmetic, TIES, DARE, SLERP, Model Stock: `MergeMethod.at_size`) and its
    `params`, about the checkpoint folder `base` for a method that needs one; written as
    shards in the anchor's dtypes into the empty `folder` when given, with its config and
    tokenizer and processor files, and evaluated on `split` with the two endpoints as
    `rotviz.measures.merge.merge` does.

    No checkpoint is held: each tensor is merged once, from slices of rows read from the
    checkpoints (`MergedRows`), and each merged slice is written as it comes, to `folder`
    and, in float32 (the merge the in-memory path evaluates), to a temporary cache in
    TMPDIR that the evaluation then reads block by block (an evaluation runs every block
    once per batch). The peak is about the largest tensor in float32 (an embedding, while
    its module runs) and a slice's float64 working copies. Fisher and RegMean need
    statistics of whole models and are refused."""
    from rotviz.analysis.merges import method_params
    from rotviz.merging import check_base
    from rotviz.merging import method as method_record
    from rotviz.merging.combine import merge_job

    m = method_record(method)
    weight = check_weight(weight)
    values = method_params(m, params)
    if not m.at_size:
        raise RotvizError(f"--method {m.name} needs statistics of whole models and cannot merge "
                          "block by block; use a method without statistics, or raise "
                          "--max-memory")
    check_base(m, base is not None)
    t0 = time.perf_counter()
    refs = [anchor, source] if base is None else [anchor, source, base]
    opened = Opened(refs, split, device, batch_size)
    first = opened.models[0]
    job = merge_job(sized_loaded(first), m, (1.0 - weight, weight), None, values)
    rows = MergedRows(opened, m, job)
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
    info = match_info or MatchInfo("none", 0.0, 0.0, None, 0.0)
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


def float32(tensors: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    """Floating tensors in float32, all on `device`."""
    return {n: (t.float() if t.is_floating_point() else t).to(device)
            for n, t in tensors.items()}


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
        from rotviz.sources import source_of

        self.opened, self.m, self.job = opened, m, job
        first = opened.models[0]
        self.owner = dict(first.tied)
        # the module's name of each tensor, which the method sees (DARE seeds its drop by
        # it), so a streamed merge equals the in-memory one
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

        src = RowSource(tuple(checkpoints[0].entries[key].shape), 2, read)
        return self.m.rows(self.job, self.module_name.get(key, key), src)

    def write_all(self, cache: Path, folder: Path | None) -> None:
        """Every tensor merged once, its slices rounded to float32 and written to `cache`
        and, rounded again to the stored dtype (as the in-memory merge is written), to
        `folder` when given."""
        first = self.opened.models[0]
        entries = first.checkpoint.entries
        stored = {n: entries[n].dtype for n in self.opened.keys}
        kinds = [{n: torch.float32 if d.is_floating_point else d for n, d in stored.items()}]
        dirs = [cache]
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


def sized_plane(anchor: str | os.PathLike, source: str | os.PathLike,
                matched: str | os.PathLike, split: Split, grid: int = 21,
                margin: float = 0.25, device: str | torch.device = "cpu",
                batch_size: int = 512, progress: Progress | None = None,
                group: Group = SINGLE, match_info: MatchInfo | None = None,
                layers: list[int] | None = None) -> Plane | None:
    """`rotviz.measures.plane.loss_plane` through A (`anchor`), B (`source`) and B'
    (`matched`, the source matched already: `match_info` says how), three checkpoint folders
    held as stored, each grid point (1 - a - b) A + a B + b B' built block by block. B' must
    lie off the A-B line (a plane without matching has no second direction here). Under
    torchrun (`group`) the grid is shared and rank 0 returns the plane (None elsewhere)."""
    GRID.check(grid)
    MARGIN.check(margin)
    t0 = time.perf_counter()
    held = Held([anchor, source, matched], split, device, batch_size)
    aliases = {alias for alias, _ in held.models[0].tied}
    bb = bc = cc = 0.0
    for n in held.keys:
        a, b, c = (t[n] for t in held.tensors)
        if not a.is_floating_point() or n in aliases:
            continue
        d_b = (b.float() - a.float()).double()
        d_c = (c.float() - a.float()).double()
        bb += float((d_b * d_b).sum())
        bc += float((d_b * d_c).sum())
        cc += float((d_c * d_c).sum())
    n1, c, n2 = plane_frame(bb, bc, cc)
    if n2 <= 1e-6 * n1:
        raise RotvizError("the matched source lies on the anchor-source line, so the plane has "
                          "no second direction; at size rotviz draws no random one: match "
                          "with --match (e.g. seed) or raise --max-memory")
    pts = plane_points(n1, c, n2)
    xs, ys = plane_axes(pts, n1, margin, grid, False)

    def at(x: float, y: float) -> tuple[float, float]:
        a, b = plane_coeffs(x, y, n1, c, n2)
        return held.loss_acc((1.0 - a - b, a, b))[:2]

    corners = {"A": (1.0, 0.0, 0.0), "B": (0.0, 1.0, 0.0), "B'": (0.0, 0.0, 1.0),
               "AB'": (0.5, 0.0, 0.5)}

    def named(name: str) -> tuple[float, float]:
        if name in corners:
            return held.loss_acc(corners[name])[:2]
        return at(*pts[name])

    found = plane_grid(at, named, pts, xs, ys, progress, group)
    if found is None:
        return None
    loss, acc, point_loss, point_acc = found
    info = match_info or MatchInfo("none", 0.0, 0.0, None, 0.0)
    return Plane(
        xs=xs.tolist(), ys=ys.tolist(), loss=loss.tolist(), acc=acc.tolist(),
        points={k: [float(v[0]), float(v[1])] for k, v in pts.items()},
        point_loss=point_loss, point_acc=point_acc, match=info.match, data=split.data,
        split=split.split, device=str(held.device), seconds=time.perf_counter() - t0,
        grid=grid, n=split.n, layers=layers, anchor=held.models[0].ref,
        source=held.models[1].ref, distance_ab=n1, distance_ab_matched=math.hypot(*pts["B'"]),
        degenerate=False)

"""Curves, planes and merges of models held in their stored dtype, built one block at a time.

`rotviz.analysis.landscape.interpolate` holds the anchor, the source and each point of the
path in float32: 3x a model's float32 bytes, 84 GB for a 7B pair. Here both checkpoints are
held as they are stored (bf16: 2 x 14 GB for 7B) on the device, and each point of the path
is never made whole: every block's weights, (1 - alpha) anchor + alpha source in float32,
are built just before the block runs and dropped after it (rotviz.skeleton); embeddings and
output heads likewise, the small tensors outside the blocks when the point starts. Logits
are bounded per batch as everywhere (rotviz.evaluation.fit_batch). Planes hold three
checkpoints (anchor, source, matched source) and build each grid point the same way; the
simple merge is the path's point at its weight, written tensor by tensor. The source is
taken as given: match it first (rotviz.stream.match writes a matched checkpoint; the
CLI's --max-memory does both).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rotviz.analysis.fusion import Merged, check_weight
from rotviz.analysis.landscape import (
    Curve,
    Plane,
    check_path,
    path_points,
    plane_axes,
    plane_coeffs,
    plane_frame,
    plane_grid,
    plane_points,
)
from rotviz.checkpoint import ShardWriter
from rotviz.data import Split
from rotviz.devices import wide_device
from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator, check_split
from rotviz.limits import GRID, MARGIN
from rotviz.match.endpoints import MatchInfo
from rotviz.memory import release
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


class Held:
    """Checkpoints of one architecture held as stored on the device, each point a weighted
    sum of them built block by block while the anchor's module (on meta) runs on a split."""

    def __init__(self, refs: list[str | os.PathLike], split: Split,
                 device: str | torch.device = "cpu", batch_size: int = 512):
        check_split(split)
        self.models = [open_streamed(r) for r in refs]
        for m in self.models[1:]:
            check_compatible(self.models[0], m)  # type: ignore[arg-type]  # duck-typed
        self.device = torch.device(wide_device(device))
        self.keys = self.models[0].checkpoint.keys()
        self.tensors = [{k: v.to(self.device) for k, v in m.checkpoint.read(self.keys).items()}
                        for m in self.models]
        self.held_bytes = sum(t.numel() * t.element_size()
                              for ts in self.tensors for t in ts.values())
        loaded = sized_loaded(self.models[0])
        self.ev = Evaluator(loaded, split, self.device, batch_size)
        self.module = self.ev.module  # the module evaluations run (rotviz.evaluation)

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
    `rotviz.analysis.landscape.interpolate` gives it for a source already matched
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
    how) with a registered method that combines tensor by tensor without statistics (simple,
    task arithmetic, TIES, DARE, SLERP, Model Stock: `MergeMethod.at_size`) and its `params`,
    about the checkpoint folder `base` for a method that needs one; evaluated on `split` with
    the two endpoints as `rotviz.analysis.fusion.merge` does, each merged tensor built just
    before its block runs (the base held as stored beside the pair); written as shards in the
    anchor's dtypes into the empty `folder` when given, with its config and tokenizer and
    processor files. Fisher and RegMean need statistics of whole models and are refused."""
    from rotviz.analysis.fusion import method_params
    from rotviz.merging import check_base
    from rotviz.merging import method as method_record
    from rotviz.merging.combine import combine_one, merge_job

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
    held = Held(refs, split, device, batch_size)
    pad = (0.0,) * (len(refs) - 2)
    w = (1.0 - weight, weight)
    first = held.models[0]
    if m.name == "simple":  # the path's point at the weight, as the curves build it
        def merged(names) -> dict[str, Tensor]:
            return held.mix(w, names)
    else:
        from rotviz.sources import source_of

        job = merge_job(sized_loaded(first), m, w, None, values)
        owner = dict(first.tied)  # a tied alias merges as its owner, so they stay one tensor
        # the module's name of each tensor, which the method sees (DARE seeds its drop by it),
        # so a streamed merge equals the in-memory one
        module_name = source_of(first.spec).checkpoint_names(held.module, list(held.keys))

        def merged(names) -> dict[str, Tensor]:
            out = {}
            for n in names:
                key = owner.get(n, n) if owner.get(n, n) in held.keys else n
                ts = [t[key] for t in held.tensors]
                if not ts[0].is_floating_point():
                    out[n] = ts[0]
                    continue
                b = ts[2].float() if base is not None else None
                out[n] = combine_one(m, job, module_name.get(key, key),
                                     [ts[0].float(), ts[1].float()], b).float()
            return out

    per, scores = held.run(merged, lambda k: merged(first.block_keys[k]))
    loss, acc = float(per[0].sum() / per[2].sum()), float(per[1].sum() / per[2].sum())
    a_loss, a_acc, a_scores = held.loss_acc((1.0, 0.0, *pad))
    s_loss, s_acc, s_scores = held.loss_acc((0.0, 1.0, *pad))
    if folder is not None:
        entries = first.checkpoint.entries
        plan = [(n, entries[n].dtype, entries[n].shape) for n in held.keys]
        writer = ShardWriter(folder, plan, first.checkpoint.largest_file_bytes())
        try:
            for n in held.keys:
                writer.write(n, merged([n])[n].to(device="cpu", dtype=entries[n].dtype))
            writer.close()
        finally:
            writer.abort()
        shutil.copyfile(first.path / "config.json", folder / "config.json")
        copy_reading_files(first.path, folder)
    info = match_info or MatchInfo("none", 0.0, 0.0, None, 0.0)
    return Merged(
        method=m.name, match=info.match, weight=weight, loss=loss, acc=acc,
        anchor_loss=a_loss, anchor_acc=a_acc, source_loss=s_loss, source_acc=s_acc,
        data=split.data, split=split.split, stats_split=None, batches=8, batch_size=32,
        alpha=None, device=str(held.device), n=split.n, seconds=time.perf_counter() - t0,
        match_seconds=info.seconds, stats_seconds=0.0, distance_before=info.distance_before,
        distance_after=info.distance_after, anchor=first.ref, source=held.models[1].ref,
        layers=layers, scores=scores, anchor_scores=a_scores, source_scores=s_scores,
        base="" if base is None else held.models[2].ref,
        params={k: v for k, v in values.items() if k in m.extra})


def sized_plane(anchor: str | os.PathLike, source: str | os.PathLike,
                matched: str | os.PathLike, split: Split, grid: int = 21,
                margin: float = 0.25, device: str | torch.device = "cpu",
                batch_size: int = 512, progress: Progress | None = None,
                group: Group = SINGLE, match_info: MatchInfo | None = None,
                layers: list[int] | None = None) -> Plane | None:
    """`rotviz.analysis.landscape.loss_plane` through A (`anchor`), B (`source`) and B'
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

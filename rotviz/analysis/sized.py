"""Loss curves of models held in their stored dtype, interpolated one block at a time.

`rotviz.analysis.landscape.interpolate` holds the anchor, the source and each point of the
path in float32: 3x a model's float32 bytes, 84 GB for a 7B pair. Here both checkpoints are
held as they are stored (bf16: 2 x 14 GB for 7B) on the device, and each point of the path
is never made whole: every block's weights, (1 - alpha) anchor + alpha source in float32,
are built just before the block runs and dropped after it (rotviz.skeleton); embeddings and
output heads likewise, the small tensors outside the blocks when the point starts. Logits
are bounded per batch as everywhere (rotviz.evaluation.fit_batch). The source is taken as
given: match it first (rotviz.match.streaming writes a matched checkpoint).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from rotviz.analysis.landscape import Curve, MatchInfo, path_points
from rotviz.data import Split
from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator, check_split
from rotviz.limits import POINTS, REPEATS
from rotviz.match.streaming import Streamed, open_streamed
from rotviz.memory import release
from rotviz.models import Loaded, check_compatible, read_config, wide_device
from rotviz.skeleton import build_meta
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
    POINTS.check(points)
    REPEATS.check(repeats)
    check_split(split)
    if repeats > split.n:
        raise RotvizError(f"repeats must be between 1 and the split size {split.n}, got {repeats}")
    t0 = time.perf_counter()
    a, s = open_streamed(anchor), open_streamed(source)
    check_compatible(a, s)  # type: ignore[arg-type]  # duck-typed: meta state
    device = torch.device(wide_device(device))
    keys = a.checkpoint.keys()
    held_a = {k: v.to(device) for k, v in a.checkpoint.read(keys).items()}
    held_s = {k: v.to(device) for k, v in s.checkpoint.read(keys).items()}
    held = sum(t.numel() * t.element_size() for t in (*held_a.values(), *held_s.values()))
    loaded = sized_loaded(a)
    module = loaded.model
    ev = Evaluator(loaded, split, device, batch_size)

    def evaluate(alpha: float) -> tuple:
        def mix(ns) -> dict[str, Tensor]:
            out = {}
            for n in ns:
                x, y = held_a[n], held_s[n]
                out[n] = torch.lerp(x.float(), y.float(), alpha) if x.is_floating_point() \
                    else x
            return out

        runner = a.runner(module, mix, lambda k: mix(a.block_keys[k]))
        try:
            scored: list[dict[str, float]] = []
            return ev.per_sample({}, scored), scored[0]
        finally:
            runner.close()
            release()

    alphas = np.linspace(0.0, 1.0, points).tolist()
    fields = path_points(evaluate, alphas, ev.n, split.task, repeats, seed, progress, group)
    if fields is None:
        return None
    info = match_info or MatchInfo("none", 0.0, 0.0, None, 0.0)
    return SizedCurve(
        **fields, match=info.match, data=split.data, split=split.split, device=str(device),
        seconds=time.perf_counter() - t0, n=split.n, layers=layers, anchor=a.ref, source=s.ref,
        distance_before=info.distance_before, distance_after=info.distance_after,
        max_output_diff=info.max_output_diff, match_seconds=info.seconds, held_bytes=held)

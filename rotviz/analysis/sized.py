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
from dataclasses import dataclass, field

import numpy as np
import torch

from rotviz.data import Split
from rotviz.evaluation import Evaluator, barrier_of
from rotviz.limits import POINTS
from rotviz.match.streaming import Streamed, open_streamed
from rotviz.memory import release
from rotviz.models import Loaded, check_compatible, read_config, wide_device
from rotviz.skeleton import build_meta
from rotviz.types import Progress

Tensor = torch.Tensor


@dataclass
class SizedCurve:
    """Loss and accuracy along (1 - alpha) anchor + alpha source, built block by block."""

    alphas: list[float]
    loss: list[float]
    acc: list[float]
    barrier: float
    anchor: str
    source: str
    device: str
    seconds: float
    n: int
    held_bytes: int  # both checkpoints as stored, on the device
    scores: dict[str, list[float]] = field(default_factory=dict)


def sized_loaded(model: Streamed) -> Loaded:
    """A `Loaded` of `model` whose module has no weights (meta parameters): what data
    reading and evaluation ask of a model (its config, tokenizer, image shape) without the
    model in memory."""
    module, _ = build_meta(model.spec, read_config(model.path), model.stored_dtype)
    return Loaded(model.ref, model.path, model.config, model.spec, module,
                  dict(module.state_dict()), {})


def sized_curve(anchor: str | os.PathLike, source: str | os.PathLike, split: Split,
                points: int = 21, device: str | torch.device = "cpu", batch_size: int = 512,
                progress: Progress | None = None) -> SizedCurve:
    """The straight path from `anchor` to `source` (checkpoint folders) at `points` alphas on
    `split` (read through the anchor: rotviz.evaluation.split_for(sized_loaded(...)))."""
    POINTS.check(points)
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
    alphas = np.linspace(0.0, 1.0, points).tolist()

    def at(alpha: float):
        def mix(ns) -> dict[str, Tensor]:
            out = {}
            for n in ns:
                x, y = held_a[n], held_s[n]
                out[n] = torch.lerp(x.float(), y.float(), alpha) if x.is_floating_point() \
                    else x
            return out
        return mix

    done: dict[int, tuple] = {}
    for j in range(points):
        mix = at(alphas[j])
        runner = a.runner(module, mix, lambda k, mix=mix: mix(a.block_keys[k]))
        try:
            scored: list[dict[str, float]] = []
            done[j] = (ev.per_sample({}, scored), scored[0])
        finally:
            runner.close()
            release()
        if progress:
            progress(j + 1, points, f"alpha = {alphas[j]:.3f}")
    per = [done[j][0] for j in range(points)]
    loss = [float(p[0].sum() / p[2].sum()) for p in per]
    acc = [float(p[1].sum() / p[2].sum()) for p in per]
    scores = {m: [done[j][1][m] for j in range(points)] for m in done[0][1]}
    return SizedCurve(alphas, loss, acc, barrier_of(alphas, loss), a.ref, s.ref, str(device),
                      time.perf_counter() - t0, split.n, held, scores)

"""The seeded training loop behind every recipe: same seed, same machine, same weights.

Determinism on the CPU needs three things, all scoped to the call and restored after it:
a fixed thread count (float sums are split across threads differently for other counts),
deterministic algorithms, and a private RNG state (`fork_rng`) seeded for initialisation,
while a `torch.Generator` of its own drives shuffling. The caller's RNG, thread count and
determinism setting are left as they were.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rotviz.arch import spec_named
from rotviz.data import Split
from rotviz.errors import RotvizError
from rotviz.types import Progress
from rotviz.zoo.recipes import Recipe

TRAIN_THREADS = 1  # tiny models gain nothing from more; one thread is also reproducible anywhere


@dataclass
class TrainResult:
    model: nn.Module  # in eval mode, on the CPU
    seconds: float
    steps: int
    epoch_losses: list[float]  # mean training loss of each epoch


@contextmanager
def deterministic_cpu(seed: int, threads: int = TRAIN_THREADS) -> Iterator[None]:
    """Seeded, single-configuration CPU execution inside the block; restores the caller's state."""
    old_threads = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    old_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det, warn_only=old_warn)


def select(split: Split, subset: str) -> Split:
    """All training examples, or the even- or odd-numbered half (for fine-tune pairs)."""
    if subset == "all":
        return split
    start = {"even": 0, "odd": 1}.get(subset)
    if start is None:
        raise RotvizError(f"unknown subset '{subset}': use all, even or odd")
    return split.take(torch.arange(start, split.n, 2))


def _schedule(step: int, warmup: int, total: int) -> float:
    """Linear warm-up to 1, then cosine decay to 0 (a factor on the base learning rate)."""
    warm = min(1.0, (step + 1) / max(1, warmup))
    return warm * 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(1, total)))


def _loss(model: nn.Module, family: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(**{spec_named(family).input_key: x}).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def train(
    recipe: Recipe,
    seed: int,
    data: Split,
    init_state: Mapping[str, torch.Tensor] | None = None,
    progress: Progress | None = None,
) -> TrainResult:
    """Train the recipe's model on `data` (the training split, already subset) from `seed`.

    With `init_state` the model starts from those weights (a fine-tune); they are copied,
    never modified.
    """
    if data.n == 0:
        raise RotvizError(f"no training examples in '{data.data}' ({data.split})")
    with deterministic_cpu(seed):
        model = recipe.build_model()
        if init_state is not None:
            missing, unexpected = model.load_state_dict(dict(init_state), strict=False)
            if [k for k in missing if "lm_head" not in k] or unexpected:
                raise RotvizError(f"the initial weights do not fit recipe '{recipe.name}'")
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
        per_epoch = math.ceil(data.n / recipe.batch_size)
        total = recipe.epochs * per_epoch
        warmup = round(recipe.warmup_epochs * per_epoch)
        if recipe.schedule == "constant":
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        else:
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _schedule(s, warmup, total))
        gen = torch.Generator().manual_seed(seed)
        start, step, losses = time.perf_counter(), 0, []
        for epoch in range(recipe.epochs):
            order = torch.randperm(data.n, generator=gen)
            run = 0.0
            for i in range(0, data.n, recipe.batch_size):
                ix = order[i : i + recipe.batch_size]
                loss = _loss(model, recipe.family, data.inputs[ix], data.labels[ix])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if recipe.grad_clip:
                    nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
                opt.step()
                sched.step()
                step += 1
                value = loss.item()
                run += value * len(ix)
                if progress:
                    msg = f"epoch {epoch + 1}/{recipe.epochs} loss {value:.3f}"
                    progress(step, total, msg)
            losses.append(run / data.n)
            if not math.isfinite(losses[-1]):
                raise RotvizError(f"training of '{recipe.name}' diverged (loss {losses[-1]}); "
                                  "lower the learning rate")
        model.eval()
        model.requires_grad_(False)
    return TrainResult(model, time.perf_counter() - start, step, losses)

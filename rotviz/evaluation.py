"""Task loss and accuracy of a model, or of any parameter set evaluated on its module. The data
a model reads, and the checks that it fits: rotviz.data.reading."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from rotviz.data.inputs import Inputs, to_device
from rotviz.data.reading import check_fits
from rotviz.data.split import Split
from rotviz.data.splits import IGNORE
from rotviz.data.tasks import (
    LM_TASKS,
    batch_loss,
    predictions,
    sample_losses,
    scores,
)
from rotviz.devices import resolve_device
from rotviz.errors import RotvizError
from rotviz.limits import BATCH_SIZE
from rotviz.sources.adapters import call
from rotviz.sources.loading import Loaded, to_wide
from rotviz.sources.running import (
    attending_module,
    attention_positions,
    forward,
    module_copy,
)

Tensor = torch.Tensor
# Logits held at once, in elements: a language model's batches shrink to stay below it, so a
# large vocabulary never materialises (batch, length, vocabulary) logits beyond 128 MB of
# float32 (a 32k vocabulary, 64-token windows: 16 windows at a time).
LOGIT_ELEMENTS = 2**25
# Models of at most this many parameters evaluate the points of a grid side by side on the CPU
# (Evaluator.evaluate_each): their operations are too small to split well across threads, so
# one single-threaded worker per thread gains 20 to 25% (the default pair's 21 x 21 plane, on
# 2 cores). Larger models keep torch's own threads, and one point's memory at a time.
SIDE_BY_SIDE_PARAMS = 20_000_000
# Several points in one pass (Evaluator.per_sample_many: torch.func.vmap over stacked parameter
# sets): at most this many at once, and on the CPU only while one point's pass over the split
# costs at most BATCHED_WORK multiply-adds (parameters x positions read). Above it a pass is
# bound by arithmetic, which batching does not reduce, and vmap's batched linear layers (a
# bmm and a separate bias add) run slower than one point's fused addmm: the default pair's
# 397 digits (0.9e9) took 1.3 to 1.5x longer batched; the tiny family models' passes, bound by
# dispatching each operation, run 1.3 to 2.8x faster batched (docs/conventions.md,
# Evaluation; bench/RESULTS.md, `landscape-peer`). On a GPU the memory budget alone decides.
MAX_POINTS_PER_PASS = 32
BATCHED_WORK = 50_000_000
# the share of free memory (the GPU's, or the machine's on the CPU) a pass of stacked points
# may fill: its stacked parameter sets and a few activations of each point
POINTS_MEMORY_SHARE = 0.25
Item = TypeVar("Item")
Out = TypeVar("Out")


def fit_batch(loaded: Loaded, split: Split, batch_size: int) -> int:
    """`batch_size`, or fewer rows for a language model whose logits would pass
    LOGIT_ELEMENTS (rows x positions x the model's vocabulary)."""
    if split.task not in LM_TASKS or split.inputs.dim() < 2:
        return batch_size
    vocab = int(loaded.config.get("vocab_size") or split.n_classes or 1)
    per_row = int(split.inputs.shape[1]) * max(1, vocab)
    return max(1, min(batch_size, LOGIT_ELEMENTS // per_row))


def batch_inputs(loaded: Loaded, x: Inputs) -> dict[str, torch.Tensor]:
    return dict(x) if isinstance(x, dict) else {loaded.spec.input_key: x}


def loss_and_correct(logits: torch.Tensor, y: torch.Tensor, task: str = "image"
                     ) -> tuple[float, int, int]:
    """Summed loss, number correct and number of predictions in one batch (rotviz.data.tasks)."""
    return batch_loss(task, logits, y.to(logits.device))


def evaluate(
    loaded: Loaded,
    split: Split,
    state: Mapping[str, torch.Tensor] | None = None,
    batch_size: int = 512,
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, float]:
    """Mean loss, accuracy (top-1; next-token or masked-token for language models; per
    label for multi-label; none for regression) and the task's metrics on a split
    (rotviz.data.tasks: macro-F1, entity micro-F1, ...)."""
    check_fits(loaded, split)
    batch_size = fit_batch(loaded, split, batch_size)
    total_loss, correct, count = 0.0, 0, 0
    preds, labels = [], []
    n_batches = (split.n + batch_size - 1) // batch_size
    for j, (x, y) in enumerate(split.batches(batch_size)):
        logits = forward(loaded, batch_inputs(loaded, x), state)
        bl, bc, bn = loss_and_correct(logits, y, split.task)
        total_loss, correct, count = total_loss + bl, correct + bc, count + bn
        if split.task not in LM_TASKS:
            preds.append(predictions(split.task, logits).cpu())
            labels.append(y)
        if progress:
            progress(j + 1, n_batches, "evaluating")
    acc = float("nan") if split.task == "regression" else correct / count
    out = {"loss": total_loss / count, "acc": acc, "n": split.n}
    if preds:
        out.update(scores(split.task, _cat(preds), _cat(labels), split.label_names,
                          split.n_classes))
    return out


def _cat(parts: list[Tensor]) -> Tensor:
    """Batches of per-token rows padded to different lengths, as one tensor."""
    if parts[0].dim() < 2 or len({p.shape[1] for p in parts}) == 1:
        return torch.cat(parts)
    width = max(p.shape[1] for p in parts)
    return torch.cat([F.pad(p, (0, width - p.shape[1]), value=IGNORE) for p in parts])


# ---- any parameter set on one module, the data on the device once ----------------------------


def check_split(split: Split) -> None:
    if split.n == 0:
        raise RotvizError(f"the {split.split} split of '{split.data}' is empty; use another split")


class Evaluator:
    """Per-sample loss and accuracy of any parameter set of `loaded`'s architecture on a split.

    The split is checked against the model (one-line errors), cut into batches and moved to
    `device` once. `params(state)` picks and moves the tensors a state dict contributes.
    """

    def __init__(self, loaded: Loaded, split: Split, device: str | torch.device = "cpu",
                 batch_size: int = 512):
        check_split(split)
        check_fits(loaded, split)
        BATCH_SIZE.check(batch_size)
        self.loaded = loaded
        self.split = split
        self.device = resolve_device(device)
        module = loaded.model
        # short sequences on the CPU run on an unfused twin
        # (rotviz.sources.running.attending_module)
        self.module = attending_module(loaded, attention_positions(loaded.config, split.inputs),
                                       self.device)
        self.names = [n for n, _ in module.named_parameters()]  # tied weights: owner only
        buffers = dict(module.named_buffers())
        self.buffers = {n: b.to(self.device) for n, b in buffers.items()}
        # floating persistent buffers travel with the parameters (interpolated, merged)
        self.names += [n for n, b in buffers.items() if b.is_floating_point() and n in loaded.state]
        dev = self.device
        dtype = next(module.parameters()).dtype  # images in it (rotviz.data.inputs.to_device)
        self.batches = [(to_device(x, dev, dtype), y.to(dev))
                        for x, y in split.batches(fit_batch(loaded, split, batch_size))]
        # set when vmap cannot run the module: its points are then evaluated one at a time
        self.unbatchable = False

    @property
    def n(self) -> int:
        return self.split.n

    def params(self, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The tensors of `state` this module needs, on the device (never modified)."""
        missing = [n for n in self.names if n not in state]
        if missing:
            raise RotvizError(
                f"parameter set lacks {missing[:3]}; it is not a {self.loaded.spec.family} model"
            )
        return {n: state[n].detach().to(self.device) for n in self.names}

    def logits(self, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
        return call(self.loaded.spec, self.module, {**self.buffers, **params}, x)

    def per_sample(self, params: Mapping[str, Tensor], scored: list | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Summed loss, correct predictions and predictions per sample (text: per sequence).
        With a list `scored`, the task's metrics of the same pass (rotviz.data.tasks.scores: F1,
        ...) are appended to it (empty for language models)."""
        losses, corrects, counts, preds = [], [], [], []
        task = self.split.task
        keep = scored is not None and task not in LM_TASKS
        with torch.inference_mode():
            for x, y in self.batches:
                logits = self.logits(params, x)
                loss, correct, count = sample_losses(task, logits, y, to_wide)
                losses.append(loss)
                corrects.append(correct)
                counts.append(count)
                if keep:
                    preds.append(predictions(task, logits).cpu())
            out = [torch.cat(t).cpu().numpy() for t in (losses, corrects, counts)]
        if scored is not None:
            scored.append(scores(task, _cat(preds), _cat([y.cpu() for _, y in self.batches]),
                                 self.split.label_names, self.split.n_classes) if keep else {})
        return out[0], out[1].astype(np.float64), out[2].astype(np.float64)

    def evaluate(self, params: Mapping[str, Tensor]) -> tuple[float, float]:
        """(mean loss, accuracy) over the whole split."""
        loss, correct, count = self.per_sample(params)
        return float(loss.sum() / count.sum()), float(correct.sum() / count.sum())

    def evaluate_each(self, make: Callable[[Item], Mapping[str, Tensor]], items: Sequence[Item],
                      done: Callable[[int], None] | None = None) -> list[tuple[float, float]]:
        """(mean loss, accuracy) at the parameter set `make(item)` for each item, in order;
        `done(k)` after the first k (in the calling thread, so an app's progress bar and Stop
        work; an exception raised there cancels the points not yet started). Several points a
        pass where that pays (`points_per_pass`), else shared among workers as `each` shares
        them."""
        per = self.per_sample_each(make, items, done)
        return [(float(lo.sum() / n.sum()), float(c.sum() / n.sum())) for lo, c, n in per]

    def per_sample_each(self, make: Callable[[Item], Mapping[str, Tensor]],
                        items: Sequence[Item], done: Callable[[int], None] | None = None,
                        scored: list | None = None, points: int | None = None
                        ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """`per_sample(make(item))` for each item, in order (with a list `scored`, each
        point's metrics appended to it), `done(k)` after the first k: `points` (default
        `points_per_pass`) parameter sets a pass, or, one a pass, shared among workers as
        `each` shares them. Parameter sets are made only as their pass comes, so at most one
        pass's sets are held."""
        size = points or points_per_pass(self, len(items))
        if size < 2:
            def one(ev: Evaluator, item: Item) -> tuple:
                got: list = []
                return ev.per_sample(make(item), got if scored is not None else None), got

            out = self.each(one, items, done)
            if scored is not None:
                scored.extend(got[0] for _, got in out)
            return [per for per, _ in out]
        out: list = []
        for start in range(0, len(items), size):
            chunk = items[start:start + size]
            out.extend(self.per_sample_many([make(item) for item in chunk], scored))
            if done:
                done(len(out))
        return out

    def per_sample_many(self, sets: Sequence[Mapping[str, Tensor]], scored: list | None = None
                        ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """`per_sample` of each parameter set, all of them in one pass over the split: the sets
        are stacked tensor by tensor and the module runs once per batch under torch.func.vmap
        (its functional_call on a leading axis of parameter sets), so a small model's many
        small operations are dispatched once for all the points. Each point's losses are
        then reduced exactly as `per_sample` reduces one point's logits; they differ from
        one point at a time only by the rounding of batched matrix products (1e-7 relative
        on the families' models, tests/test_eval.py). A module vmap cannot run
        (data-dependent control flow on the weights) is evaluated one set at a time."""
        if len(sets) == 1 or self.unbatchable:
            return [self.per_sample(s, scored) for s in sets]
        stacked = {n: torch.stack([self.params_one(s, n) for s in sets]) for n in self.names}
        task = self.split.task
        keep = scored is not None and task not in LM_TASKS
        k = len(sets)
        losses: list[list[Tensor]] = [[] for _ in range(k)]
        corrects: list[list[Tensor]] = [[] for _ in range(k)]
        counts: list[list[Tensor]] = [[] for _ in range(k)]
        preds: list[list[Tensor]] = [[] for _ in range(k)]
        from torch.func import vmap

        run = vmap(self.logits, in_dims=(0, None))
        with torch.inference_mode():
            for x, y in self.batches:
                try:
                    logits = run(stacked, x)
                except (RuntimeError, NotImplementedError):
                    self.unbatchable = True  # e.g. .item() on a weight-dependent tensor
                    return [self.per_sample(s, scored) for s in sets]
                for j in range(k):
                    loss, correct, count = sample_losses(task, logits[j], y, to_wide)
                    losses[j].append(loss)
                    corrects[j].append(correct)
                    counts[j].append(count)
                    if keep:
                        preds[j].append(predictions(task, logits[j]).cpu())
        labels = _cat([y.cpu() for _, y in self.batches]) if keep else None
        out = []
        for j in range(k):
            arr = [torch.cat(t).cpu().numpy() for t in (losses[j], corrects[j], counts[j])]
            out.append((arr[0], arr[1].astype(np.float64), arr[2].astype(np.float64)))
            if scored is not None:
                scored.append(scores(task, _cat(preds[j]), labels, self.split.label_names,
                                     self.split.n_classes) if keep else {})
        return out

    def params_one(self, state: Mapping[str, Tensor], name: str) -> Tensor:
        """`state[name]` on the device, as `params` takes it (one line if it is missing)."""
        if name not in state:
            raise RotvizError(f"parameter set lacks {name!r}; it is not a "
                              f"{self.loaded.spec.family} model")
        return state[name].detach().to(self.device)

    def each(self, run: Callable[[Evaluator, Item], Out], items: Sequence[Item],
             done: Callable[[int], None] | None = None) -> list[Out]:
        """`run(evaluator, item)` for each item, in order, `done(k)` after the first k.

        On the CPU, a small model's points are shared among as many workers as the caller has
        torch threads. Each worker runs single-threaded on its own twin of the module (it
        shares every tensor; torch.func's functional_call swaps a module's parameters, so two
        threads must never run one module at once). Each point is computed by the same kernels
        whichever worker takes it, so the results do not depend on the number of workers."""
        workers = min(len(items), side_by_side(self))
        if workers < 2:
            out = []
            for k, item in enumerate(items):
                out.append(run(self, item))
                if done:
                    done(k + 1)
            return out
        local = threading.local()
        threads = torch.get_num_threads()

        def start() -> None:
            torch.set_num_threads(1)  # this thread's own setting (OpenMP's and MKL's)
            local.twin = self.twin()

        def one(item: Item) -> Out:
            return run(local.twin, item)

        pool = ThreadPoolExecutor(workers, thread_name_prefix="rotviz-point", initializer=start)
        out = []
        try:
            for k, result in enumerate(pool.map(one, items)):
                out.append(result)
                if done:
                    done(k + 1)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            torch.set_num_threads(threads)  # torch keeps the last count set for new threads
        return out

    def twin(self) -> Evaluator:
        """This evaluator on its own copy of the module's structure (tensors shared), for a
        thread of its own."""
        other = copy.copy(self)
        other.module = module_copy(self.module)
        return other

    def scores(self, params: Mapping[str, Tensor]) -> dict[str, float]:
        """The task's metrics beyond loss and accuracy (rotviz.data.tasks: macro-F1, entity F1,
        MSE); empty for language models."""
        scored: list[dict[str, float]] = []
        self.per_sample(params, scored)
        return scored[0]


def side_by_side(ev: Evaluator) -> int:
    """Workers for Evaluator.evaluate_each: the caller's torch threads on the CPU for a model
    of at most SIDE_BY_SIDE_PARAMS parameters, else 1."""
    if ev.device.type != "cpu":
        return 1
    if sum(p.numel() for p in ev.module.parameters()) > SIDE_BY_SIDE_PARAMS:
        return 1
    return torch.get_num_threads()


def points_per_pass(ev: Evaluator, n_points: int, free: int | None = None) -> int:
    """How many of `n_points` parameter sets `Evaluator.per_sample_many` takes in one pass:
    1 on the CPU for a model whose pass over the split is bound by arithmetic (more than
    BATCHED_WORK multiply-adds: parameters x positions), else as many as fit
    POINTS_MEMORY_SHARE of the free memory (`free` bytes; default the GPU's free memory, or
    the machine's available memory), at most MAX_POINTS_PER_PASS. Each point holds its own
    parameter set and, per batch, about four activations as wide as the model's widest
    layer at every position (the stacked logits among them)."""
    if n_points < 2 or ev.unbatchable:
        return 1
    params = sum(ev.params_one(ev.loaded.state, n).numel() for n in ev.names)
    positions = sum(_positions(ev, x) for x, _ in ev.batches)
    if ev.device.type == "cpu" and params * positions > BATCHED_WORK:
        return 1
    if free is None:
        free = _free_memory(ev.device)
    first = next(iter(ev.loaded.state.values()))
    item = first.element_size() if first.is_floating_point() else 4
    rows = max(_positions(ev, x) for x, _ in ev.batches)
    config = ev.loaded.config
    widest = max(int(config.get("intermediate_size") or 0), 4 * int(config.get("hidden_size")
                 or 0), int(config.get("vocab_size") or 0), ev.split.n_classes or 0, 1)
    per_point = item * (params + 4 * rows * widest)
    fit = int(POINTS_MEMORY_SHARE * free // max(1, per_point)) if free else 1
    return max(1, min(n_points, MAX_POINTS_PER_PASS, fit))


def _positions(ev: Evaluator, x: Inputs) -> int:
    """Rows times positions (tokens, or an image's patches and class token) of one batch."""
    t = next(iter(x.values())) if isinstance(x, dict) else x
    return int(t.shape[0]) * (attention_positions(ev.loaded.config, x) or 1)


def _free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    from rotviz.memory import available_memory

    return available_memory() or 0


def barrier_of(alphas: Sequence[float], loss: Sequence[float]) -> float:
    """GLMC barrier: max over alpha of L(alpha) - ((1 - alpha) L(0) + alpha L(1)).

    The line is formed as torch.lerp forms it, from the nearer end (L(0) + alpha (L(1) -
    L(0)) below alpha 0.5, L(1) - (1 - alpha) (L(1) - L(0)) above): exact at both ends, and
    exactly L(0) everywhere when the two end losses are equal, so a flat path (a model
    matched onto itself) has a barrier of exactly 0, not the roundoff of (1 - alpha) L +
    alpha L (up to 1e-16 for about half the losses)."""
    a, lo = np.asarray(alphas, dtype=float), np.asarray(loss, dtype=float)
    rise = lo[-1] - lo[0]
    line = np.where(a < 0.5, lo[0] + a * rise, lo[-1] - (1 - a) * rise)
    return float(np.max(lo - line))

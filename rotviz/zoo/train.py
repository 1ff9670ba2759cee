"""The seeded training loop behind every recipe: same seed, same machine, same weights.

Determinism on the CPU needs three things, all scoped to the call and restored after it:
a fixed thread count (float sums are split across threads differently for other counts),
deterministic algorithms, and a private RNG state (`fork_rng`) seeded for initialisation,
while a `torch.Generator` of its own drives shuffling. The caller's RNG, thread count and
determinism setting are left as they were.

Text recipes (rotviz.zoo.recipes' "roberta" family) train on the task's own loss
(rotviz.data.tasks.sample_losses, what transformers computes with `labels=`): batches of padded
text are cut to their longest example, and a masked LM sees a fresh seeded 15% of its tokens
masked in every batch.
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

from rotviz.arch import max_positions, spec_named
from rotviz.data.inputs import Inputs
from rotviz.data.split import Split, load_split
from rotviz.data.splits import IGNORE
from rotviz.data.tasks import label_names, sample_losses
from rotviz.data.text import MASK_RATE
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


def _update(model: nn.Module, opt, sched, loss: torch.Tensor, grad_clip: float) -> None:
    """One optimiser step on `loss`: gradients, the recipe's clipping, Adam, the schedule."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    sched.step()


def optimiser(recipe: Recipe, params):
    """The recipe's optimiser: AdamW (decoupled weight decay), or plain SGD (no momentum;
    weight decay as an L2 term, the gradient flow d theta/dt = -grad L - lambda theta)."""
    if recipe.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, momentum=0.0,
                               weight_decay=recipe.weight_decay)
    raise RotvizError(f"recipe '{recipe.name}' names optimizer '{recipe.optimizer}': use "
                      "adamw or sgd")


def _loss(model: nn.Module, family: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(**{spec_named(family).input_key: x}).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def recipe_split(recipe: Recipe, split: str = "train") -> Split:
    """One split of the recipe's data, read the way its model will read it: images and
    characters as they are; text through the recipe's tokenizer, as masked-LM windows or as
    labelled rows for its classifier head (rotviz.data.labelled)."""
    if recipe.tokenizer is None:
        return load_split(recipe.data, split)
    from rotviz.data.files import data_path
    from rotviz.data.labelled import Labelling
    from rotviz.data.tokens import text_encoding

    folder = data_path(recipe.tokenizer)
    if not (folder / "tokenizer.json").is_file():
        raise RotvizError(f"recipe '{recipe.name}' reads text with the tokenizer in "
                          f"'{folder}', which is missing; write it again with: "
                          "python -m rotviz.zoo.nlp")
    reader = text_encoding(folder, {}, f"recipe '{recipe.name}'")
    task = recipe.task
    if task == "masked":
        return load_split(recipe.data, split, 0, reader, masked=True)
    config = recipe.model
    lab = Labelling(task, label_names(config), int(config["pad_token_id"]),
                    max_positions(spec_named(recipe.family), config, 512))
    return load_split(recipe.data, split, 0, reader, labelling=lab)


def _trimmed(x: Inputs, y: torch.Tensor) -> tuple[Inputs, torch.Tensor]:
    """A padded batch cut to its longest example (per-token labels too): the same losses,
    less work."""
    if isinstance(x, torch.Tensor) or "attention_mask" not in x:
        return x, y
    width = int(x["attention_mask"].sum(1).max())
    x = {k: v[:, :width] for k, v in x.items()}
    return x, (y[:, :width] if y.dim() > 1 else y)


class _Masker:
    """Masked-LM batches drawn afresh from `gen` (BERT's recipe): MASK_RATE of the ordinary
    tokens, at least one per window, become targets; 80% of them are replaced by the mask
    token, 10% by a random token and 10% kept. Reads the windows of a masked split (the
    hidden ids put back) and its tokenizer."""

    def __init__(self, data: Split):
        reader = data.how.get("reader")
        if reader is None or reader.tokenizer is None:
            raise RotvizError(f"'{data.data}' is masked-LM data without a tokenizer; read it "
                              "with the model's tokenizer")
        self.ids = torch.where(data.labels != IGNORE, data.labels, data.inputs)
        self.special = torch.tensor(sorted(set(reader.tokenizer.all_special_ids)),
                                    dtype=torch.long)
        self.ordinary = ~torch.isin(self.ids, self.special)
        self.mask_id, self.vocab = reader.mask_id(), int(reader.vocab_size)

    def batch(self, ix: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        ids, ordinary = self.ids[ix], self.ordinary[ix]
        draw = torch.rand(ids.shape, generator=gen)
        draw[~ordinary] = 2.0  # never chosen
        hide = draw < MASK_RATE
        hide[torch.arange(len(ix)), draw.argmin(1)] = True
        hide &= ordinary
        how = torch.rand(ids.shape, generator=gen)
        random_ids = torch.randint(self.vocab, ids.shape, generator=gen)
        x = ids.clone()
        x[hide & (how < 0.8)] = self.mask_id
        # a random ordinary token (a special one, <pad> above all, would change the
        # position ids RoBERTa counts from the padding)
        swap = hide & (how >= 0.8) & (how < 0.9) & ~torch.isin(random_ids, self.special)
        x[swap] = random_ids[swap]
        return x, torch.where(hide, ids, torch.full_like(ids, IGNORE))


def _task_loss(model: nn.Module, task: str, x: Inputs, y: torch.Tensor) -> torch.Tensor:
    """The task's mean loss over what it counts (examples, labelled tokens or masked
    tokens), as transformers' `labels=` loss."""
    inputs = {"input_ids": x} if isinstance(x, torch.Tensor) else x
    logits = model(**inputs).logits
    loss, _, count = sample_losses(task, logits, y, lambda t: t)
    return loss.sum() / count.sum().clamp(min=1)


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
            # a pretrained encoder fine-tuned with a new head: its LM head is dropped and
            # the new head starts from the seeded initialisation
            fresh, dropped = ((("classifier.",), ("lm_head.",))
                              if recipe.task in ("seq-cls", "token-cls") else ((), ()))
            if ([k for k in missing if "lm_head" not in k and not k.startswith(fresh)]
                    or [k for k in unexpected if not k.startswith(dropped)]):
                raise RotvizError(f"the initial weights do not fit recipe '{recipe.name}'")
        model.train()
        opt = optimiser(recipe, model.parameters())
        per_epoch = math.ceil(data.n / recipe.batch_size)
        total = recipe.epochs * per_epoch
        warmup = round(recipe.warmup_epochs * per_epoch)
        if recipe.schedule == "constant":
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        else:
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _schedule(s, warmup, total))
        gen = torch.Generator().manual_seed(seed)
        text = recipe.tokenizer is not None  # padded text, the task's own loss
        masker = _Masker(data) if text and recipe.task == "masked" else None
        start, step, losses = time.perf_counter(), 0, []
        for epoch in range(recipe.epochs):
            order = torch.randperm(data.n, generator=gen)
            run = 0.0
            for i in range(0, data.n, recipe.batch_size):
                ix = order[i : i + recipe.batch_size]
                if masker is not None:
                    loss = _task_loss(model, "masked", *masker.batch(ix, gen))
                elif text:
                    x, y = _trimmed(data.inputs_at(ix), data.labels[ix])
                    loss = _task_loss(model, recipe.task, x, y)
                else:
                    loss = _loss(model, recipe.family, data.inputs[ix], data.labels[ix])
                _update(model, opt, sched, loss, recipe.grad_clip)
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


# ---- runs between steps: a parent run and the children spawned from it ------------------------


@dataclass
class RunState:
    """A training run at `step`: its weights and its optimiser's state (Adam's moments and
    the learning rate the schedule has reached), so that a child spawned there goes on
    exactly as the parent would have, but for its data order."""

    step: int
    model: dict[str, torch.Tensor]
    optimiser: dict


def data_order(n: int, order_seed: int, epoch: int) -> torch.Tensor:
    """The examples' order in `epoch` of a run whose data order is `order_seed`: its own
    seeded permutation per epoch, so that a run started mid-way (a spawned child) draws the
    same order as one that ran from the start with that seed."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(order_seed * 100_003 + epoch))


def run_steps(recipe: Recipe, seed: int, data: Split, order_seed: int, keep: set[int],
              start: RunState | None = None, progress: Progress | None = None,
              stop: int | None = None) -> dict[int, RunState]:
    """Train the recipe's model (initialised from `seed`, or from `start`) on `data` in the
    order `order_seed` draws, from step `start.step` (0 without) to the recipe's last step;
    returns the states at the steps in `keep` (a copy each). Images only (the ViT recipes):
    the spawn series of the zoo (rotviz.zoo.spawn). Deterministic like `train`. `stop`: end
    there instead (a short series, rotviz.zoo.series)."""
    if recipe.tokenizer is not None or recipe.family != "vit":
        raise RotvizError(f"recipe '{recipe.name}' is not an image recipe; spawn runs train "
                          "the ViT recipes")
    per_epoch = math.ceil(data.n / recipe.batch_size)
    total = recipe.epochs * per_epoch
    warmup = round(recipe.warmup_epochs * per_epoch)
    first = 0 if start is None else start.step
    if not 0 <= first <= total:
        raise RotvizError(f"a run of recipe '{recipe.name}' has {total} steps; it cannot start "
                          f"at step {first}")
    kept: dict[int, RunState] = {}
    with deterministic_cpu(seed):
        model = recipe.build_model()
        opt = optimiser(recipe, model.parameters())
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, (lambda s: 1.0) if recipe.schedule == "constant"
            else (lambda s: _schedule(s, warmup, total)))
        if start is not None:  # the parent's weights, moments and learning rate at its step
            model.load_state_dict({k: v.clone() for k, v in start.model.items()})
            opt.load_state_dict(_copied(start.optimiser))
            sched.last_epoch = first
        model.train()

        def keep_now(step: int) -> None:
            if step in keep:
                kept[step] = RunState(step, {k: v.detach().clone() for k, v in
                                             model.state_dict().items()},
                                      _copied(opt.state_dict()))

        keep_now(first)
        order = None
        for step in range(first, total if stop is None else min(stop, total)):
            epoch, b = divmod(step, per_epoch)
            if order is None or b == 0:
                order = data_order(data.n, order_seed, epoch)
            ix = order[b * recipe.batch_size:(b + 1) * recipe.batch_size]
            loss = _loss(model, recipe.family, data.inputs[ix], data.labels[ix])
            _update(model, opt, sched, loss, recipe.grad_clip)
            if not math.isfinite(loss.item()):
                raise RotvizError(f"training of '{recipe.name}' diverged; lower the learning "
                                  "rate")
            keep_now(step + 1)
            if progress:
                progress(step + 1, total, f"step {step + 1}/{total} loss {loss.item():.3f}")
    return kept


def _copied(state: dict) -> dict:
    """A deep copy of an optimiser's state dict (tensors cloned)."""
    import copy

    return copy.deepcopy(state)


class Saver:
    """Writes a recipe's trained states as model folders and scores each on the test split:
    one shell module of the recipe (built under the run's seed, so the caller's RNG is kept)
    that every state is loaded into, saved by the family's weight source, and read back
    through the loader, as a user would, for its test loss and accuracy (the card's)."""

    def __init__(self, rec: Recipe, seed: int):
        from rotviz.sources.adapters import source_of

        self.rec = rec
        self.test = load_split(rec.data, "test")
        self.source = source_of(spec_named(rec.family))
        with deterministic_cpu(seed):
            self.module = rec.build_model()

    def save(self, state: Mapping[str, torch.Tensor], folder) -> dict[str, float]:
        """`state` written into `folder` (which exists); its test loss and accuracy."""
        from rotviz.evaluation import evaluate
        from rotviz.sources import loading

        self.module.load_state_dict(state)
        self.source.save_module(self.module, self.rec.hf_config().to_dict(), folder)
        with deterministic_cpu(0, TRAIN_THREADS):
            m = evaluate(loading.load_model(folder), self.test)
        return {"loss": m["loss"], "acc": m["acc"]}


def built_on() -> dict:
    """Where and when a zoo model was built, for its card."""
    import platform
    from datetime import datetime, timezone

    return {"threads": TRAIN_THREADS, "python": platform.python_version(),
            "platform": f"{platform.system()} {platform.machine()}",
            "built": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}

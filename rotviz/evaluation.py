"""Task loss and accuracy of a model, or of any parameter set evaluated on its module."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from rotviz.arch import max_positions
from rotviz.confine import ANYWHERE, Confined
from rotviz.data.inputs import Inputs, to_device
from rotviz.data.labelled import LABELLED_KINDS, Columns, Labelling
from rotviz.data.split import IMAGE_FILES, TEXT_SOURCES, Split, load_split
from rotviz.data.splits import IGNORE
from rotviz.data.tasks import (
    CLASSIFIER_TASKS,
    LM_HEADS,
    LM_TASKS,
    MASKED_HEADS,
    batch_loss,
    head_class,
    label_names,
    named_labels,
    predictions,
    sample_losses,
    scores,
    task_of_config,
)
from rotviz.data.tokens import (
    CHARS,
    encoding_fingerprint,
    image_reading,
    processor_fingerprint,
    text_encoding,
)
from rotviz.devices import resolve_device
from rotviz.errors import RotvizError
from rotviz.heads import SCORED_HEADS, WEIGHTS_ONLY, head_of_config
from rotviz.limits import BATCH_SIZE
from rotviz.sources.adapters import call, source_of
from rotviz.sources.loading import Loaded, to_wide
from rotviz.sources.running import (
    attending_module,
    attention_positions,
    forward,
    image_shape,
    module_copy,
)

Tensor = torch.Tensor
LABELLED = "csv:, tsv:, jsonl:, conll: or hf:"
# Logits held at once, in elements: a language model's batches shrink to stay below it, so a
# large vocabulary never materialises (batch, length, vocabulary) logits beyond 128 MB of
# float32 (a 32k vocabulary, 64-token windows: 16 windows at a time).
LOGIT_ELEMENTS = 2**25
# Models of at most this many parameters evaluate the points of a grid side by side on the CPU
# (Evaluator.evaluate_each): their operations are too small to split well across threads, so
# one single-threaded worker per thread gains 20 to 25% (the default pair's 21 x 21 plane, on
# 2 cores). Larger models keep torch's own threads, and one point's memory at a time.
SIDE_BY_SIDE_PARAMS = 20_000_000
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


def head_of(loaded: Loaded) -> str:
    return head_class(loaded.config)


def is_masked_lm(loaded: Loaded) -> bool:
    return head_of(loaded).endswith(MASKED_HEADS)


def task_of(loaded: Loaded) -> str | None:
    """The task the model's head was trained for (rotviz.data.tasks); None for a bare text model."""
    return task_of_config(loaded.spec.inputs, loaded.config)


def labelling(loaded: Loaded, columns: Columns | None = None,
              seq_len: int | None = None, confined: Confined = ANYWHERE) -> Labelling:
    """What labelled data must say for this classifier (its task, labels, padding, length)."""
    task = task_of(loaded)
    if task not in CLASSIFIER_TASKS:
        raise RotvizError(
            f"{loaded.ref} ({head_of(loaded) or 'no head'}) is not a text classifier, so "
            f"labelled data ({LABELLED}) does not fit it; give text:FILE or pystdlib, or a "
            "...ForSequenceClassification / ...ForTokenClassification model")
    longest = max_positions(loaded.spec, loaded.config, 512)
    length = int(seq_len or longest)
    if length > longest:
        raise RotvizError(f"--seq-len {length} is longer than {loaded.ref} takes ({longest})")
    reader = text_encoding(loaded.path, loaded.config, loaded.ref, confined)
    pad = getattr(reader.tokenizer, "pad_token_id", None)
    if pad is None:
        pad = loaded.config.get("pad_token_id")
    if pad is None:
        raise RotvizError(
            f"{loaded.ref} has no padding token (neither its tokenizer nor its config's "
            "pad_token_id), which batches of texts of different lengths need; set "
            "pad_token_id in its config.json (a sequence classifier reads the last token "
            "before the padding)")
    return Labelling(task, label_names(loaded.config), int(pad), length, columns or Columns())


def split_for(loaded: Loaded, ref: str, split: str = "test", seed: int = 0,
              seq_len: int | None = None, columns: Columns | None = None,
              confined: Confined = ANYWHERE) -> Split:
    """One split of data `ref`, read the way `loaded` reads it: text through the model's own
    tokenizer (or rotviz's characters for a model that declares them), as masked-LM data for
    a masked LM, in windows of `seq_len` tokens; labelled rows (csv:, jsonl:, ...) for the
    model's classifier head, with `columns`; images as they are. One line when the model
    cannot be fed the data (first of all, a model whose head no loss scores). Every file
    (data, tokenizer, image processor) is read through `confined` (rotviz.confine; the app's
    confines reads to its roots)."""
    check_scored(loaded)
    kind = ref.partition(":")[0]
    if kind in LABELLED_KINDS:
        if loaded.spec.inputs == "pixels":
            raise RotvizError(f"'{ref}' is labelled text but {loaded.ref} is an image model")
        lab = labelling(loaded, columns, seq_len, confined)
        reader = text_encoding(loaded.path, loaded.config, loaded.ref, confined)
        return load_split(ref, split, seed, reader, labelling=lab, confined=confined)
    if loaded.spec.inputs == "pixels":
        proc = image_reading(loaded.path, confined) if loaded.path else None
        # class folders are read by name (other image data carries its labels as ids)
        names = named_labels(loaded.config, loaded.ref) if kind == "imagefolder" else None
        if proc is not None and kind in IMAGE_FILES:
            return load_split(ref, split, seed, processor=proc, names=names, confined=confined)
        return load_split(ref, split, seed, names=names, confined=confined)
    if kind not in TEXT_SOURCES:
        return load_split(ref, split, seed, confined=confined)
    task = task_of(loaded)
    if task in CLASSIFIER_TASKS:
        raise RotvizError(
            f"'{ref}' is plain text (language-model data) but {loaded.ref} is a {task} "
            f"model; give labelled data: {LABELLED}")
    reader = text_encoding(loaded.path, loaded.config, loaded.ref, confined)
    return load_split(ref, split, seed, None if reader.chars else reader,
                      is_masked_lm(loaded), seq_len, confined=confined)


def _reading(encoding: str) -> str:
    if encoding == CHARS:
        return "rotviz's character vocabulary"
    return f"another tokenizer ({encoding})" if encoding else "no vocabulary"


def check_scored(loaded: Loaded) -> None:
    """One line when no loss scores `loaded`'s head (headless, question answering, multiple
    choice, ...: rotviz.heads), before any data is read for it."""
    own = head_of_config(loaded.config)
    if not own.scored:
        raise RotvizError(
            f"{loaded.ref} ({own.class_name or 'no head class'}) has {own.words}, which no "
            f"loss scores: a measurement of the loss needs {SCORED_HEADS}; {WEIGHTS_ONLY} "
            "need no data")


def check_fits(loaded: Loaded, split: Split) -> None:
    """Data must fit the model's task: one clear line when it does not."""
    spec = loaded.spec
    check_scored(loaded)
    if spec.inputs == "pixels":
        if split.task != "image":
            raise RotvizError(
                f"'{split.data}' is {split.task} data but {loaded.ref} is an image model"
            )
        proc = processor_fingerprint(loaded.path) if loaded.path else ""
        if split.encoding != proc:
            how = "through another image processor" if split.encoding else "as they are"
            raise RotvizError(
                f"'{split.data}' images were read {how} but {loaded.ref} reads images through "
                f"{'its own image processor' if proc else 'no processor'}; load the data "
                "through the model (rotviz.evaluation.split_for), with imagefolder:DIR or "
                "cifar10:DIR for a model with a processor")
        c, size = image_shape(loaded)
        _, dc, dh, dw = split.inputs.shape
        if dc != c or dh != size or dw != size:
            raise RotvizError(
                f"'{split.data}' images are {dc}x{dh}x{dw}"
                f" but {loaded.ref} expects {c}x{size}x{size}"
            )
        n_out = source_of(spec).n_outputs(loaded.config)
        if n_out is not None and n_out != split.n_classes:
            raise RotvizError(
                f"'{split.data}' has {split.n_classes} classes"
                f" but {loaded.ref}'s head has {n_out} outputs"
            )
        check_label_order(loaded, split)
    else:
        task = task_of(loaded)
        if split.task == "image":
            raise RotvizError(f"'{split.data}' is image data but {loaded.ref} is a language model")
        want = encoding_fingerprint(loaded.path, loaded.config, loaded.ref)
        if split.encoding != want:
            own = "its own tokenizer" if want != CHARS else "rotviz's character vocabulary"
            raise RotvizError(
                f"'{split.data}' was read with {_reading(split.encoding)} but {loaded.ref} "
                f"reads text with {own}; load the data through the model "
                "(rotviz.evaluation.split_for), as the rotviz commands do"
            )
        head = head_of(loaded)
        if split.task in CLASSIFIER_TASKS or task in CLASSIFIER_TASKS:
            if split.task != task:
                raise RotvizError(
                    f"'{split.data}' was prepared as {split.task} data but {loaded.ref} "
                    f"({head}) is a {task or 'bare'} model; load the data through the model "
                    "(rotviz.evaluation.split_for), as the rotviz commands do")
            n_out = num_outputs(loaded)
            if split.n_classes != n_out:
                raise RotvizError(
                    f"'{split.data}' has {split.n_classes} labels but {loaded.ref}'s head "
                    f"has {n_out} outputs")
        elif split.labels.dim() > 1 and not head.endswith(LM_HEADS):
            raise RotvizError(
                f"'{split.data}' labels every token but {loaded.ref} ({head or 'no head'}) "
                "has no language-model head: give a ...LMHeadModel, ...ForCausalLM, "
                "...ForMaskedLM or BertForPreTraining"
            )
        if head.endswith(LM_HEADS) and (split.task == "masked") != is_masked_lm(loaded):
            want_task = "masked-LM" if is_masked_lm(loaded) else "next-token"
            raise RotvizError(
                f"'{split.data}' was prepared as {split.task} data but {loaded.ref} ({head}) "
                f"needs {want_task} data; load the data through the model "
                "(rotviz.evaluation.split_for), as the rotviz commands do"
            )
        vocab = int(loaded.config.get("vocab_size", 0))
        if split.task in CLASSIFIER_TASKS:
            if vocab and split.n and int(split.inputs.max()) >= vocab:
                raise RotvizError(f"'{split.data}' holds token ids beyond {loaded.ref}'s "
                                  f"vocabulary of {vocab}; save the model's own tokenizer")
        elif vocab and split.n_classes > vocab:
            raise RotvizError(
                f"'{split.data}' has {split.n_classes} symbols"
                f" but {loaded.ref}'s vocabulary has {vocab}"
            )
        max_pos = max_positions(spec, loaded.config, 0)
        length = int(split.inputs.shape[1]) if split.inputs.dim() > 1 else 0
        if max_pos > 0 and length > max_pos:
            raise RotvizError(
                f"'{split.data}' sequences have {length} tokens"
                f" but {loaded.ref} takes at most {max_pos}"
            )


def check_label_order(loaded: Loaded, split: Split) -> None:
    """Classes read by name (an image folder's classes) must be in the model's own order: a
    pair read through one model's names feeds the other wrong labels when it names its
    outputs in another order (the split has the anchor's ids). One line when they differ."""
    if not split.data.startswith("imagefolder:"):
        return
    own = named_labels(loaded.config, loaded.ref)
    if own is None or split.label_names == own:
        return
    shown = ", ".join(split.label_names[:6]) + (", ..." if len(split.label_names) > 6 else "")
    raise RotvizError(
        f"'{split.data}' was labelled in the order {shown} but {loaded.ref} names its outputs "
        f"{', '.join(own[:6])}{', ...' if len(own) > 6 else ''}; compare models whose "
        "config.json id2label are the same, or read the data through this model")


def batch_inputs(loaded: Loaded, x: Inputs) -> dict[str, torch.Tensor]:
    return dict(x) if isinstance(x, dict) else {loaded.spec.input_key: x}


def loss_and_correct(logits: torch.Tensor, y: torch.Tensor, task: str = "image"
                     ) -> tuple[float, int, int]:
    """Summed loss, number correct and number of predictions in one batch (rotviz.data.tasks)."""
    return batch_loss(task, logits, y.to(logits.device))


def num_outputs(loaded: Loaded) -> int:
    return int(source_of(loaded.spec).n_outputs(loaded.config) or 0)


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
        work; an exception raised there cancels the points not yet started). Shared among
        workers as `each` shares them."""
        return self.each(lambda ev, item: ev.evaluate(make(item)), items, done)

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

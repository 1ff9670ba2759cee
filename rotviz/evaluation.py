"""Task loss and accuracy of a model, or of any parameter set evaluated on its module."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from rotviz.arch import max_positions
from rotviz.data import IGNORE, Split, load_split
from rotviz.errors import RotvizError
from rotviz.limits import BATCH_SIZE
from rotviz.models import Loaded, forward, image_shape, pick_device, to_wide
from rotviz.sources import call, source_of
from rotviz.tokens import CHARS, encoding_fingerprint, text_encoding

Tensor = torch.Tensor

# Class-name endings of Hugging Face models with a per-token vocabulary head: the only ones whose
# logits fit per-token labels (next-token text; a sequence classifier has one row per text).
LM_HEADS = ("LMHeadModel", "ForCausalLM", "ForMaskedLM")
MASKED_HEADS = ("ForMaskedLM",)


def head_of(loaded: Loaded) -> str:
    return (loaded.config.get("architectures") or [""])[0]


def is_masked_lm(loaded: Loaded) -> bool:
    return head_of(loaded).endswith(MASKED_HEADS)


def split_for(loaded: Loaded, ref: str, split: str = "test", seed: int = 0,
              seq_len: int | None = None) -> Split:
    """One split of data `ref`, read the way `loaded` reads it: text through the model's own
    tokenizer (or rotviz's characters for a model that declares them), as masked-LM data
    for a masked LM, in windows of `seq_len` tokens; images as they are. One line when the
    model cannot be fed text (rotviz.tokens)."""
    kind = ref.partition(":")[0]
    if loaded.spec.inputs == "pixels" or kind not in ("pystdlib", "text"):
        return load_split(ref, split, seed)
    reader = text_encoding(loaded.path, loaded.config, loaded.ref)
    return load_split(ref, split, seed, None if reader.chars else reader,
                      is_masked_lm(loaded), seq_len)


def _reading(encoding: str) -> str:
    if encoding == CHARS:
        return "rotviz's character vocabulary"
    return f"another tokenizer ({encoding})" if encoding else "no vocabulary"


def check_fits(loaded: Loaded, split: Split) -> None:
    """Data must fit the model's task: one clear line when it does not."""
    spec = loaded.spec
    if spec.inputs == "pixels":
        if split.task != "image":
            raise RotvizError(
                f"'{split.data}' is {split.task} data but {loaded.ref} is an image model"
            )
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
    else:
        if split.task not in ("text", "masked"):
            raise RotvizError(
                f"'{split.data}' is {split.task} data but {loaded.ref} is a language model"
            )
        want = encoding_fingerprint(loaded.path, loaded.config, loaded.ref)
        if split.encoding != want:
            own = "its own tokenizer" if want != CHARS else "rotviz's character vocabulary"
            raise RotvizError(
                f"'{split.data}' was read with {_reading(split.encoding)} but {loaded.ref} "
                f"reads text with {own}; load the data through the model "
                "(rotviz.evaluation.split_for), as the rotviz commands do"
            )
        head = head_of(loaded)
        if split.labels.dim() > 1 and not head.endswith(LM_HEADS):
            raise RotvizError(
                f"'{split.data}' labels every token but {loaded.ref} ({head or 'no head'}) "
                "has no language-model head: give a ...LMHeadModel, ...ForCausalLM or "
                "...ForMaskedLM"
            )
        if head.endswith(LM_HEADS) and (split.task == "masked") != is_masked_lm(loaded):
            want_task = "masked-LM" if is_masked_lm(loaded) else "next-token"
            raise RotvizError(
                f"'{split.data}' was prepared as {split.task} data but {loaded.ref} ({head}) "
                f"needs {want_task} data; load the data through the model "
                "(rotviz.evaluation.split_for), as the rotviz commands do"
            )
        vocab = int(loaded.config.get("vocab_size", 0))
        if vocab and split.n_classes > vocab:
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


def batch_inputs(loaded: Loaded, x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {loaded.spec.input_key: x}


def loss_and_correct(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, int, int]:
    """Summed cross-entropy, number correct and number of predictions in one batch."""
    logits = logits.float().reshape(-1, logits.shape[-1])
    y = y.reshape(-1).to(logits.device)
    valid = y != IGNORE  # padding, and the tokens a masked LM is not asked for
    loss = F.cross_entropy(logits, y, reduction="sum", ignore_index=IGNORE)
    correct = ((logits.argmax(-1) == y) & valid).sum()
    return float(loss), int(correct), int(valid.sum())


def evaluate(
    loaded: Loaded,
    split: Split,
    state: Mapping[str, torch.Tensor] | None = None,
    batch_size: int = 512,
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, float]:
    """Mean loss and accuracy (top-1, or next-character for language models) on a split."""
    check_fits(loaded, split)
    total_loss, correct, count = 0.0, 0, 0
    n_batches = (split.n + batch_size - 1) // batch_size
    for j, (x, y) in enumerate(split.batches(batch_size)):
        logits = forward(loaded, batch_inputs(loaded, x), state)
        bl, bc, bn = loss_and_correct(logits, y)
        total_loss, correct, count = total_loss + bl, correct + bc, count + bn
        if progress:
            progress(j + 1, n_batches, "evaluating")
    return {"loss": total_loss / count, "acc": correct / count, "n": split.n}


# ---- any parameter set on one module, the data on the device once ----------------------------



def resolve_device(device: str | torch.device | None) -> torch.device:
    """A torch.device from 'auto', 'cpu', 'cuda', 'mps' or a torch.device."""
    if isinstance(device, torch.device):
        return device
    return pick_device(device or "auto")


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
        self.names = [n for n, _ in module.named_parameters()]  # tied weights: owner only
        buffers = dict(module.named_buffers())
        self.buffers = {n: b.to(self.device) for n, b in buffers.items()}
        # floating persistent buffers travel with the parameters (interpolated, merged)
        self.names += [n for n, b in buffers.items() if b.is_floating_point() and n in loaded.state]
        dev = self.device
        self.batches = [(x.to(dev), y.to(dev)) for x, y in split.batches(batch_size)]

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
        return call(self.loaded.spec, self.loaded.model, {**self.buffers, **params}, x)

    def per_sample(self, params: Mapping[str, Tensor]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Summed loss, correct predictions and predictions per sample (text: per sequence)."""
        losses, corrects, counts = [], [], []
        with torch.inference_mode():
            for x, y in self.batches:
                logits = self.logits(params, x).float()
                y2 = y.reshape(len(y), -1)
                lg = logits.reshape(y2.numel(), logits.shape[-1])
                loss = F.cross_entropy(lg, y2.reshape(-1), reduction="none", ignore_index=IGNORE)
                valid = y2 != IGNORE
                correct = (lg.argmax(-1).reshape(y2.shape) == y2) & valid
                losses.append(to_wide(loss.reshape(y2.shape)).sum(1))
                corrects.append(correct.sum(1))
                counts.append(valid.sum(1))
            out = [torch.cat(t).cpu().numpy() for t in (losses, corrects, counts)]
        return out[0], out[1].astype(np.float64), out[2].astype(np.float64)

    def evaluate(self, params: Mapping[str, Tensor]) -> tuple[float, float]:
        """(mean loss, accuracy) over the whole split."""
        loss, correct, count = self.per_sample(params)
        return float(loss.sum() / count.sum()), float(correct.sum() / count.sum())


def barrier_of(alphas: Sequence[float], loss: Sequence[float]) -> float:
    """GLMC barrier: max over alpha of L(alpha) - ((1 - alpha) L(0) + alpha L(1))."""
    a, lo = np.asarray(alphas, dtype=float), np.asarray(loss, dtype=float)
    return float(np.max(lo - ((1 - a) * lo[0] + a * lo[-1])))

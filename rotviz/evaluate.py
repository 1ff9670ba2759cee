"""Task loss and accuracy of a model, or of any parameter set evaluated on its module."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from rotviz.arch import max_positions
from rotviz.data import Split
from rotviz.errors import RotvizError
from rotviz.models import Loaded, forward, image_shape
from rotviz.sources import source_of

# Class-name endings of Hugging Face models with a per-token vocabulary head: the only ones whose
# logits fit per-token labels (next-character text; a sequence classifier has one row per text).
LM_HEADS = ("LMHeadModel", "ForCausalLM", "ForMaskedLM")


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
        if split.task != "text":
            raise RotvizError(
                f"'{split.data}' is {split.task} data but {loaded.ref} is a language model"
            )
        head = (loaded.config.get("architectures") or [""])[0]
        if split.labels.dim() > 1 and not head.endswith(LM_HEADS):
            raise RotvizError(
                f"'{split.data}' labels every token but {loaded.ref} ({head or 'no head'}) "
                "has no language-model head: give a ...LMHeadModel, ...ForCausalLM or "
                "...ForMaskedLM"
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
    loss = F.cross_entropy(logits, y, reduction="sum")
    correct = (logits.argmax(-1) == y).sum()
    return float(loss), int(correct), int(y.numel())


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

"""The task a model was trained for, read off its head class and config, and what follows
from it: the loss (as transformers computes it for that head), the predictions and the
metrics.

- `text` (LMHeadModel, ForCausalLM): next-token cross-entropy; accuracy, perplexity.
- `masked` (ForMaskedLM): cross-entropy on the masked tokens; accuracy, perplexity.
- `seq-cls` (ForSequenceClassification): cross-entropy; accuracy, macro-F1.
- `multi-label` (... with problem_type multi_label_classification): binary cross-entropy
  with logits, per label; label accuracy, macro- and micro-F1.
- `regression` (... with one label, or problem_type regression): squared error; MSE.
- `token-cls` (ForTokenClassification): cross-entropy on the labelled tokens; accuracy,
  macro-F1, and entity-level micro-F1 when the labels are BIO tags.
- `image` (image classifiers): cross-entropy; accuracy, macro-F1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rotviz.data.splits import IGNORE
from rotviz.errors import RotvizError

Tensor = torch.Tensor

# BertForPreTraining's first head is a masked LM (rotviz.heads: its loss is that head's)
LM_HEADS = ("LMHeadModel", "ForCausalLM", "ForMaskedLM", "ForPreTraining")
MASKED_HEADS = ("ForMaskedLM", "ForPreTraining")
LM_TASKS = ("text", "masked")
CLASSIFIER_TASKS = ("seq-cls", "multi-label", "regression", "token-cls")
F1_TASKS = ("seq-cls", "multi-label", "token-cls", "image")


def head_class(config: Mapping) -> str:
    return (config.get("architectures") or [""])[0]


def task_of_config(inputs: str, config: Mapping) -> str | None:
    """The task of a model with these inputs ("pixels" or "tokens") and config, from its head
    (rotviz.heads); None for a model without a head rotviz can score (headless, question
    answering, multiple choice, next sentence, masked image modeling)."""
    from rotviz.heads import head_of_config

    task = head_of_config(config).task
    if (task == "image") != (inputs == "pixels"):
        return None
    if task == "seq-cls":
        problem = config.get("problem_type")
        if problem == "multi_label_classification":
            return "multi-label"
        if problem == "regression" or (problem is None and num_labels(config) == 1):
            return "regression"
    return task


def num_labels(config: Mapping) -> int:
    labels = config.get("id2label")
    return len(labels) if labels else int(config.get("num_labels", 2))


def label_names(config: Mapping) -> tuple[str, ...]:
    """The label names by id (config id2label; LABEL_i when it has none)."""
    labels = config.get("id2label") or {}
    n = num_labels(config)
    return tuple(str(labels.get(str(i), labels.get(i, f"LABEL_{i}"))) for i in range(n))


def is_default_names(names: Sequence[str]) -> bool:
    """Whether `names` are transformers' placeholders LABEL_0..LABEL_n-1 (what a config gets
    when nobody named its labels), which say nothing about what each output means."""
    return all(name == f"LABEL_{i}" for i, name in enumerate(names))


def named_labels(config: Mapping, ref: str) -> tuple[str, ...] | None:
    """The model's label names by output id when it names them; None when it does not (no
    id2label, or only LABEL_i placeholders). Data labelled by name (image class folders) is
    read through these names, since output i means id2label[i] whatever order the names
    sort in. id2label is the truth here, not label2id: many saved configs carry a stale
    LABEL_i label2id beside a named id2label. One line when id2label cannot be one name per
    output (ids that are not 0..n-1, a name given twice)."""
    labels = config.get("id2label")
    if not labels:
        return None
    fix = "give id2label one distinct name per output id 0..n-1 in its config.json"
    if not isinstance(labels, Mapping):
        raise RotvizError(f"{ref}: config id2label is a {type(labels).__name__}, not a "
                          f"mapping of ids to names; {fix}")
    by_id: dict[int, str] = {}
    for key, name in labels.items():
        try:
            i = int(key)
        except (TypeError, ValueError):
            i = -1
        if isinstance(key, bool) or str(i) != str(key).strip() or i in by_id:
            raise RotvizError(f"{ref}: config id2label has the id {key!r}; {fix}")
        by_id[i] = str(name)
    if sorted(by_id) != list(range(len(by_id))):
        raise RotvizError(f"{ref}: config id2label has the ids {sorted(by_id)[:8]}, not "
                          f"0..{len(by_id) - 1}; {fix}")
    names = tuple(by_id[i] for i in range(len(by_id)))
    twice = sorted(n for n, k in Counter(names).items() if k > 1)
    if twice:
        raise RotvizError(f"{ref}: config id2label names '{twice[0]}' for more than one id; "
                          f"{fix}")
    return None if is_default_names(names) else names


# ---- loss -----------------------------------------------------------------------------------


def sample_losses(task: str, logits: Tensor, y: Tensor,
                  wide: Callable[[Tensor], Tensor] = torch.Tensor.double,
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """Per example: the summed loss (summed in `wide`'s dtype), the number of correct
    predictions and the number of predictions it counts (tokens, labels or outputs), so that
    sum(loss) / sum(count) is the loss transformers reports for the head (its `labels=`
    mean)."""
    b = y.shape[0]
    # half precision is widened; float64 stays (the Hessian's exact float64 comparisons)
    logits = logits if logits.dtype == torch.float64 else logits.float()
    if task == "multi-label":
        y = y.to(logits)
        loss = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
        correct = ((logits > 0) == (y > 0.5)).sum(1)
        return wide(loss).sum(1), correct, torch.full_like(correct, y.shape[1])
    if task == "regression":
        y2 = y.to(logits).reshape(b, -1)
        err = (logits.reshape(b, -1) - y2) ** 2
        zero = torch.zeros(b, dtype=torch.long, device=y.device)
        return wide(err).sum(1), zero, zero + y2.shape[1]
    y2 = y.reshape(b, -1)
    lg = logits.reshape(y2.numel(), logits.shape[-1])
    loss = F.cross_entropy(lg, y2.reshape(-1), reduction="none", ignore_index=IGNORE)
    valid = y2 != IGNORE
    correct = (lg.argmax(-1).reshape(y2.shape) == y2) & valid
    return wide(loss.reshape(y2.shape)).sum(1), correct.sum(1), valid.sum(1)


def batch_loss(task: str, logits: Tensor, y: Tensor) -> tuple[float, int, int]:
    """Summed loss, number correct and number of predictions in one batch."""
    if task in ("multi-label", "regression"):
        loss, correct, count = sample_losses(task, logits, y)
        return float(loss.sum()), int(correct.sum()), int(count.sum())
    logits = logits.float().reshape(-1, logits.shape[-1])
    y = y.reshape(-1).to(logits.device)
    valid = y != IGNORE  # padding, and the tokens a masked LM is not asked for
    loss = F.cross_entropy(logits, y, reduction="sum", ignore_index=IGNORE)
    correct = ((logits.argmax(-1) == y) & valid).sum()
    return float(loss), int(correct), int(valid.sum())


def predictions(task: str, logits: Tensor) -> Tensor:
    """What the model answers: class ids, multi-hot labels, or the regression outputs."""
    if task == "multi-label":
        return (logits > 0).long()
    if task == "regression":
        return logits.float()
    return logits.argmax(-1)


# ---- metrics --------------------------------------------------------------------------------


def _f1(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    denom = 2 * tp + fp + fn
    return np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0)


def class_f1(pred: np.ndarray, true: np.ndarray, n_classes: int) -> float:
    """Macro-F1 over the classes that occur in the labels or the predictions."""
    tp = np.bincount(true[pred == true], minlength=n_classes).astype(float)
    fp = np.bincount(pred[pred != true], minlength=n_classes).astype(float)
    fn = np.bincount(true[pred != true], minlength=n_classes).astype(float)
    seen = (tp + fp + fn) > 0
    return float(_f1(tp, fp, fn)[seen].mean()) if seen.any() else float("nan")


def entities(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """(type, start, end) spans of BIO / IOB2 tags, as conlleval reads them: a span starts at
    B-X, or at an I-X that does not continue an X span, and runs over the I-X after it."""
    out: set[tuple[str, int, int]] = set()
    kind, start = None, 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, name = tag.partition("-")
        cont = prefix == "I" and name == kind
        if kind is not None and not cont:
            out.add((kind, start, i))
            kind = None
        if prefix in ("B", "I") and name and not cont:
            kind, start = name, i
    return out


def is_bio(names: Sequence[str]) -> bool:
    return any(n.startswith(("B-", "I-")) for n in names) and all(
        n == "O" or n.startswith(("B-", "I-")) for n in names)


def entity_f1(pred: Sequence[Sequence[int]], true: Sequence[Sequence[int]],
              names: Sequence[str]) -> float:
    """Entity-level micro-F1 (conlleval / seqeval's default): a predicted entity counts only
    when its type and both ends match a true one."""
    tp = n_pred = n_true = 0
    for p, t in zip(pred, true, strict=True):
        ep, et = entities([names[i] for i in p]), entities([names[i] for i in t])
        tp, n_pred, n_true = tp + len(ep & et), n_pred + len(ep), n_true + len(et)
    if n_pred + n_true == 0:
        return float("nan")
    return 2 * tp / (n_pred + n_true)


def scores(task: str, pred: Tensor, y: Tensor, names: Sequence[str] = (),
           n_classes: int = 0) -> dict[str, float]:
    """The task's metrics beyond loss and accuracy (see the module's table)."""
    if task not in F1_TASKS:
        if task == "regression":
            y2 = y.float().reshape(len(y), -1)
            return {"mse": float(((pred.reshape(y2.shape) - y2) ** 2).mean())}
        return {}
    if task == "multi-label":
        p, t = pred.bool().numpy(), (y > 0.5).numpy()
        tp, fp, fn = ((p & t).sum(0), (p & ~t).sum(0), (~p & t).sum(0))
        seen = (tp + fp + fn) > 0
        macro = float(_f1(tp, fp, fn)[seen].mean()) if seen.any() else float("nan")
        micro = float(_f1(tp.sum(), fp.sum(), fn.sum()))
        return {"macro_f1": macro, "micro_f1": micro}
    yy = y.reshape(len(y), -1)
    pp = pred.reshape(yy.shape)
    valid = yy != IGNORE
    out = {"macro_f1": class_f1(pp[valid].numpy(), yy[valid].numpy(),
                                max(n_classes, int(yy.max()) + 1, int(pp.max()) + 1))}
    if task == "token-cls" and names and is_bio(names):
        rows_p = [p[v].tolist() for p, v in zip(pp, valid, strict=True)]
        rows_t = [t[v].tolist() for t, v in zip(yy, valid, strict=True)]
        out["entity_f1"] = entity_f1(rows_p, rows_t, names)
    return out


METRIC_LABELS = {
    "macro_f1": "macro-F1",
    "micro_f1": "micro-F1",
    "entity_f1": "entity micro-F1",
    "mse": "mean squared error",
}


def describe(task: str) -> dict[str, Any]:
    """The task's name and metrics, as the app and reports show them."""
    names = {"text": "next-token prediction", "masked": "masked language modelling",
             "seq-cls": "sequence classification", "multi-label": "multi-label classification",
             "regression": "regression", "token-cls": "token classification",
             "image": "image classification"}
    metrics = {"text": ["accuracy", "perplexity"], "masked": ["accuracy", "perplexity"],
               "seq-cls": ["accuracy", "macro-F1"],
               "multi-label": ["label accuracy", "macro-F1", "micro-F1"],
               "regression": ["mean squared error"],
               "token-cls": ["accuracy", "macro-F1", "entity micro-F1 (BIO tags)"],
               "image": ["accuracy", "macro-F1"]}
    return {"task": task, "name": names.get(task, task), "metrics": metrics.get(task, [])}

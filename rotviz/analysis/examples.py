"""What a model answers on a few fixed test inputs: the frames of the interpolation path's
animation show them as alpha moves (rotviz.plots.animate).

The examples are the split's first `k` (fixed: the same inputs at every alpha, in every run).
At each parameter set the record keeps, per example, the predicted class (for a language
model: the next token at the window's last position; for a masked LM: the token at its first
masked position) and its probability. Regression and multi-label heads answer no single
class: they get no examples (an empty record), and the animation shows the loss alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rotviz.data.split import Split
from rotviz.data.splits import IGNORE

TASKS = ("image", "seq-cls", "text", "masked", "token-cls")


def pickable(split: Split, k: int) -> int:
    """How many examples `split` can show: `k`, at most its size, 0 for a task without a
    single predicted class."""
    return min(int(k), split.n) if split.task in TASKS else 0


def positions(split: Split, k: int) -> list[int]:
    """The position of each example whose prediction is read: 0 for one label per example;
    the last position of a text window; a masked LM's first masked (else last) position; a
    token classifier's first labelled token."""
    out = []
    for i in range(k):
        y = split.labels[i]
        if y.dim() == 0:
            out.append(0)
        elif split.task == "text":
            out.append(int(y.shape[-1]) - 1)
        else:
            hidden = (y != IGNORE).nonzero().flatten()
            out.append(int(hidden[0]) if len(hidden) else int(y.shape[-1]) - 1)
    return out


def namer(split: Split):
    """How an answer (a class or token id) is said: the split's label name, a character of
    rotviz's vocabulary, else the id."""
    from rotviz.data.text import decode
    from rotviz.data.tokens import CHARS

    chars = split.task in ("text", "masked") and split.encoding == CHARS

    def name(i: int) -> str:
        if split.label_names and 0 <= i < len(split.label_names):
            return str(split.label_names[i])
        if chars:
            return repr(decode([i]))[1:-1]
        return str(i)

    return name


def describe(split: Split, k: int) -> dict:
    """The fixed part of the record: each example's input as it can be drawn (an image's
    pixels, grey, as a list of rows; else the text or token ids up to the position read),
    its true answer and its name. `pred`, `prob` and `pred_names` get one list per alpha."""
    from rotviz.data.text import decode
    from rotviz.data.tokens import CHARS

    k = pickable(split, k)
    if k == 0:
        return {}
    at, name = positions(split, k), namer(split)
    images, texts, true = [], [], []
    for i, p in enumerate(at):
        y = split.labels[i]
        true.append(int(y) if y.dim() == 0 else int(y[p]))
        if split.task == "image":
            x = split.inputs[i].float()
            grey = x.mean(0) if x.dim() == 3 else x
            images.append([[round(float(v), 4) for v in row] for row in grey])
        else:
            ids = split.inputs[i].flatten()[: p + 1].tolist()
            texts.append(_chars(decode(ids[-24:]), split.task) if split.encoding == CHARS
                         else " ".join(map(str, ids[-8:])))
    return {"task": split.task, "positions": at, "true": true,
            "true_names": [name(t) for t in true], "images": images, "texts": texts,
            "pred": [], "prob": [], "pred_names": []}


# How a hidden character of a masked-LM window is drawn: the character vocabulary masks
# with its unknown id (rotviz.data.text._masked_windows), which decodes to U+FFFD, a glyph
# that reads as a broken font rather than as "hidden here".
MASKED = "\u2588"


def _chars(text: str, task: str) -> str:
    """A window of rotviz's character vocabulary as drawn: masked characters as MASKED."""
    return text.replace("\ufffd", MASKED) if task == "masked" else text


def answers(logits: torch.Tensor, positions: list[int]) -> tuple[list[int], list[float]]:
    """Per example, the predicted class at its position and its probability (softmax)."""
    preds, probs = [], []
    for i, p in enumerate(positions):
        row = logits[i] if logits.dim() == 2 else logits[i, p]
        pr = torch.softmax(row.double(), -1)
        j = int(pr.argmax())
        preds.append(j)
        probs.append(float(pr[j]))
    return preds, probs


def probe(evaluator, split: Split, k: int):
    """A function of a parameter set giving its (predictions, probabilities) on the first `k`
    examples of `split`, through `evaluator`'s module (rotviz.evaluation.Evaluator); None
    when there are no examples to show."""
    from rotviz.data.inputs import to_device

    k = pickable(split, k)
    if k == 0:
        return None
    at = positions(split, k)
    x = to_device(split.inputs_at(slice(0, k)), evaluator.device)

    def run(params: Mapping[str, torch.Tensor]) -> tuple[list[int], list[float]]:
        with torch.inference_mode():
            return answers(evaluator.logits(params, x).float().cpu(), at)

    return run

"""Offline data sources with fixed, seeded splits: the `Split` of ready tensors and
`load_split`, which reads one from a data reference.

A data reference is a short string: `digits`, `pystdlib`, `cifar10:DIR`, `imagefolder:DIR`,
`text:FILE`, or labelled text (`csv:FILE`, `tsv:FILE`, `jsonl:FILE`, `conll:FILE`, `hf:DIR`:
rotviz.data.labelled).

Nothing is downloaded: `digits` is scikit-learn's bundled copy, `pystdlib` is built from the
Python standard library's own source files (rotviz.data.text), and the rest are the user's
files (rotviz.data.images, rotviz.data.text). Text is read the way the model reads it
(rotviz.data.tokens): with its own tokenizer, or with rotviz's fixed character vocabulary
(rotviz.data.text.CHARS) for the character models that declare it;
`rotviz.data.reading.split_for` picks the reading.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from rotviz.confine import ANYWHERE, Confined
from rotviz.data.images import cifar10, digits_arrays, imagefolder
from rotviz.data.inputs import Inputs
from rotviz.data.labelled import LABELLED_KINDS, labelled_split
from rotviz.data.splits import SPLITS
from rotviz.data.splits import split_indices as _split_indices
from rotviz.data.text import pystdlib, text_file
from rotviz.errors import RotvizError


@dataclass(frozen=True)
class Split:
    """One split of a data source, as tensors on the CPU.

    Images: `inputs` (N, C, H, W) float32, `labels` (N,) long, `n_classes` classes.
    Text (`task` "text", for causal LMs): `inputs` (N, T) long token ids, `labels` (N, T) the
    next token's id. Text for masked LMs (`task` "masked"): `inputs` with a seeded 15% of the
    tokens replaced by the mask id, `labels` the hidden ids there and IGNORE elsewhere.
    `n_classes` is the vocabulary's size, and `encoding` the fingerprint of the vocabulary the
    ids come from (rotviz.data.tokens; "" for images): models check it before they read a split.
    """

    data: str
    split: str
    task: str  # "image", "text" (next token) or "masked" (masked LM)
    inputs: torch.Tensor
    labels: torch.Tensor
    n_classes: int
    encoding: str = ""
    how: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # Further model inputs, one row per example (padded text: attention_mask, token_type_ids)
    extra: dict[str, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)
    label_names: tuple[str, ...] = ()  # a classifier's label names, by id (F1 reads BIO tags)

    @property
    def n(self) -> int:
        return int(self.inputs.shape[0])

    def batches(self, batch_size: int = 256) -> Iterator[tuple[Inputs, torch.Tensor]]:
        """Fixed-order batches (evaluation needs no shuffling): the inputs (one tensor, or
        the named inputs when the split has `extra` ones) and the labels."""
        for i in range(0, self.n, batch_size):
            yield self.inputs_at(slice(i, i + batch_size)), self.labels[i : i + batch_size]

    def inputs_at(self, index) -> Inputs:
        """The inputs of the examples at `index` (one tensor, or the named inputs)."""
        if not self.extra:
            return self.inputs[index]
        return {"input_ids": self.inputs[index], **{k: v[index] for k, v in self.extra.items()}}

    def _with(self, index) -> Split:
        return Split(self.data, self.split, self.task, self.inputs[index], self.labels[index],
                     self.n_classes, self.encoding, self.how,
                     {k: v[index] for k, v in self.extra.items()}, self.label_names)

    def subset(self, n: int) -> Split:
        return self._with(slice(0, n))

    def take(self, index: torch.Tensor) -> Split:
        """The examples at `index` (e.g. one half of the training set for a fine-tune)."""
        return self._with(index)

    def sibling(self, split: str) -> Split:
        """Another split of the same data, read the same way (vocabulary, masking, length)."""
        return load_split(self.data, split, **self.how)


# ---- digits -----------------------------------------------------------------------------------


def digits(split: str, seed: int = 0) -> Split:
    """scikit-learn's bundled 8x8 digits, scaled to [0, 1]; 397 test, 200 val, 1200 train."""
    pixels, target = digits_arrays()
    x = torch.tensor(pixels.reshape(-1, 8, 8) / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(target, dtype=torch.long)
    idx = torch.as_tensor(_split_indices(len(y), seed, 200, 397)[split])
    return Split("digits", split, "image", x[idx], y[idx], 10, "", {"seed": seed})



KNOWN = ("digits, pystdlib, cifar10:DIR, imagefolder:DIR, text:FILE, csv:FILE, tsv:FILE, "
         "jsonl:FILE, conll:FILE or hf:DIR")


TEXT_SOURCES = ("pystdlib", "text")
IMAGE_FILES = ("cifar10", "imagefolder")  # read through the model's image processor, if any


def check_ref(ref: str) -> None:
    """Refuse, in one line and before any model or data is read, a data reference
    `load_split` could never read: an unknown kind, or a kind that needs a path given none.
    The same words as `load_split`'s, which keeps the full check (the files themselves)."""
    kind, _, arg = str(ref).partition(":")
    if kind in LABELLED_KINDS or (kind in ("digits", "pystdlib") and not arg):
        return
    if kind in ("cifar10", "imagefolder", "text"):
        if not arg:
            raise RotvizError(f"'{ref}' names no path: write {kind}:PATH")
        return
    raise RotvizError(f"unknown data '{ref}': use {KNOWN}")


def load_split(ref: str, split: str = "test", seed: int = 0, reader: Any = None,
               masked: bool = False, seq_len: int | None = None,
               labelling: Any = None, processor: Any = None,
               names: tuple[str, ...] | None = None,
               confined: Confined = ANYWHERE) -> Split:
    """Load one split of a data reference. Text is read by `reader` (the model's
    rotviz.data.tokens.TextEncoding; None: rotviz's character vocabulary), as masked-LM data when
    `masked`, in windows of `seq_len` tokens; labelled text (rotviz.data.labelled) for the
    classifier `labelling` describes; image data ignores these, and an image folder's
    classes are the model's label `names` (rotviz.data.tasks.named_labels; None: sorted folder
    names). To read data the way a given model does, use `rotviz.data.reading.split_for`.
    Every file is read through `confined` (rotviz.confine: regular files only; in the app,
    only inside its roots)."""
    if split not in SPLITS:
        raise RotvizError(f"unknown split '{split}': use one of {', '.join(SPLITS)}")
    kind, _, arg = ref.partition(":")
    if kind in LABELLED_KINDS:
        if labelling is None:
            raise RotvizError(f"'{ref}' is labelled data, read for one classifier: load it "
                              "through the model (rotviz.data.reading.split_for)")
        ids, labels, extra = labelled_split(ref, split, seed, reader, labelling, confined)
        how = {"seed": seed, "reader": reader, "labelling": labelling, "confined": confined}
        out = Split(ref, split, labelling.task, ids, labels, labelling.num_labels,
                    reader.fingerprint, how, extra, labelling.names)
        if out.n == 0:
            raise RotvizError(f"the {split} split of '{ref}' is empty; use more rows")
        return out
    with_path = {"cifar10": cifar10, "imagefolder": imagefolder, "text": text_file}
    reading = ({"reader": reader, "masked": masked, "seq_len": seq_len}
               if kind in TEXT_SOURCES else {"processor": processor} if kind in IMAGE_FILES
               else {})
    if kind == "imagefolder":
        reading["names"] = names
    if kind == "digits" and not arg:
        out = digits(split, seed)
    elif kind == "pystdlib" and not arg:  # the readers give a split's fields, named by `ref`
        out = Split(ref, split, **pystdlib(split, seed, **reading))
    elif kind in with_path:
        if not arg:
            raise RotvizError(f"'{ref}' names no path: write {kind}:PATH")
        out = Split(ref, split, **with_path[kind](arg, split, seed, confined=confined, **reading))
    else:
        raise RotvizError(f"unknown data '{ref}': use {KNOWN}")
    if out.n == 0:
        raise RotvizError(
            f"the {split} split of '{ref}' is empty; use a larger data set or another split"
        )
    return out

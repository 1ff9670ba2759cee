"""Offline data sources with fixed, seeded splits.

A data reference is a short string: `digits`, `pystdlib`, `cifar10:DIR`, `imagefolder:DIR`
or `text:FILE`. `load_split(ref, split)` returns a `Split` of ready tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from rotviz.errors import RotvizError

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Split:
    """One split of a data source, as tensors on the CPU.

    Images: `inputs` (N, C, H, W) float32, `labels` (N,) long, `n_classes` classes.
    Text: `inputs` (N, T) long character ids, `labels` (N, T) long next-character ids,
    `n_classes` the vocabulary size.
    """

    data: str
    split: str
    task: str  # "image" or "text"
    inputs: torch.Tensor
    labels: torch.Tensor
    n_classes: int

    @property
    def n(self) -> int:
        return int(self.inputs.shape[0])

    def batches(self, batch_size: int = 256) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Fixed-order batches (evaluation needs no shuffling)."""
        for i in range(0, self.n, batch_size):
            yield self.inputs[i : i + batch_size], self.labels[i : i + batch_size]

    def subset(self, n: int) -> Split:
        return Split(self.data, self.split, self.task, self.inputs[:n], self.labels[:n], self.n_classes)


def _split_indices(n: int, seed: int, n_val: int, n_test: int) -> dict[str, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    return {
        "test": order[:n_test],
        "val": order[n_test : n_test + n_val],
        "train": order[n_test + n_val :],
    }


def digits(split: str, seed: int = 0) -> Split:
    """scikit-learn's bundled 8x8 digits, scaled to [0, 1]; 397 test, 200 val, 1200 train."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(bunch.target, dtype=torch.long)
    idx = torch.as_tensor(_split_indices(len(y), seed, 200, 397)[split])
    return Split("digits", split, "image", x[idx], y[idx], 10)


def load_split(ref: str, split: str = "test", seed: int = 0) -> Split:
    """Load one split of a data reference."""
    if split not in SPLITS:
        raise RotvizError(f"unknown split '{split}': use one of {', '.join(SPLITS)}")
    kind = ref.split(":", 1)[0]
    loaders = {"digits": digits}
    if kind not in loaders:
        raise RotvizError(f"unknown data '{ref}': use digits, pystdlib, cifar10:DIR, imagefolder:DIR or text:FILE")
    out = loaders[kind](split, seed)
    if out.n == 0:
        raise RotvizError(f"the {split} split of '{ref}' is empty; use a larger data set or another split")
    return out

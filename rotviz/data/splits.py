"""Seeded train / val / test splits, and the label value that does not count."""

from __future__ import annotations

import numpy as np

SPLITS = ("train", "val", "test")
IGNORE = -100  # label value that does not count (padding, tokens a masked LM is not asked for)


def split_indices(n: int, seed: int, n_val: int, n_test: int) -> dict[str, np.ndarray]:
    """A seeded permutation of range(n), cut into test, val and the rest (train)."""
    order = np.random.default_rng(seed).permutation(n)
    return {
        "test": order[:n_test],
        "val": order[n_test : n_test + n_val],
        "train": order[n_test + n_val :],
    }


def tenth_split(n: int, seed: int) -> dict[str, np.ndarray]:
    """10% test, 10% val (at least one each once there are 3 examples), the rest train."""
    k = max(1, round(n / 10)) if n >= 3 else 0
    return split_indices(n, seed, k, k)

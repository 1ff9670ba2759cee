"""The default pair, its digits split and synthetic splits, shared by the tests of many
records (barrier, plane, bend, merge, spectra, slice, hessian, sharpness, ...), and the
comparison of an at-size result with the in-memory one."""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

from rotviz.data.split import Split, load_split
from rotviz.sources.loading import Loaded, load_model
from rotviz.sources.running import forward, probe_inputs


@cache
def default_pair_refs() -> tuple[str, str]:
    """The two `zoo:` references of the default pair (two digits ViTs, seeds 0 and 1)."""
    from rotviz.zoo_registry import default_pair as zoo_default_pair

    a, b = zoo_default_pair()
    return a, b


@cache
def default_pair() -> tuple[Loaded, Loaded]:
    a, b = default_pair_refs()
    return load_model(a), load_model(b)


@cache
def digits(split: str = "test") -> Split:
    return load_split("digits", split)


def synthetic_split(model: Loaded, n: int = 12, seed: int = 0) -> Split:
    """Random inputs of the model's kind with random labels of the right shape and range."""
    x = next(iter(probe_inputs(model, n, seed).values()))
    logits = forward(model, probe_inputs(model, 1, seed))
    n_classes = logits.shape[-1]
    gen = torch.Generator().manual_seed(seed + 1)
    shape = (n,) if logits.dim() == 2 else tuple(x.shape)
    y = torch.randint(0, n_classes, shape, generator=gen)
    from rotviz.data.reading import task_of

    task = task_of(model) or "text"  # a bare text model is scored on next-token labels
    return Split("synthetic", "test", task, x, y, n_classes, "" if task == "image" else "chars")


def assert_unchanged(model: Loaded, before: dict[str, torch.Tensor]) -> None:
    assert all(torch.equal(model.state[k], before[k]) for k in before)
    assert all(torch.equal(p, before[k]) for k, p in model.model.state_dict().items())


def assert_close(want, got, what: str, rel: float = 1e-5) -> None:
    """`got` equals `want` to `rel` of the larger of 1 and `want`'s largest magnitude (an
    at-size result against the in-memory one: float32 files, not bit for bit)."""
    x, y = np.asarray(want, dtype=float), np.asarray(got, dtype=float)
    assert x.shape == y.shape, what
    assert np.abs(x - y).max() <= rel * max(1.0, np.abs(x).max()), what

"""mergekit 0.1.5's own merge functions, called on tensors (a TensorGroup, the base first),
and seeded random tensors, for the tests of rotviz's versions of its methods."""

from __future__ import annotations

import pytest
import torch

TOL = 1e-6


def theirs(method: str, tensors, base=None, **params) -> torch.Tensor:
    """mergekit's `method` (its registered record's function) on `tensors` about `base`
    (None: the first tensor is mergekit's base, as rotviz's two-model methods say it)."""
    pytest.importorskip("mergekit", reason="mergekit==0.1.5 (the dev extra)")
    from mergekit.merge_methods.base import TensorGroup
    from mergekit.merge_methods.registry import get

    inputs = list(tensors) if base is None else [base, *tensors]
    group = TensorGroup.from_tensors(inputs, base_index=0)
    return get(method).implementation(group, **params)


def randoms(seed: int, shape, n: int = 3, spread: float = 0.1):
    """A base and n models about it (base + spread x noise), float64."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(tuple(shape), generator=g, dtype=torch.float64)
    return base, [base + spread * torch.randn(tuple(shape), generator=g, dtype=torch.float64)
                  for _ in range(n)]


def worst(x: torch.Tensor, y: torch.Tensor) -> float:
    assert x.shape == y.shape
    return float((x.double() - y.double()).abs().max()) if x.numel() else 0.0


BASE = ["--base", "zoo:vit-digits-base"]  # the lineage pair's base
SHAPES = [(37, 23), (50,), (), (4, 5, 6), (1, 7)]


def refused(argv: list[str], capsys, text: str) -> None:
    """`rotviz merge` on the zoo's lineage pair with `argv` exits 2 with one line holding
    `text`, before any model is read."""
    from rotviz.cli import main

    pair = ["merge", "zoo:vit-digits-s3-ft", "zoo:vit-digits-s6-ft", "--data", "digits"]
    capsys.readouterr()
    assert main([*pair, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and text in err, err

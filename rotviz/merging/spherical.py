"""Shared passes of the merges on the sphere of whole tensors (multislerp, karcher): their
results are linear combinations of the models' (task) vectors, so one pass gathers the Gram
matrix of the flattened vectors, the method works on N x N numbers, and a second pass yields
the combination slice by slice (they then run at size, never holding a whole tensor)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor


def vectors(models: Sequence[Tensor], base: Tensor | None) -> list[Tensor]:
    """The vectors a spherical merge works on: the task vectors about `base`, or the models."""
    return list(models) if base is None else [m - base for m in models]


def gram(src: RowSource) -> list[list[float]]:
    """G_ij = <x_i, x_j> of the flattened vectors of the whole tensor (a pass over slices)."""
    n = src.n
    g = [[0.0] * n for _ in range(n)]
    for models, base in src.slices():
        xs = [x.reshape(-1) for x in vectors(models, base)]
        for i in range(n):
            for j in range(i, n):
                g[i][j] += float(xs[i] @ xs[j])
    for i in range(n):
        for j in range(i):
            g[i][j] = g[j][i]
    return g


def quad(g: Sequence[Sequence[float]], a: Sequence[float], b: Sequence[float]) -> float:
    """a^T G b: the dot product of the combinations sum a_i x_i and sum b_i x_i."""
    return sum(a[i] * g[i][j] * b[j] for i in range(len(a)) for j in range(len(b)))


def combination_rows(src: RowSource, coefs: Sequence[float], add_base: bool = True
                     ) -> Iterator[Tensor]:
    """sum_i coefs[i] x_i (plus the base, where there is one and `add_base`), slice by slice."""
    for models, base in src.slices():
        out = sum(c * x for c, x in zip(coefs, vectors(models, base), strict=True))
        if base is not None and add_base:
            out = out + base
        yield out

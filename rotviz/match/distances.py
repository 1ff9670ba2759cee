"""Parameter distances between two views of one architecture, in total, per layer and per kind."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass

import torch

from rotviz.devices import wide_device
from rotviz.match.memo import TensorMemo, cached
from rotviz.symmetry.kinds import KINDS, groups
from rotviz.symmetry.view import ModelView


@dataclass(frozen=True)
class Distances:
    """Euclidean distances. `cells[(layer, kind)]` holds squared distances; layer None means
    outside the blocks."""

    cells: dict[tuple[int | None, str], float]

    @property
    def total(self) -> float:
        return sum(self.cells.values()) ** 0.5

    def per_layer(self) -> dict[str, float]:
        acc: dict[str, float] = defaultdict(float)
        for (layer, _), v in self.cells.items():
            acc["rest" if layer is None else str(layer)] += v
        return {k: v**0.5 for k, v in acc.items()}

    def per_kind(self) -> dict[str, float]:
        acc: dict[str, float] = defaultdict(float)
        for (_, kind), v in self.cells.items():
            acc[kind] += v
        return {k: acc[k] ** 0.5 for k in KINDS if k in acc}

    def to_dict(self) -> dict:
        return {"total": self.total, "per_layer": self.per_layer(), "per_kind": self.per_kind()}


def distances(a: ModelView, b: ModelView,
              only: Collection[tuple[int | None, str]] | None = None,
              memo: TensorMemo | None = None) -> Distances:
    """Distances over every floating tensor the two views share (tied copies counted once);
    with `only`, just those (layer, kind) cells; with `memo`, pairs of tensors already
    measured are not measured again."""
    cells: dict[tuple[int | None, str], float] = defaultdict(float)
    for (la, ka, ta), (_, _, tb) in zip(groups(a), groups(b), strict=True):
        if only is None or (la, ka) in only:
            cells[(la, ka)] += cached(memo, "sq", (ta, tb),
                                      lambda ta=ta, tb=tb: squared_distance(ta, tb))
    return Distances(dict(cells))


def squared_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b||^2: the difference in the tensors' own precision (at least float32), summed
    in float64. Converting both to float64 first costs ~6x the time for no useful digits."""
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    diff = a.detach().to(dtype) - b.detach().to(device=a.device, dtype=dtype)
    diff = diff.to(wide_device(diff.device))  # MPS has no float64 to sum in
    diff.mul_(diff)
    return float(diff.sum(dtype=torch.float64))


def norm(a: ModelView) -> float:
    """The Euclidean norm of a view's parameters, for relative distances."""
    total = 0.0
    for _, _, t in groups(a):
        t = t.detach().to(torch.promote_types(t.dtype, torch.float32))
        total += float((t * t).sum(dtype=torch.float64))
    return total**0.5

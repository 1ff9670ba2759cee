"""Parameter distances between two views of one architecture, in total, per layer and per kind."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from rotviz.view import KINDS, ModelView, groups


@dataclass(frozen=True)
class Distances:
    """Euclidean distances. `cells[(layer, kind)]` holds squared distances; layer None = outside blocks."""

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


def distances(a: ModelView, b: ModelView) -> Distances:
    """Distances over every floating tensor the two views share (tied copies counted once)."""
    cells: dict[tuple[int | None, str], float] = defaultdict(float)
    for (la, ka, ta), (_, _, tb) in zip(groups(a), groups(b)):
        diff = ta.detach().double() - tb.detach().to(ta.device).double()
        cells[(la, ka)] += float(torch.sum(diff * diff))
    return Distances(dict(cells))


def norm(a: ModelView) -> float:
    """The Euclidean norm of a view's parameters, for relative distances."""
    return sum(float(torch.sum(t.detach().double() ** 2)) for _, _, t in groups(a)) ** 0.5

"""The 2D plane through the anchor A, the source B and the matched source B' (the seed
paper's Figure 2): its frame, its grid and the evaluation of its nodes.

Coordinates are true Euclidean distances in parameter space: x along B - A, y along the part
of B' - A orthogonal to it (Gram-Schmidt). The plane record (rotviz.measures.plane) evaluates
it in memory, the at-size plane block by block, and the bend record draws its curve in the
same frame; each builds a node its own way and shares the frame and grid here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import numpy as np
import torch

from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.sources.loading import to_wide
from rotviz.types import Progress

Tensor = torch.Tensor


def flat_inner(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    """<a, b> over the flattened parameter sets, in float64."""
    return float(sum(torch.sum(to_wide(a[k]) * to_wide(b[k])) for k in a))


@dataclass
class Plane:
    """Loss and accuracy on a grid in the plane through A (anchor), B (source), B' (matched).

    Coordinates are true Euclidean distances in parameter space: x along B - A, y along the
    part of B' - A orthogonal to it (Gram-Schmidt). `loss[iy][ix]` is at (xs[ix], ys[iy]).
    The grid holds A at (0, 0) and B at (|B - A|, 0) exactly on grid nodes, so its row y = 0
    is the unmatched interpolation path.
    """

    xs: list[float]
    ys: list[float]
    loss: list[list[float]]
    acc: list[list[float]]
    points: dict[str, list[float]]  # "A", "B", "B'", "AB", "AB'" -> [x, y]
    point_loss: dict[str, float]
    point_acc: dict[str, float]
    match: str
    data: str
    split: str
    device: str
    seconds: float
    grid: int
    n: int
    layers: list[int] | None = None  # layers matched (None: all)
    anchor: str = ""
    source: str = ""
    distance_ab: float = 0.0  # |B - A|
    distance_ab_matched: float = 0.0  # |B' - A|
    degenerate: bool = False  # B' on the A-B line: y is a seeded random direction instead

    def to_dict(self) -> dict:
        return asdict(self)


def grid_axis(lo: float, hi: float, n: int, unit: float | None = None) -> np.ndarray:
    """n coordinates covering [lo, hi] with 0 on a node; with `unit`, also `unit` on a node."""
    width = hi - lo
    if unit is not None and unit > 0:
        k = max(1, math.floor((n - 2) * unit / width))
        step = unit / k
    else:
        step = width / (n - 2)
    start = math.floor(lo / step + 1e-9) * step
    return start + step * np.arange(n)


def plane_frame(bb: float, bc: float, cc: float) -> tuple[float, float, float]:
    """The plane's frame from the inner products of d_b = B - A and d_c = B' - A (bb =
    <d_b, d_b>, ...): |B - A|, and B' - A along it and off it."""
    n1 = math.sqrt(bb)
    if n1 == 0.0:
        raise RotvizError(
            "anchor and source have identical weights: there is no plane to draw; pick two models"
        )
    c = bc / n1  # B' along u1
    return n1, c, math.sqrt(max(cc - c * c, 0.0))  # B' off the A-B line


def plane_points(n1: float, c: float, n2: float) -> dict[str, tuple[float, float]]:
    """Where A, B, B' and the midpoints AB, AB' sit in the plane's coordinates: x along
    B - A (|B - A| = n1), y along the part of B' - A orthogonal to it (B' = (c, n2))."""
    return {"A": (0.0, 0.0), "B": (n1, 0.0), "B'": (c, n2), "AB": (n1 / 2, 0.0),
            "AB'": (c / 2, n2 / 2)}


def plane_coeffs(x: float, y: float, n1: float, c: float, n2: float) -> tuple[float, float]:
    """theta(x, y) = A + a (B - A) + b (C - A) with x u1 + y u2 = a d_b + b d_c."""
    b = y / n2
    return x / n1 - b * c / n1, b


def plane_axes(pts: dict[str, tuple[float, float]], n1: float, margin: float, grid: int,
               degenerate: bool) -> tuple[np.ndarray, np.ndarray]:
    """The grid's x and y coordinates: the points and `margin` of their span around them,
    A and B on nodes."""
    x_all = [p[0] for p in pts.values()]
    y_all = [p[1] for p in pts.values()] + ([-n1 / 2, n1 / 2] if degenerate else [])
    span = max(max(x_all) - min(x_all), max(y_all) - min(y_all))
    xs = grid_axis(min(x_all) - margin * span, max(x_all) + margin * span, grid, unit=n1)
    ys = grid_axis(min(y_all) - margin * span, max(y_all) + margin * span, grid)
    return xs, ys


def plane_nodes_one_by_one(at: Callable[[float, float], tuple[float, float]]) -> Callable:
    """plane_grid's `each` from `at`: the nodes in turn."""
    def each(nodes: list[tuple[float, float]], done: Callable[[int], None]) -> list:
        out = []
        for n, (x, y) in enumerate(nodes):
            out.append(at(x, y))
            done(n + 1)
        return out
    return each


def plane_grid(at: Callable[[float, float], tuple[float, float]],
               named: Callable[[str], tuple[float, float]],
               pts: dict[str, tuple[float, float]], xs: np.ndarray, ys: np.ndarray,
               progress: Progress | None = None, group: Group = SINGLE,
               each: Callable[[list[tuple[float, float]], Callable[[int], None]],
                              list[tuple[float, float]]] | None = None) -> tuple | None:
    """Loss and accuracy at every grid node (`at(x, y)`, shared among torchrun's processes)
    and at the named points (`named(name)`, rank 0); None on ranks other than 0. `each(nodes,
    done)`, when given, evaluates this process's nodes at once (side by side: see
    rotviz.evaluation.Evaluator.evaluate_each)."""
    grid = len(xs)
    total = grid * grid + len(pts)
    cells = [(iy, ix) for iy in range(grid) for ix in range(grid)]
    mine = group.mine(list(range(len(cells))))
    nodes = [(float(xs[cells[c][1]]), float(ys[cells[c][0]])) for c in mine]

    def done(n: int) -> None:
        if progress:
            progress(n, total, f"grid point {n} of {len(mine)}")

    if each is None:
        each = plane_nodes_one_by_one(at)
    found = dict(zip(mine, each(nodes, done), strict=True))
    parts = group.gather(found)
    if parts is None:
        return None
    for part in parts:
        found.update(part)
    loss = np.zeros((grid, grid))
    acc = np.zeros((grid, grid))
    for c, (iy, ix) in enumerate(cells):
        loss[iy, ix], acc[iy, ix] = found[c]
    done = grid * grid
    point_loss, point_acc = {}, {}
    for name in pts:
        point_loss[name], point_acc[name] = named(name)
        done += 1
        if progress:
            progress(done, total, f"point {name}")
    return loss, acc, point_loss, point_acc

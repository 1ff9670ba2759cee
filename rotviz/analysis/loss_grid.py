"""Loss and accuracy on a line (1D) or a plane (2D) through a point: theta + x d1 (+ y d2), x,
y in [-span, span], along given directions or ones drawn here (seeded random Gaussian, or
the top Hessian eigenvectors at the point: rotviz.analysis.directions). The slice record
(rotviz.measures.slice) lays its slices through it with every kind of direction and centre,
in memory (`slice_with` takes every kind of direction, built by
rotviz.analysis.directions.directions_for); its at-size twin (rotviz.atsize.slice) evaluates
the same `Grid` into the same `Slice`. The sharpness and flat tests lay their Hessian and
gauge-fixed planes through it too.

Everything is evaluated through `rotviz.evaluation.Evaluator` (torch.func's functional_call):
the loaded model and the caller's tensors are never modified.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from rotviz.analysis.directions import (
    TENSOR_NORMS,
    hessian_directions,
    inner,
    norm_of,
    random_directions,
)
from rotviz.data.split import Split
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.limits import GRID, SEED, SPAN
from rotviz.sources.loading import Loaded
from rotviz.types import Progress

Tensor = torch.Tensor
PLAIN_DIRECTIONS = ("random", "hessian")  # what slice_at draws itself
DIRECTIONS = ("random", "hessian", "toward", "tangent", "gauge")  # slice_with: every kind


@dataclass
class Slice:
    """Loss and accuracy on a line or a plane through `point` along `dims` directions.

    1D: `loss[ix]` at xs[ix]. 2D: `loss[iy][ix]` at (xs[ix], ys[iy]). Coordinates are in
    units of the (normalised) directions: x = 1 moves every filter by its own norm under
    `filter` normalisation. `centre_loss` is the point's own loss, evaluated exactly."""

    dims: int
    xs: list[float]
    ys: list[float]  # empty in 1D
    loss: list  # list[float] (1D) or list[list[float]] (2D)
    acc: list
    centre_loss: float
    centre_acc: float
    directions: str
    norm: str
    keep_1d: bool
    grid: int
    span: float
    seed: int
    data: str
    split: str
    device: str
    seconds: float
    n: int
    model: str = ""
    direction_norms: list[float] | None = None  # |d1|, |d2| (L2, parameter units)
    cosine: float | None = None  # cos(d1, d2) in 2D: near 0 for large models
    eigenvalues: list[float] | None = None  # with hessian directions: lambda_1 (, lambda_2)
    # set by rotviz.measures.slice.slice_around / slice_with (slices around any point):
    around: str = "anchor"  # the centre: anchor, source, matched, path, merged (or "point")
    alpha: float | None = None  # path: (1 - alpha) A + alpha B'; merged: the source's weight
    merge: str | None = None  # merged: the merge method (rotviz.merging)
    source: str = ""  # the second model, when the centre or a direction uses it
    match: str = "none"  # how the second model was matched (B')
    toward: str | None = None  # toward directions: "matched" (B') or "source" (B)
    target_loss: float | None = None  # toward: the target's own loss, evaluated exactly
    target_x: float | None = None  # toward with norm none and biases kept: x = 1 is the target
    tangent_cosine: float | None = None  # tangent/gauge: max |cos| with any single tangent
    # hessian directions: the largest Lanczos residual ||H y - theta y|| of the eigenvectors
    # and whether it is small enough to call them eigenvectors (rotviz.analysis.lanczos)
    residual: float | None = None
    converged: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Grid:
    """The points of a slice: `grid` values of x (and of y, in 2D) evenly spaced in
    [-span, span], and its cells (iy, ix) in the order they are evaluated (row by row); the
    same layout in memory (`slice_at`) and at size."""

    dims: int
    grid: int
    xs: list[float]
    ys: list[float]  # empty in 1D
    cells: list[tuple[int, int]]

    @classmethod
    def of(cls, dims: int, grid: int, span: float) -> Grid:
        xs = np.linspace(-span, span, grid)
        ys = xs if dims == 2 else np.zeros(0)
        cells = [(0, ix) for ix in range(grid)] if dims == 1 else \
            [(iy, ix) for iy in range(grid) for ix in range(grid)]
        return cls(dims, grid, xs.tolist(), ys.tolist(), cells)

    def xy(self, cell: tuple[int, int]) -> tuple[float, float]:
        """The cell's (x, y); y is 0 on a line."""
        return self.xs[cell[1]], self.ys[cell[0]] if self.dims == 2 else 0.0

    def fill(self, found) -> tuple[list, list]:
        """(loss, acc) as a Slice holds them (a list in 1D, rows of lists in 2D) from each
        cell's (loss, accuracy), in the order of `cells`."""
        loss = np.zeros((max(1, len(self.ys)), self.grid))
        acc = np.zeros_like(loss)
        for (iy, ix), (cell_loss, cell_acc) in zip(self.cells, found, strict=True):
            loss[iy, ix], acc[iy, ix] = cell_loss, cell_acc
        if self.dims == 1:
            return loss[0].tolist(), acc[0].tolist()
        return loss.tolist(), acc.tolist()


def check_choices(norm: str, directions: str, dims: int, norms: Sequence[str] = TENSOR_NORMS,
                  kinds: Sequence[str] = PLAIN_DIRECTIONS) -> None:
    """One line for a normalisation, direction kind or dimension this slicer does not take
    (rotviz.analysis.loss_grid.slice_with passes the larger lists of every kind)."""
    if norm not in norms:
        raise RotvizError(f"unknown --norm '{norm}': use one of {', '.join(norms)}")
    if directions not in kinds:
        raise RotvizError(f"unknown --directions '{directions}': use one of "
                          f"{', '.join(kinds)}")
    if dims not in (1, 2):
        raise RotvizError(f"--dims must be 1 or 2, got {dims}")


def slice_at(
    loaded: Loaded,
    split: Split,
    dims: int = 2,
    directions: str = "random",
    norm: str = "filter",
    keep_1d: bool = False,
    grid: int = 21,
    span: float = 1.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    batch_size: int = 512,
    point: Mapping[str, Tensor] | None = None,
    given: Sequence[Mapping[str, Tensor]] | None = None,
    evaluator: Evaluator | None = None,
    steps: int = 100,
) -> Slice:
    """slice_at(model, split, dims=2, directions="random", norm="filter", grid=21, span=1.0,
    seed=0) -> Slice

    Loss and accuracy at theta + x d1 (+ y d2) on a `grid` (per axis) of x, y evenly spaced
    in [-span, span], theta = `point` (a state of `loaded`'s architecture: B', a point on a
    path, a merged model; default the model's own weights). The directions are drawn with
    `seed` (random: Gaussian; hessian: the top `dims` Hessian eigenvectors at the point,
    Lanczos of at most `steps` steps from a seeded start) and normalised by `norm` (module
    docstring), or `given` as they are (already
    normalised: a test passes directions moved by a symmetry element). The centre is also
    evaluated exactly (`centre_loss`), so an even grid still reports it."""
    check_choices(norm, directions, dims)
    GRID.check(grid)
    SPAN.check(span)
    t0 = time.perf_counter()
    ev = evaluator or Evaluator(loaded, split, device, batch_size)
    theta = ev.params(loaded.state if point is None else point)
    eigenvalues = None
    lanczos: dict = {}
    if given is not None:
        if len(given) != dims:
            raise RotvizError(f"a {dims}D slice needs {dims} directions, got {len(given)}")
        ds = [ev.params(d) for d in given]
    elif directions == "hessian":
        ds, eigenvalues = hessian_directions(ev, theta, dims, seed, norm, keep_1d, steps,
                                             lanczos)
    else:
        movable = {n for n, _ in loaded.model.named_parameters()}
        ds = random_directions(theta, movable, dims, seed, norm, keep_1d)
    g = Grid.of(dims, grid, span)
    keys = list(theta)
    base, first = [theta[k] for k in keys], [ds[0][k] for k in keys]
    second = [ds[-1][k] for k in keys]

    def at(cell: tuple[int, int]) -> dict[str, Tensor]:
        x, y = g.xy(cell)
        if x == 0.0 and y == 0.0:  # the point itself, with no arithmetic on its weights
            return theta
        moved = torch._foreach_add(base, first, alpha=x)  # theta + x d1 + y d2, one pass
        if dims == 2:
            torch._foreach_add_(moved, second, alpha=y)
        return dict(zip(keys, moved, strict=True))

    # The centre first, on its own: the grid's node there is the point's own loss exactly,
    # not a point of a batched pass (rotviz.evaluation.Evaluator.per_sample_many), whose
    # batched products round differently.
    centre_loss, centre_acc = ev.evaluate(theta)
    centre = [c for c in g.cells if g.xy(c) == (0.0, 0.0)]
    others = [c for c in g.cells if c not in centre]

    def done(count: int) -> None:
        if progress:
            count += len(centre)
            progress(count, len(g.cells), f"grid point {count} of {len(g.cells)}")

    found = dict(zip(others, ev.evaluate_each(at, others, done), strict=True))
    found.update({c: (centre_loss, centre_acc) for c in centre})
    loss, acc = g.fill([found[c] for c in g.cells])
    norms = [norm_of(d) for d in ds]
    cos = None
    if dims == 2 and norms[0] > 0 and norms[1] > 0:
        cos = inner(ds[0], ds[1]) / (norms[0] * norms[1])
    return Slice(
        dims=dims, xs=g.xs, ys=g.ys, loss=loss, acc=acc, centre_loss=centre_loss,
        centre_acc=centre_acc,
        directions="given" if given is not None else directions, norm=norm, keep_1d=keep_1d,
        grid=grid, span=float(span), seed=seed, data=split.data, split=split.split,
        device=str(ev.device), seconds=time.perf_counter() - t0, n=split.n, model=loaded.ref,
        direction_norms=norms, cosine=cos, eigenvalues=eigenvalues,
        around="anchor" if point is None else "point", residual=lanczos.get("residual"),
        converged=lanczos.get("converged"),
    )


def slice_with(
    loaded: Loaded,
    split: Split,
    dims: int = 2,
    directions: str = "random",
    norm: str = "filter",
    keep_1d: bool = False,
    grid: int = 21,
    span: float = 1.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    batch_size: int = 512,
    point: Mapping[str, Tensor] | None = None,
    evaluator: Evaluator | None = None,
    steps: int = 100,
    target: Mapping[str, Tensor] | None = None,
) -> Slice:
    """slice_with(model, split, directions="gauge", norm="unit", ...) -> Slice

    `slice_at` with every direction kind and normalisation: random and hessian as there,
    also under `unit`; `toward` from the point to `target` (B' or B); `tangent` and `gauge`
    at the point. The directions are built by rotviz.analysis.directions.directions_for and
    evaluated by slice_at as given ones, so the grid, the exact centre and the progress are
    slice_at's; the result names the kind, the norm and the seed."""
    from rotviz.analysis.directions import NORMS, directions_for

    check_choices(norm, directions, dims, NORMS, DIRECTIONS)
    if directions in ("random", "hessian") and norm != "unit":
        return slice_at(loaded, split, dims, directions, norm, keep_1d, grid, span, seed,
                        device, progress, batch_size, point, None, evaluator, steps)
    GRID.check(grid)
    SPAN.check(span)
    SEED.check(seed)
    t0 = time.perf_counter()
    ev = evaluator or Evaluator(loaded, split, device, batch_size)
    theta = ev.params(loaded.state if point is None else point)
    movable = {n for n, _ in loaded.model.named_parameters()}
    ds, extra = directions_for(directions, loaded, ev, theta, movable, dims, seed, norm,
                               keep_1d, steps, target)
    s = slice_at(loaded, split, dims, "random", "none", keep_1d, grid, span, seed, device,
                 progress, batch_size, point, ds, ev, steps)
    return replace(s, directions=directions, norm=norm, seconds=time.perf_counter() - t0,
                   **extra)

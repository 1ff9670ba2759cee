"""Slices of the loss around one point: a line (1D) or a plane (2D) of loss and accuracy at
theta + x d1 (+ y d2), x, y in [-span, span], along seeded random Gaussian directions or the
top Hessian eigenvectors at the point (`directions="hessian"`: the sharpest directions, so a
slice shows the curvature that `rotviz hessian` reports).

Each tensor's random directions are drawn from a generator seeded by (seed, the tensor's
parameter name), not from one generator running through the model: a tensor's draw is then
the same whatever order the tensors are read in, which lets a model larger than memory be
sliced block by block (rotviz.stream.slices) with exactly the directions drawn here.

Why normalise the directions: a random direction of unit Gaussian entries moves a layer whose
weights are small far more, relative to its scale, than a layer whose weights are large; and
networks with scale symmetries (norms after linear maps) can look sharp or flat at will. Li et
al. (NeurIPS 2018) scale each filter of the direction to the norm of that filter of the
weights, so that one unit along the axis moves every filter by its own size. rotviz offers:

- `filter`: each output row of a weight (first index: the rows of an nn.Linear's (out, in)
  matrix, an embedding's vectors) gets the norm of that row of the weights;
- `layer`: each tensor gets the norm of the tensor;
- `none`: raw Gaussian entries.

Biases and norm gains (1-D tensors) are zeroed by default, as the reference's `biasbn` off;
`keep_1d` keeps them, normalised the same way (with `filter`, a 1-D tensor's rows are its
entries: each entry becomes plus or minus the weight's magnitude). Floating buffers are never
moved. Everything is evaluated through `rotviz.evaluation.Evaluator` (torch.func's
functional_call): the loaded model and the caller's tensors are never modified.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from rotviz.data.split import Split
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.limits import GRID, SEED, SPAN
from rotviz.sources.loading import Loaded
from rotviz.types import Progress

Tensor = torch.Tensor
NORMS = ("filter", "layer", "none")
DIRECTIONS = ("random", "hessian")
EPS = 1e-12  # a direction row this small (never, for Gaussian draws) is left as it is


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
    # set by rotviz.analysis.directions.slice_around / slice_with (slices around any point):
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
    # and whether it is small enough to call them eigenvectors (rotviz.analysis.hessian)
    residual: float | None = None
    converged: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def check_choices(norm: str, directions: str, dims: int, norms: Sequence[str] = NORMS,
                  kinds: Sequence[str] = DIRECTIONS) -> None:
    """One line for a normalisation, direction kind or dimension this slicer does not take
    (rotviz.analysis.directions passes its larger lists)."""
    if norm not in norms:
        raise RotvizError(f"unknown --norm '{norm}': use one of {', '.join(norms)}")
    if directions not in kinds:
        raise RotvizError(f"unknown --directions '{directions}': use one of "
                          f"{', '.join(kinds)}")
    if dims not in (1, 2):
        raise RotvizError(f"--dims must be 1 or 2, got {dims}")


def normalise(d: Tensor, w: Tensor, norm: str, keep_1d: bool = False) -> Tensor:
    """The direction `d` of one tensor, normalised against its weights `w` (a new tensor).

    `filter`: every row (first index) of d rescaled to the L2 norm of that row of w; a 1-D
    tensor's rows are its entries. `layer`: d rescaled to |w|. `none`: d. A 1-D tensor (bias,
    norm gain) becomes zeros unless `keep_1d`. Computed in float64, returned in d's dtype."""
    if d.dim() <= 1 and not keep_1d:
        return torch.zeros_like(d)
    if norm == "none":
        return d.clone()
    dd, ww = d.double(), w.double()
    if norm == "layer":
        dn = torch.linalg.vector_norm(dd)
        out = dd * (torch.linalg.vector_norm(ww) / dn) if dn > EPS else dd
        return out.to(d.dtype)
    if norm != "filter":
        raise RotvizError(f"unknown --norm '{norm}': use one of {', '.join(NORMS)}")
    rows_d = dd.reshape(dd.shape[0], -1) if dd.dim() >= 1 else dd.reshape(1, 1)
    rows_w = ww.reshape(rows_d.shape)
    dn = torch.linalg.vector_norm(rows_d, dim=1, keepdim=True)
    wn = torch.linalg.vector_norm(rows_w, dim=1, keepdim=True)
    scale = torch.where(dn > EPS, wn / dn.clamp_min(EPS), torch.ones_like(dn))
    return (rows_d * scale).reshape(d.shape).to(d.dtype)


def tensor_seed(seed: int, name: str) -> int:
    """The seed of one tensor's draws, from (`seed`, the tensor's name): a tensor's directions
    then do not depend on which tensors come before it, so a model read block by block (in
    whatever order; rotviz.stream.slices) draws exactly what the loaded model draws."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def tensor_directions(name: str, w: Tensor, count: int, seed: int = 0, norm: str = "filter",
                      keep_1d: bool = False) -> list[Tensor]:
    """`count` directions of the one tensor `w` called `name` (the module's parameter name):
    Gaussian entries drawn on the CPU in float32 from a generator seeded by
    `tensor_seed(seed, name)` (direction 1, then 2), cast to w's device and dtype and
    normalised against w by `normalise`."""
    if w.dim() <= 1 and not keep_1d:  # zeroed whatever the draw
        return [torch.zeros_like(w) for _ in range(count)]
    gen = torch.Generator().manual_seed(tensor_seed(seed, name))
    raws = [torch.randn(tuple(w.shape), generator=gen, dtype=torch.float32)
            for _ in range(count)]
    return [normalise(r.to(w.device, w.dtype), w, norm, keep_1d) for r in raws]


def random_directions(params: Mapping[str, Tensor], movable: set[str], count: int,
                      seed: int = 0, norm: str = "filter", keep_1d: bool = False
                      ) -> list[dict[str, Tensor]]:
    """`count` seeded Gaussian directions over `params`, each tensor's drawn on its own by
    `tensor_directions` (seeded from `seed` and the tensor's name, in float32 on the CPU: a
    seed gives the same directions on every device, in any order of the tensors, and read
    block by block at size) and normalised by `normalise`; tensors not in `movable`
    (buffers) get zeros."""
    SEED.check(seed)
    out: list[dict[str, Tensor]] = [{} for _ in range(count)]
    for k, w in params.items():
        if k not in movable or not w.is_floating_point():
            ds = [torch.zeros_like(w) for _ in range(count)]
        else:
            ds = tensor_directions(k, w, count, seed, norm, keep_1d)
        for d, t in zip(out, ds, strict=True):
            d[k] = t
    return out


def hessian_directions(ev: Evaluator, theta: Mapping[str, Tensor], count: int,
                       seed: int = 0, norm: str = "filter", keep_1d: bool = False,
                       steps: int = 100, info: dict | None = None
                       ) -> tuple[list[dict[str, Tensor]], list[float]]:
    """The top-`count` eigenvectors of the Hessian of the split's mean loss at `theta`
    (rotviz.analysis.hessian: seeded Lanczos, Ritz vectors), each tensor then normalised by
    `normalise` like a random direction; with `none` they stay unit, orthonormal eigenvectors.
    Returns the directions and their eigenvalues (largest first).

    Which Hessian: the one of the parameters a slice moves. With biases and norm gains zeroed
    (not `keep_1d`) that is the principal sub-matrix without the 1-D tensors, so that with
    `none` a direction is exactly an eigenvector of the curvature the slice sees, and the
    1D slice's second derivative at the centre is its eigenvalue times |d|^2. With a dict
    `info`, the Lanczos run's `residual` and `converged` (`top_eigenvectors`)."""
    from rotviz.analysis.hessian import Curvature, restricted, top_eigenvectors

    SEED.check(seed)
    cur = Curvature(ev, theta)
    mask = None
    hvp = cur.hvp
    if not keep_1d:
        mask = torch.cat([torch.full((size,), len(shape) > 1, dtype=torch.bool)
                          for size, shape in zip(cur.sizes, cur.shapes, strict=True)]
                         ).to(cur.device)
        hvp = restricted(cur.hvp, mask)
    gen = torch.Generator().manual_seed(seed)
    vals, vecs = top_eigenvectors(hvp, cur.n, count, gen, cur.dtype, cur.device, mask,
                                  steps, info=info)
    if len(vecs) < count:
        raise RotvizError(f"found {len(vecs)} Hessian eigenvectors, fewer than --dims {count}")
    out = []
    for v in vecs:
        parts = dict(zip(cur.names, cur.unflat(v), strict=True))
        d = {}
        for k, w in theta.items():
            if k not in parts:
                d[k] = torch.zeros_like(w)
                continue
            d[k] = normalise(parts[k].to(w.device, w.dtype), w, norm, keep_1d)
        out.append(d)
    return out, vals


def _wide_norm(d: Mapping[str, Tensor]) -> float:
    return float(torch.sqrt(sum(torch.sum(v.double() ** 2) for v in d.values())))


def _inner(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    return float(sum(torch.sum(a[k].double() * b[k].double()) for k in a))


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
    xs = np.linspace(-span, span, grid)
    ys = xs if dims == 2 else np.zeros(0)

    keys = list(theta)
    base, first = [theta[k] for k in keys], [ds[0][k] for k in keys]
    second = [ds[-1][k] for k in keys]

    def at(cell: tuple[int, int]) -> dict[str, Tensor]:
        x, y = float(xs[cell[1]]), float(ys[cell[0]]) if dims == 2 else 0.0
        if x == 0.0 and y == 0.0:  # the point itself, with no arithmetic on its weights
            return theta
        moved = torch._foreach_add(base, first, alpha=x)  # theta + x d1 + y d2, one pass
        if dims == 2:
            torch._foreach_add_(moved, second, alpha=y)
        return dict(zip(keys, moved, strict=True))

    cells = [(0, ix) for ix in range(grid)] if dims == 1 else \
        [(iy, ix) for iy in range(grid) for ix in range(grid)]

    def done(count: int) -> None:
        if progress:
            progress(count, len(cells), f"grid point {count} of {len(cells)}")

    found = ev.evaluate_each(at, cells, done)
    loss = np.zeros((max(1, len(ys)), grid))
    acc = np.zeros_like(loss)
    for (iy, ix), (cell_loss, cell_acc) in zip(cells, found, strict=True):
        loss[iy, ix], acc[iy, ix] = cell_loss, cell_acc
    centre_loss, centre_acc = ev.evaluate(theta)
    norms = [_wide_norm(d) for d in ds]
    cos = None
    if dims == 2 and norms[0] > 0 and norms[1] > 0:
        cos = _inner(ds[0], ds[1]) / (norms[0] * norms[1])
    return Slice(
        dims=dims, xs=xs.tolist(), ys=ys.tolist(),
        loss=loss[0].tolist() if dims == 1 else loss.tolist(),
        acc=acc[0].tolist() if dims == 1 else acc.tolist(),
        centre_loss=centre_loss, centre_acc=centre_acc,
        directions="given" if given is not None else directions, norm=norm, keep_1d=keep_1d,
        grid=grid, span=float(span), seed=seed, data=split.data, split=split.split,
        device=str(ev.device), seconds=time.perf_counter() - t0, n=split.n, model=loaded.ref,
        direction_norms=norms, cosine=cos, eigenvalues=eigenvalues,
        around="anchor" if point is None else "point", residual=lanczos.get("residual"),
        converged=lanczos.get("converged"),
    )

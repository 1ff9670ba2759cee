"""Loss landscapes between two models: interpolation curves, barriers and the 2D loss plane.

Every parameter set is evaluated on the anchor's one module through
`torch.func.functional_call`, with the data moved to the device once: no model copies, no
mutation of a loaded (possibly cached and shared) model. Results are plain dataclasses with
lists and floats and a `to_dict()`, ready for JSON and for the plots in `rotviz.plots`.

Definitions (docs/conventions.md):
- path: theta(alpha) = (1 - alpha) theta_anchor + alpha theta_source_matched;
- barrier (generalized-LMC paper): max over alpha of L(theta(alpha)) minus the straight line
  between the endpoint losses, (1 - alpha) L(0) + alpha L(1); always >= 0;
- loss range (the seed paper's "loss barrier" in its Figure 5): max minus min along the path.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from rotviz.data.split import Split
from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator, barrier_of, check_split
from rotviz.limits import GRID, MARGIN, POINTS, REPEATS
from rotviz.match.endpoints import HeldEndpoints, match_endpoints
from rotviz.match.options import MatchOptions
from rotviz.sources.loading import Loaded, to_wide
from rotviz.types import Progress

Tensor = torch.Tensor


# ---- evaluation on one module ---------------------------------------------------------------


def flat_inner(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    """<a, b> over the flattened parameter sets, in float64."""
    return float(sum(torch.sum(to_wide(a[k]) * to_wide(b[k])) for k in a))


# ---- interpolation ----------------------------------------------------------------------------


def loss_range_of(loss: Sequence[float]) -> float:
    """The seed paper's barrier: max minus min of the loss along the path."""
    lo = np.asarray(loss, dtype=float)
    return float(lo.max() - lo.min())


@dataclass
class Curve:
    """Loss and accuracy along theta(alpha) = (1 - alpha) anchor + alpha matched source."""

    alphas: list[float]
    loss: list[float]
    acc: list[float]
    barrier: float  # GLMC definition, >= 0
    loss_range: float  # max - min of the loss on the path
    mid_loss: float  # alpha = 0.5: the simple average of the two models
    mid_acc: float
    match: str  # canonical SPEC
    data: str
    split: str
    device: str
    seconds: float
    n: int  # samples evaluated
    layers: list[int] | None = None  # layers matched (None: all)
    anchor: str = ""
    source: str = ""
    distance_before: float = 0.0
    distance_after: float = 0.0
    max_output_diff: float | None = None
    match_seconds: float = 0.0
    repeats: int = 1  # disjoint seeded data subsets; stds below are across them
    loss_std: list[float] = field(default_factory=list)
    acc_std: list[float] = field(default_factory=list)
    barrier_mean: float = 0.0
    barrier_std: float = 0.0
    mid_acc_std: float = 0.0
    task: str = ""  # rotviz.data.tasks: what the model does, and so which metrics it has
    scores: dict[str, list[float]] = field(default_factory=dict)  # metric -> value per alpha
    mid_scores: dict[str, float] = field(default_factory=dict)  # at alpha = 0.5
    # the model's answers on a few fixed test inputs at each alpha (rotviz.analysis.examples:
    # `pred`, `prob` and `pred_names` hold one list per alpha); empty: none were asked for
    examples: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        out = asdict(self)
        if not out["examples"]:  # a curve without examples reads as it always did
            del out["examples"]
        return out


def _partition(n: int, repeats: int, seed: int) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    return [part for part in np.array_split(order, repeats)]


def path_curve(ev: Evaluator, anchor_params: Mapping[str, Tensor],
               source_params: Mapping[str, Tensor], alphas: Sequence[float], repeats: int = 1,
               seed: int = 0, progress: Progress | None = None,
               group: Group = SINGLE, probe: Callable | None = None) -> dict | None:
    """Evaluate the straight path at `alphas` (plus 0.5 if missing). Returns a dict of fields.

    Under torchrun (`group`) each process evaluates its share of the points and rank 0
    gathers them and returns the fields (None elsewhere): the same points, evaluated alike.
    `probe(params)` (rotviz.analysis.examples.probe): the answers on a few fixed inputs at
    each point too, in the field `answers` (one per alpha)."""

    def evaluate(a: float) -> tuple:
        params = {k: torch.lerp(anchor_params[k], source_params[k], a) for k in anchor_params}
        one: list[dict[str, float]] = []
        per = ev.per_sample(params, one)
        return (per, one[0]) if probe is None else (per, one[0], probe(params))

    return path_points(evaluate, alphas, ev.n, ev.split.task, repeats, seed, progress, group)


def path_points(evaluate: Callable[[float], tuple], alphas: Sequence[float], n: int,
                task: str, repeats: int = 1, seed: int = 0, progress: Progress | None = None,
                group: Group = SINGLE) -> dict | None:
    """`path_curve` for any way of evaluating a point: `evaluate(alpha)` gives the per-sample
    arrays and the scores of `Evaluator.per_sample` (rotviz.atsize.points builds each point
    block by block) on a split of `n` samples."""
    alphas = [float(a) for a in alphas]
    extra = [] if any(abs(a - 0.5) < 1e-12 for a in alphas) else [0.5]
    todo = alphas + extra
    mine = group.mine(list(range(len(todo))))
    done: dict[int, tuple] = {}
    for count, j in enumerate(mine):
        done[j] = evaluate(todo[j])
        if progress:
            progress(count + 1, len(mine), f"alpha = {todo[j]:.3f}")
    parts = group.gather(done)
    if parts is None:
        return None
    for part in parts:
        done.update(part)
    per = [done[j][0] for j in range(len(todo))]
    scored = [done[j][1] for j in range(len(todo))]
    loss = np.array([p[0].sum() / p[2].sum() for p in per])
    acc = np.array([p[1].sum() / p[2].sum() for p in per])
    mid = int(np.argmin([abs(a - 0.5) for a in todo]))
    k = len(alphas)
    out = dict(alphas=alphas, loss=loss[:k].tolist(), acc=acc[:k].tolist(),
               barrier=barrier_of(alphas, loss[:k]), loss_range=loss_range_of(loss[:k]),
               mid_loss=float(loss[mid]), mid_acc=float(acc[mid]), repeats=repeats,
               task=task, scores={m: [sc[m] for sc in scored[:k]] for m in scored[0]},
               mid_scores={m: v for m, v in scored[mid].items()})
    if len(done[0]) > 2:  # the answers on fixed inputs (`path_curve`'s probe)
        out["answers"] = [done[j][2] for j in range(k)]
    if repeats > 1:
        parts = _partition(n, repeats, seed)
        pl = np.array([[p[0][ix].sum() / p[2][ix].sum() for p in per] for ix in parts])
        pa = np.array([[p[1][ix].sum() / p[2][ix].sum() for p in per] for ix in parts])
        bars = np.array([barrier_of(alphas, row[:k]) for row in pl])
        out.update(loss_std=pl[:, :k].std(0, ddof=1).tolist(),
                   acc_std=pa[:, :k].std(0, ddof=1).tolist(),
                   barrier_mean=float(bars.mean()), barrier_std=float(bars.std(ddof=1)),
                   mid_acc_std=float(pa[:, mid].std(ddof=1)))
    else:
        out.update(barrier_mean=out["barrier"])
    return out


def check_path(points: int, repeats: int, split: Split) -> None:
    """A curve's point count, repeats and split, each a one-line error when out of range."""
    POINTS.check(points)
    REPEATS.check(repeats)
    check_split(split)
    if repeats < 1 or repeats > split.n:
        raise RotvizError(f"repeats must be between 1 and the split size {split.n}, got {repeats}")


def curve_on(
    ends: HeldEndpoints,
    split: Split,
    points: int = 21,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    repeats: int = 1,
    seed: int = 0,
    batch_size: int = 512,
    evaluator: Evaluator | None = None,
    group: Group = SINGLE,
    examples: int = 0,
) -> Curve | None:
    """curve_on(endpoints, split, points=21, device=) -> Curve

    Loss and accuracy along the straight path from the anchor (alpha = 0) to the matched
    source (alpha = 1) at `points` evenly spaced alphas. `repeats` > 1 also reports the
    spread over that many disjoint seeded subsets of the split; `evaluator` reuses data
    already on the device. Under torchrun (`group`) the points are shared among the
    processes and rank 0 returns the curve (None elsewhere). `examples` > 0: the model's
    answers on that many fixed test inputs at each alpha too (`Curve.examples`, for the
    path's animation: rotviz.analysis.examples).
    """
    from rotviz.analysis import examples as ex

    check_path(points, repeats, split)
    t0 = time.perf_counter()
    ev = evaluator or Evaluator(ends.anchor, split, device, batch_size)
    info = ends.info
    alphas = np.linspace(0.0, 1.0, points).tolist()
    probe = ex.probe(ev, split, examples) if examples else None
    fields = path_curve(ev, ev.params(ends.anchor.state), ev.params(ends.matched), alphas,
                        repeats, seed, progress, group, probe)
    if fields is None:  # another rank than 0: its points are with rank 0
        return None
    shown = {}
    if probe is not None:
        shown, name = ex.describe(split, examples), ex.namer(split)
        answers = fields.pop("answers")
        shown["pred"] = [p for p, _ in answers]
        shown["prob"] = [q for _, q in answers]
        shown["pred_names"] = [[name(i) for i in p] for p, _ in answers]
    return Curve(
        **fields, examples=shown, match=info.match, data=split.data, split=split.split,
        device=str(ev.device),
        seconds=time.perf_counter() - t0 + info.seconds, n=split.n, layers=ends.layers,
        anchor=ends.anchor_ref, source=ends.source_ref, distance_before=info.distance_before,
        distance_after=info.distance_after, max_output_diff=info.max_output_diff,
        match_seconds=info.seconds,
    )


def interpolate(
    anchor: Loaded,
    source: Loaded,
    split: Split,
    options: MatchOptions | str | None = None,
    points: int = 21,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    repeats: int = 1,
    seed: int = 0,
    batch_size: int = 512,
    group: Group = SINGLE,
) -> Curve | None:
    """interpolate(anchor, source, split, options|None, points=21, device=, progress=) -> Curve

    Match the source onto the anchor with `options` (a MatchOptions, a SPEC string, or None
    for no matching; activation and learned matching train on the split's train sibling),
    then `curve_on` the endpoints.
    """
    check_path(points, repeats, split)
    ev = Evaluator(anchor, split, device, batch_size)
    ends = match_endpoints(anchor, source, options, ev.device, data=split)
    return curve_on(ends, split, points, device, progress, repeats, seed, batch_size, ev, group)


# ---- the 2D loss plane --------------------------------------------------------------------------


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


def plane_on(
    ends: HeldEndpoints,
    split: Split,
    grid: int = 21,
    margin: float = 0.25,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    batch_size: int = 512,
    seed: int = 0,
    group: Group = SINGLE,
) -> Plane | None:
    """plane_on(endpoints, split, grid=21, margin=0.25, device=) -> Plane

    The seed paper's Figure 2 made real: a grid x grid evaluation of the plane through A
    (anchor), B (source) and B' (matched source), covering the three points with `margin`
    (a fraction of the span) on each side, plus the exact values at A, B, B' and the
    midpoints AB and AB'. When B' lies on the A-B line (no matching), the second direction
    is a random one drawn with `seed`. Under torchrun (`group`) the grid points are shared
    among the processes; rank 0 adds the named points and returns the plane (None elsewhere).
    """
    GRID.check(grid)
    MARGIN.check(margin)
    t0 = time.perf_counter()
    anchor, source = ends.anchor, ends.source
    ev = Evaluator(anchor, split, device, batch_size)
    pa, pb, pc = ev.params(anchor.state), ev.params(source.state), ev.params(ends.matched)
    d_b = {k: pb[k] - pa[k] for k in pa}
    d_c = {k: pc[k] - pa[k] for k in pa}
    bb = flat_inner(d_b, d_b)
    n1, c, n2 = plane_frame(bb, flat_inner(d_b, d_c), flat_inner(d_c, d_c))
    pts = plane_points(n1, c, n2)
    degenerate = n2 <= 1e-6 * n1
    if degenerate:  # B' on the A-B line (e.g. no matching): y is a seeded random direction
        gen = torch.Generator().manual_seed(seed)
        d_c = {k: torch.randn(v.shape, generator=gen).to(v) for k, v in d_b.items()}
        pts["B'"], pts["AB'"] = (c, 0.0), (c / 2, 0.0)
        n1, c, n2 = plane_frame(bb, flat_inner(d_b, d_c), flat_inner(d_c, d_c))
    xs, ys = plane_axes(pts, n1, margin, grid, degenerate)

    def node(xy: tuple[float, float]) -> dict[str, Tensor]:
        a, b = plane_coeffs(*xy, n1, c, n2)
        return {k: pa[k] + a * d_b[k] + b * d_c[k] for k in pa}

    def at(x: float, y: float) -> tuple[float, float]:
        return ev.evaluate(node((x, y)))

    def named(name: str) -> tuple[float, float]:
        if name in ("A", "B"):  # exact endpoints, no arithmetic on the weights
            return ev.evaluate(pa if name == "A" else pb)
        if name == "B'":
            return ev.evaluate(pc)
        if name == "AB'":
            return ev.evaluate({k: torch.lerp(pa[k], pc[k], 0.5) for k in pa})
        return at(*pts[name])

    found = plane_grid(at, named, pts, xs, ys, progress, group,
                       lambda nodes, done: ev.evaluate_each(node, nodes, done))
    if found is None:  # another rank than 0: its points are with rank 0
        return None
    loss, acc, point_loss, point_acc = found
    return Plane(
        xs=xs.tolist(), ys=ys.tolist(), loss=loss.tolist(), acc=acc.tolist(),
        points={k: [float(v[0]), float(v[1])] for k, v in pts.items()},
        point_loss=point_loss, point_acc=point_acc, match=ends.match, data=split.data,
        split=split.split, device=str(ev.device),
        seconds=time.perf_counter() - t0 + ends.info.seconds, grid=grid, n=split.n,
        layers=ends.layers, anchor=anchor.ref, source=source.ref, distance_ab=n1,
        distance_ab_matched=math.hypot(*pts["B'"]), degenerate=degenerate,
    )


def loss_plane(
    anchor: Loaded,
    source: Loaded,
    split: Split,
    options: MatchOptions | str | None = "seed",
    grid: int = 21,
    margin: float = 0.25,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    batch_size: int = 512,
    seed: int = 0,
    group: Group = SINGLE,
) -> Plane | None:
    """loss_plane(anchor, source, split, options="seed", grid=21, device=, progress=) -> Plane

    Match the source onto the anchor with `options` (MatchOptions, a SPEC string or None),
    then `plane_on` the endpoints."""
    GRID.check(grid)
    MARGIN.check(margin)
    ends = match_endpoints(anchor, source, options, device, data=split)
    return plane_on(ends, split, grid, margin, device, progress, batch_size, seed, group)

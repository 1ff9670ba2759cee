"""The straight path between two parameter sets, and loss and accuracy along it.

`path_point` is the one interpolation every curve, plane, layer-wise barrier, sharpness
profile and learned matching evaluates: theta(alpha) = (1 - alpha) a + alpha b, formed as
torch.lerp forms it (from the nearer end), on floating tensors only: integer buffers
(position ids, masks) are a's. The ends are exact, alpha = 0 and 1 give the endpoints' own
tensors, not a rounded mixture, so a pair whose ends are one model has a barrier of exactly 0.

`path_curve` / `path_points` evaluate such a path (or any path a caller builds point by
point, at size block by block) into a `Curve`'s fields: the barrier record's
(rotviz.measures.barrier.curve_on, on endpoints, which the training, sweeps and distances
records call too), the ladder's and the rounds'. Learned matching evaluates its paths with
`path_point` too, so this module sits below matching: it reads no endpoints.

Definitions (docs/conventions.md):
- barrier (generalized-LMC paper): max over alpha of L(theta(alpha)) minus the straight line
  between the endpoint losses, (1 - alpha) L(0) + alpha L(1); always >= 0;
- loss range (the seed paper's "loss barrier" in its Figure 5): max minus min along the path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from rotviz.data.split import Split
from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator, barrier_of, check_split
from rotviz.limits import POINTS, REPEATS
from rotviz.types import Progress

Tensor = torch.Tensor


def path_point(a: Mapping[str, Tensor], b: Mapping[str, Tensor], alpha: float
               ) -> dict[str, Tensor]:
    """(1 - alpha) a + alpha b on a's floating tensors (b cast to a's dtype); a's others
    kept. Never writes into a or b."""
    if alpha == 0.0:
        return dict(a)
    if alpha == 1.0:
        return {k: b[k] if a[k].is_floating_point() else a[k] for k in a}
    return {k: torch.lerp(a[k], b[k].to(a[k].dtype), alpha) if a[k].is_floating_point()
            else a[k] for k in a}


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
        params = path_point(anchor_params, source_params, a)
        one: list[dict[str, float]] = []
        per = ev.per_sample(params, one)
        return (per, one[0]) if probe is None else (per, one[0], probe(params))

    many = None if probe is not None else path_many(
        ev, lambda a: path_point(anchor_params, source_params, a))
    return path_points(evaluate, alphas, ev.n, ev.split.task, repeats, seed, progress, group,
                       many)


def path_many(ev: Evaluator, point: Callable[[float], Mapping[str, Tensor]]
              ) -> Callable[[list[float], Callable[[int], None]], list[tuple]]:
    """`path_points`' `many` for the parameter sets `point(alpha)` on `ev`: the points
    several a pass where that pays (Evaluator.per_sample_each), each with its scores."""
    def many(alphas: list[float], done: Callable[[int], None]) -> list[tuple]:
        scored: list[dict[str, float]] = []
        per = ev.per_sample_each(point, alphas, done, scored)
        return list(zip(per, scored, strict=True))
    return many


def path_points(evaluate: Callable[[float], tuple], alphas: Sequence[float], n: int,
                task: str, repeats: int = 1, seed: int = 0, progress: Progress | None = None,
                group: Group = SINGLE,
                many: Callable[[list[float], Callable[[int], None]], list[tuple]] | None = None
                ) -> dict | None:
    """`path_curve` for any way of evaluating a point: `evaluate(alpha)` gives the per-sample
    arrays and the scores of `Evaluator.per_sample` (rotviz.atsize.points builds each point
    block by block) on a split of `n` samples. `many(alphas, done)`, when given, evaluates
    this process's points at once instead (several a pass: `path_many`), `done(k)` after the
    first k."""
    alphas = [float(a) for a in alphas]
    extra = [] if any(abs(a - 0.5) < 1e-12 for a in alphas) else [0.5]
    todo = alphas + extra
    if many is None:
        done = group.each(len(todo), lambda j: evaluate(todo[j]), progress,
                          lambda n, total, j: f"alpha = {todo[j]:.3f}")
    else:
        mine = group.mine(list(range(len(todo))))

        def tick(k: int) -> None:
            if progress:
                progress(k, len(mine), f"alpha = {todo[mine[k - 1]]:.3f}")

        done = dict(zip(mine, many([todo[j] for j in mine], tick), strict=True))
        parts = group.gather(done)
        if parts is None:
            return None
        for part in parts:
            done.update(part)
    if done is None:
        return None
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

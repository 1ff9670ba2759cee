"""Curved paths (Garipov et al., NeurIPS 2018): a Bezier curve or a polygonal chain with
one bend trained between the anchor and the matched source, beside the straight line
(docs/landscape.md). Here: the record, the training and evaluation (`bend_on`) and the
figures (`bend_curves`, `bend_on_plane`).

Two minima that a straight line separates by a barrier are often joined by a simple curve of
low loss. Between the anchor A and the matched source B' (or the source B without matching)
we train one bend C and draw either

- a quadratic Bezier curve, theta(t) = (1 - t)^2 A + 2 t (1 - t) C + t^2 B', or
- a polygonal chain with one bend, A -> C (at t = 0.5) -> B'.

C starts at the midpoint (A + B') / 2, where the Bezier curve is the straight line and the
chain is the straight line too, and is trained with Adam on the split's train sibling: at each
step a t drawn uniformly in [0, 1] and a batch (both seeded), the loss at theta(t) through
`torch.func.functional_call` on the anchor's module (rotviz.evaluation.Evaluator), so no
loaded model is ever modified. The curve is then evaluated on the test split at evenly
spaced t, with the curve's barrier (same definition as the straight line's: the largest rise
of L(t) above the line between the end losses) beside the straight line's.

Where the bend lies: in the plane through A, B and B' (rotviz.analysis.planes' frame, x
along B - A, y along the part of B' - A orthogonal to it), and its distance from that plane
(the norm of the part of C - A orthogonal to span(B - A, B' - A)). A curve drawn on the
plane's surface is the projection of a path that leaves the plane by that distance, so the
surface under it is not the loss the curve meets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from rotviz.limits import BATCH_SIZE, LR, POINTS, SEED, STEPS
from rotviz.measures.barrier import match_label
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import torch

    from rotviz.data.split import Split
    from rotviz.evaluation import Evaluator
    from rotviz.match.endpoints import HeldEndpoints
    from rotviz.types import Progress

    Tensor = torch.Tensor

KINDS = ("bezier", "chain")

PARAMS = (
    Param("kind", "bezier", "curve: a quadratic Bezier curve or a polygonal chain, one bend "
          "(default bezier)", choices=KINDS, label="Curve",
          essential=True),
    Param("steps", 300, f"Adam steps training the bend (default 300, {STEPS.text})", STEPS,
          label="Training steps", widget=(10, 1000, 10), essential=True),
    Param("lr", 0.01, f"Adam learning rate of the bend (default 0.01, {LR.text})", LR,
          label="Learning rate"),
    Param("points", 21, f"number of t in [0, 1] evaluated (default 21, {POINTS.text})", POINTS,
          label="Points on the curve", widget=(3, 41, 2)),
    Param("seed", 0, "seed of the t and batches drawn in training (default 0)", SEED,
          label="Seed"),
    Param("batch_size", 64, f"training batch size (default 64, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Training batch size"),
)


def curve_point(a: Mapping[str, Tensor], c: Mapping[str, Tensor], b: Mapping[str, Tensor],
                t: float, kind: str = "bezier") -> dict[str, Tensor]:
    """theta(t) on the curve with ends `a`, `b` and bend `c` (new tensors; gradients reach
    `c` when it requires them).

    The weights are exact at the ends: the Bezier weights at t = 0 are (1, 0, 0), so theta(0)
    is A + 0 + 0 = A bit for bit (and B' at t = 1); the chain is two straight paths
    (rotviz.analysis.paths.path_point), exact at their ends."""
    from rotviz.analysis.paths import path_point
    from rotviz.errors import RotvizError

    if kind == "bezier":
        wa, wc, wb = (1.0 - t) ** 2, 2.0 * t * (1.0 - t), t * t
        return {k: wa * a[k] + wc * c[k] + wb * b[k] for k in a}
    if kind == "chain":
        if t <= 0.5:
            return path_point(a, c, 2.0 * t)
        return path_point(c, b, 2.0 * t - 1.0)
    raise RotvizError(f"unknown curve kind '{kind}': use one of {', '.join(KINDS)}")


def midpoint(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """(A + B') / 2: where the bend starts (the curve is then the straight line)."""
    from rotviz.analysis.paths import path_point

    return path_point(a, b, 0.5)


@dataclass
class TrainInfo:
    steps: int = 0
    stopped: str = ""  # "steps" or "cancelled"
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)  # {"step", "t", "loss"} every step

    def to_dict(self) -> dict:
        return asdict(self)


def train_bend(ev: Evaluator, a: Mapping[str, Tensor], b: Mapping[str, Tensor],
               kind: str = "bezier", steps: int = 200, lr: float = 1e-3, seed: int = 0,
               batch_size: int = 64, progress: Progress | None = None,
               cancel: Callable[[], bool] | None = None) -> tuple[dict[str, Tensor], TrainInfo]:
    """Train the bend C of the curve from `a` to `b` on `ev`'s split (its train split).

    Adam on C alone; each step draws t ~ U(0, 1) and a batch without replacement from a
    generator seeded with `seed` (torch's global seed is left alone), so two calls with the
    same arguments give the same C. `a` and `b` are never modified. Returns C (detached)
    and what training did; `cancel()` returning True stops after the current step."""
    import time

    import numpy as np
    import torch

    from rotviz.data.inputs import cat_inputs, map_inputs
    from rotviz.match.learned import _train_loss

    t0 = time.perf_counter()
    info = TrainInfo(stopped="steps")
    a = {k: v.detach() for k, v in a.items()}
    b = {k: v.detach() for k, v in b.items()}
    bend = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in midpoint(a, b).items()}
    trained = [v for v in bend.values() if v.requires_grad]
    optim = torch.optim.Adam(trained, lr=lr)
    gen = np.random.default_rng(seed)
    xs = cat_inputs([x for x, _ in ev.batches])
    ys = torch.cat([y for _, y in ev.batches])
    n = len(ys)
    size = min(batch_size, n)
    for step in range(1, steps + 1):
        if cancel is not None and cancel():
            info.stopped = "cancelled"
            break
        t = float(gen.uniform(0.0, 1.0))
        pick = torch.as_tensor(gen.choice(n, size=size, replace=False)).to(ys.device)
        params = curve_point(a, bend, b, t, kind)
        loss = _train_loss(ev, params, map_inputs(xs, lambda v, i=pick: v[i]), ys[pick])
        optim.zero_grad()
        loss.backward()
        optim.step()
        value = float(loss.detach())
        info.steps = step
        info.history.append({"step": step, "t": t, "loss": value})
        if progress:
            progress(step, steps, f"bend step {step}: loss at t {t:.2f} = {value:.3f}")
    info.seconds = time.perf_counter() - t0
    return {k: v.detach() for k, v in bend.items()}, info


def bend_in_plane(a: Mapping[str, Tensor], b: Mapping[str, Tensor], bm: Mapping[str, Tensor],
                  c: Mapping[str, Tensor]) -> dict:
    """Where the bend C lies against the plane through A, B and B' (float64).

    Returns x, y (C - A in the plane's frame: x along B - A, y along the part of B' - A
    orthogonal to it), `off_plane` (the norm of the rest of C - A), the plane's points
    (rotviz.analysis.planes.plane_points) and `degenerate` (B' on the A-B line, as
    without matching: then the plane is that line and y is 0)."""
    import math

    import torch

    from rotviz.analysis.planes import plane_frame, plane_points
    from rotviz.sources.loading import to_wide

    keys = list(a)
    wa = {k: to_wide(a[k]) for k in keys}
    db = {k: to_wide(b[k]) - wa[k] for k in keys}
    dc = {k: to_wide(bm[k]) - wa[k] for k in keys}
    e = {k: to_wide(c[k]) - wa[k] for k in keys}

    def dot(u: Mapping[str, Tensor], v: Mapping[str, Tensor]) -> float:
        return float(sum(torch.sum(u[k] * v[k]) for k in keys))

    n1, cx, _ = plane_frame(dot(db, db), dot(db, dc), dot(dc, dc))
    u1 = {k: db[k] / n1 for k in keys}
    # B' off the A-B line, as a vector: its norm from the inner products (|B'-A|^2 - c^2)
    # loses half the digits, and B' = B (no matching) must read as exactly on the line
    off = {k: dc[k] - cx * u1[k] for k in keys}
    n2 = math.sqrt(dot(off, off))
    x = dot(e, u1)
    degenerate = n2 <= 1e-9 * n1
    y = 0.0
    rest = {k: e[k] - x * u1[k] for k in keys}
    if degenerate:
        n2 = 0.0
    else:
        u2 = {k: off[k] / n2 for k in keys}
        y = dot(e, u2)
        rest = {k: rest[k] - y * u2[k] for k in keys}
    pts = {k: list(v) for k, v in plane_points(n1, cx, n2).items()}
    return {"x": x, "y": y, "off_plane": math.sqrt(max(dot(rest, rest), 0.0)),
            "norm": math.sqrt(dot(e, e)), "points": pts, "degenerate": degenerate}


def projected_path(kind: str, start: list[float], bend: list[float], end: list[float],
                   ts: list[float]) -> list[list[float]]:
    """The curve's projection on the plane at `ts` (the curve is affine in its three control
    points, so its projection is the same curve through their projections)."""
    import numpy as np

    p0, p1, p2 = (np.asarray(p, dtype=float) for p in (start, bend, end))
    out = []
    for t in ts:
        if kind == "bezier":
            q = (1 - t) ** 2 * p0 + 2 * t * (1 - t) * p1 + t * t * p2
        else:
            q = p0 + 2 * t * (p1 - p0) if t <= 0.5 else p1 + (2 * t - 1) * (p2 - p1)
        out.append([float(q[0]), float(q[1])])
    return out


@dataclass
class Bend:
    """A trained curved path and the straight line beside it, both on the test split."""

    kind: str  # "bezier" or "chain"
    ts: list[float]
    loss: list[float]  # along the curve
    acc: list[float]
    barrier: float  # the curve's, as the straight line's (>= 0)
    line_loss: list[float]  # the straight line at the same ts
    line_acc: list[float]
    line_barrier: float
    bend_x: float  # the bend in the A/B/B' plane's frame
    bend_y: float
    off_plane: float  # its distance from that plane
    bend_norm: float  # |C - A|
    points: dict[str, list[float]]  # the plane's A, B, B', AB, AB' ([x, y])
    path_xy: list[list[float]]  # the curve's projection on the plane at ts
    degenerate: bool
    steps: int
    lr: float
    seed: int
    stopped: str
    train_loss: list[float]  # per step
    train_seconds: float
    match: str
    data: str
    split: str
    device: str
    seconds: float
    n: int
    n_train: int
    anchor: str = ""
    source: str = ""
    layers: list[int] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def check_bend(kind: str, steps: int, lr: float, points: int, seed: int, batch_size: int) -> None:
    from rotviz.errors import RotvizError

    if kind not in KINDS:
        raise RotvizError(f"unknown --kind '{kind}': use one of {', '.join(KINDS)}")
    STEPS.check(steps)
    LR.check(lr)
    POINTS.check(points)
    SEED.check(seed)
    BATCH_SIZE.check(batch_size)


def bend_on(ends: HeldEndpoints, split: Split, kind: str = "bezier", steps: int = 300,
            lr: float = 1e-2, points: int = 21, seed: int = 0, batch_size: int = 64,
            device: str | torch.device = "cpu", progress: Progress | None = None,
            cancel: Callable[[], bool] | None = None, train: Split | None = None,
            eval_batch_size: int = 512) -> Bend:
    """bend_on(endpoints, split, kind="bezier", steps=300, lr=0.01, points=21) -> Bend

    Train the bend of a `kind` curve from the anchor to the matched source on `train`
    (default: the split's train sibling), then evaluate the curve and the straight line on
    `split` at `points` evenly spaced t."""
    import time

    import numpy as np

    from rotviz.analysis.paths import path_curve, path_many, path_points
    from rotviz.dist import SINGLE
    from rotviz.evaluation import Evaluator

    check_bend(kind, steps, lr, points, seed, batch_size)
    t0 = time.perf_counter()
    train = train if train is not None else split.sibling("train")
    ev_train = Evaluator(ends.anchor, train, device, batch_size=max(batch_size, 1))
    a = ev_train.params(ends.anchor.state)
    bm = ev_train.params(ends.matched)
    c, info = train_bend(ev_train, a, bm, kind, steps, lr, seed, batch_size, progress, cancel)
    ev = Evaluator(ends.anchor, split, ev_train.device, eval_batch_size)
    ts = np.linspace(0.0, 1.0, points).tolist()

    def evaluate(t: float) -> tuple:
        one: list[dict[str, float]] = []
        return ev.per_sample(curve_point(a, c, bm, t, kind), one), one[0]

    curve = path_points(evaluate, ts, ev.n, split.task, group=SINGLE,
                        many=path_many(ev, lambda t: curve_point(a, c, bm, t, kind)))
    line = path_curve(ev, a, bm, ts)
    assert curve is not None and line is not None  # one process: never None
    where = bend_in_plane(a, ev.params(ends.source.state), bm, c)
    pts = where["points"]
    xy = projected_path(kind, pts["A"], [where["x"], where["y"]], pts["B'"], ts)
    info_m = ends.info
    return Bend(kind, ts, curve["loss"], curve["acc"], curve["barrier"], line["loss"],
                line["acc"], line["barrier"], where["x"], where["y"], where["off_plane"],
                where["norm"], pts, xy, where["degenerate"], info.steps, lr, seed,
                info.stopped, [h["loss"] for h in info.history], info.seconds, info_m.match,
                split.data, split.split, str(ev.device), time.perf_counter() - t0, split.n,
                train.n, ends.anchor_ref, ends.source_ref, ends.layers)


def _run(ends, ctx: Context, v: dict):
    return bend_on(ends, ctx.split, v["kind"], v["steps"], v["lr"], v["points"], v["seed"],
                   v["batch_size"], ctx.device, ctx.progress, ctx.cancel)


def _summary(b, how: str) -> str:
    return (f"bend [{match_label(b.match, b.layers)}] {b.kind} on {b.device}{how}: barrier "
            f"{b.barrier:.4f} (straight line {b.line_barrier:.4f}); bend at ({b.bend_x:.3f}, "
            f"{b.bend_y:.3f}) in the A/B/B' plane, {b.off_plane:.3f} off it; {b.steps} steps "
            f"({b.stopped}) on {b.n_train} train samples in {b.train_seconds:.1f} s; "
            f"{len(b.ts)} points on {b.n} {b.split} samples")


KIND_NAMES = {"bezier": "Bezier curve", "chain": "polygonal chain"}


T_AXIS = "curve parameter t (0 = anchor, 1 = matched source; straight line: α = t)"


def bend_curves(d: Mapping, metric: str = "loss", font_size: int = 14,
                title: str | None = None, acc_range: Sequence[float] | None = None
                ) -> go.Figure:
    """The loss (or accuracy) along the trained curve and along the straight line at the
    same t, each barrier marked as a dotted segment above the line between the end losses
    and given in the legend. `d` is `Bend.to_dict()`. The accuracy
    axis follows both curves unless `acc_range` is given (`style.ACC_FIXED`: 0-1)."""
    import plotly.graph_objects as go

    from rotviz.plots import style
    from rotviz.plots.paths import barrier_point

    fig = go.Figure()
    curve = KIND_NAMES.get(str(d["kind"]), str(d["kind"]))
    key = "loss" if metric == "loss" else "acc"
    series = [(f"{curve} with a trained bend", d[key]),
              ("straight line", d["line_" + key])]
    ts = [float(t) for t in d["ts"]]
    for i, (name, ys) in enumerate(series):
        ys = [float(v) for v in ys]
        if metric == "loss":
            am, top, base = barrier_point(ts, ys)
            name = f"{name} (barrier {top - base:.3f})"
        fig.add_scatter(x=ts, y=ys, mode="lines+markers", name=name, legendgroup=str(i),
                        line={"color": style.color(i), "dash": style.dash(i), "width": 2.5},
                        marker={"symbol": style.marker(i), "size": 6},
                        hovertemplate="t=%{x:.2f}: %{y:.4f}<extra>" + name + "</extra>")
        if metric == "loss":
            fig.add_scatter(x=[am, am], y=[base, top], mode="lines", legendgroup=str(i),
                            showlegend=False,
                            line={"color": style.color(i), "width": 1.5, "dash": "dot"},
                            hovertemplate=f"barrier {top - base:.3f} at t={am:.2f}"
                                          "<extra></extra>")
    what = "Loss" if metric == "loss" else "Accuracy"
    default = (f"{what} along a {curve} (bend {d['off_plane']:.3f} off the A/B/B' plane) "
               "and the straight line")
    fig = style.finish(fig, title or default, T_AXIS,
                       style.LOSS if metric == "loss" else style.ACCURACY, "path", font_size)
    fig.update_layout(legend={"orientation": "h", "y": -0.22, "x": 0})
    if metric == "acc":
        fig.update_yaxes(range=list(acc_range) if acc_range is not None else
                         style.acc_range([*d["acc"], *d["line_acc"]]))
    return fig


def bend_on_plane(fig: go.Figure, d: Mapping, index: int = 2) -> go.Figure:
    """Overlay the curve's projection and its bend on a loss-plane figure
    (rotviz.measures.plane.plane_figure, the same frame), naming the bend's distance from the
    plane: the surface under the projected curve is not the loss the curve meets when that
    distance is large."""
    from rotviz.plots import style

    xy = d["path_xy"]
    curve = KIND_NAMES.get(str(d["kind"]), str(d["kind"]))
    fig.add_scatter(x=[p[0] for p in xy], y=[p[1] for p in xy], mode="lines",
                    name=f"{curve} (projected)",
                    line={"color": style.color(index), "width": 3, "dash": "dash"})
    fig.add_scatter(x=[d["bend_x"]], y=[d["bend_y"]], mode="markers",
                    name=f"bend C, {d['off_plane']:.3f} off the plane",
                    marker={"color": style.color(index), "symbol": "star", "size": 14,
                            "line": {"color": "black", "width": 1}})
    return fig


def _plot(d: dict, look: Style):
    return bend_curves(d, font_size=look.font_size)


def _rows(d: dict) -> list[dict]:
    return [{"t": t, "loss": lo, "acc": ac, "line_loss": ll, "line_acc": la, "x": xy[0],
             "y": xy[1]}
            for t, lo, ac, ll, la, xy in zip(d["ts"], d["loss"], d["acc"], d["line_loss"],
                                             d["line_acc"], d["path_xy"], strict=True)]


SECTION = Section(
    "landscape", 30, "2. A curved path from A to B'",
    "Garipov et al. (2018) found that two minima the straight line separates by a barrier "
    "are often joined by a simple *curve*. Here a quadratic Bezier curve (or a two-segment "
    "chain) from A to the matched source B' gets one movable bend, trained with Adam on the "
    "training split; the curve is then evaluated on the test split beside the straight "
    "line. The bend is drawn on the A/B/B' plane, with its distance from that plane: the "
    "colours under the curve are the plane's loss, not the loss the curve meets when the "
    "bend lies far off the plane.",
    defaults={"steps": 50, "points": 11},
    doing=lambda v: f"matching, then {v['steps']} training steps")

BEND = register(Measurement(
    "bend", "Curved path (trained bend)",
    "a Bezier curve or polygonal chain with one bend trained between anchor and matched "
    "source, beside the straight line",
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows,
    refusal="training a bend needs the whole model in memory; run bend on a pair that fits",
    progress=True, section=SECTION, order=110))

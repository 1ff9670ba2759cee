"""Curved paths (Garipov et al. 2018): a Bezier curve or a polygonal chain with one bend
trained between the anchor and the matched source, beside the straight line
(rotviz.analysis.curves; docs/landscape.md)."""

from __future__ import annotations

from rotviz.limits import BATCH_SIZE, LR, POINTS, SEED, STEPS
from rotviz.measures.barrier import match_label
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

PARAMS = (
    Param("kind", "bezier", "curve: a quadratic Bezier curve or a polygonal chain, one bend "
          "(default bezier)", choices=("bezier", "chain"), label="Curve",
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


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.curves import bend_on

    return bend_on(ends, ctx.split, v["kind"], v["steps"], v["lr"], v["points"], v["seed"],
                   v["batch_size"], ctx.device, ctx.progress, ctx.cancel)


def _summary(b, how: str) -> str:
    return (f"bend [{match_label(b.match, b.layers)}] {b.kind} on {b.device}{how}: barrier "
            f"{b.barrier:.4f} (straight line {b.line_barrier:.4f}); bend at ({b.bend_x:.3f}, "
            f"{b.bend_y:.3f}) in the A/B/B' plane, {b.off_plane:.3f} off it; {b.steps} steps "
            f"({b.stopped}) on {b.n_train} train samples in {b.train_seconds:.1f} s; "
            f"{len(b.ts)} points on {b.n} {b.split} samples")


def _plot(d: dict, style: Style):
    from rotviz.plots.curves import bend_curves

    return bend_curves(d)


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

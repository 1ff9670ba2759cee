"""The barrier: loss and accuracy along the straight path from the anchor to the matched
source, theta(alpha) = (1 - alpha) anchor + alpha matched source (docs/landscape.md)."""

from __future__ import annotations

from rotviz.limits import BATCH_SIZE, EXAMPLES, POINTS, REPEATS, SEED
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param, needs
from rotviz.plots.figure_style import Style

PARAMS = (
    Param("points", 21, f"number of alphas in [0, 1] (default 21, {POINTS.text})", POINTS,
          label="Points on the path", widget=(3, 41, 2), essential=True),
    Param("repeats", 1, "also report mean/std over this many disjoint seeded data subsets "
          f"({REPEATS.text})", REPEATS, label="Data subsets (repeats)"),
    Param("seed", 0, "with --repeats: seed of the subsets (default 0)", SEED, label="Seed"),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
    Param("examples", 0, "also record the answers (class or next token, and its probability) "
          "on this many fixed test inputs at each alpha, for the path's animation (default 0: "
          f"none, or 4 with --animation; {EXAMPLES.text})", EXAMPLES,
          label="Test inputs shown in the animation"),
)


def _check(values: dict, given: set[str]) -> None:
    needs("--seed", "seed" in given, "--repeats N with N >= 2 (it seeds the subsets)",
          values["repeats"] > 1)


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.landscape import curve_on
    from rotviz.dist import SINGLE

    return curve_on(ends, ctx.split, v["points"], ctx.device, ctx.progress, v["repeats"],
                    v["seed"], v["batch_size"], group=ctx.group or SINGLE,
                    examples=v["examples"])


def _at_size(ends, ctx: Context, v: dict):
    from rotviz.dist import SINGLE
    from rotviz.stream.sized import sized_curve

    c = sized_curve(ends.anchor_path, ends.matched_path, ctx.split, v["points"], ctx.device,
                    v["batch_size"], repeats=v["repeats"], seed=v["seed"],
                    group=ctx.group or SINGLE, match_info=ends.info, layers=ends.layers)
    if c is not None:
        c.source = ends.source_ref
    return c


def _summary(c, how: str) -> str:
    spread = f" (mean {c.barrier_mean:.4f} +- {c.barrier_std:.4f} over {c.repeats} subsets)" \
        if c.repeats > 1 else ""
    return (f"barrier [{match_label(c.match, c.layers)}] on {c.device}{how}: {c.barrier:.4f}"
            f"{spread}, loss range {c.loss_range:.4f}, accuracy at alpha 0.5 {c.mid_acc:.4f}; "
            f"endpoint losses {c.loss[0]:.4f} / {c.loss[-1]:.4f}; distance "
            f"{c.distance_before:.3f} -> {c.distance_after:.3f}; {len(c.alphas)} points on "
            f"{c.n} {c.split} samples in {c.seconds:.2f} s")


def match_label(match: str, layers: list[int] | None) -> str:
    """A matching SPEC with the layers it was limited to."""
    return match if layers is None else f"{match}, layers {','.join(map(str, layers))}"


def _plot(d: dict, style: Style):
    from rotviz.plots.barrier import barrier_curves

    return barrier_curves([d])


def _animate(d: dict):
    from rotviz.plots.animate import path_animation

    return path_animation(d)


def _rows(d: dict) -> list[dict]:
    return [{"alpha": a, "loss": lo, "acc": ac}
            for a, lo, ac in zip(d["alphas"], d["loss"], d["acc"], strict=True)]


def _figures(d: dict, style: Style) -> dict:
    """The Barrier page's two figures over every matching it picked (a line each): the loss,
    each barrier marked, and the accuracy."""
    from rotviz.plots.barrier import barrier_curves

    return {"barrier_loss": barrier_curves(d["runs"], "loss", style.font_size),
            "barrier_accuracy": barrier_curves(d["runs"], "acc", style.font_size,
                                               acc_range=style.accuracy_axis())}


SECTION = Section("barrier", 10, per_matching=True, on_open=True, figures=_figures,
                  busy="Interpolating", defaults={"examples": 4},  # the animation's answers
                  doing=lambda v: f"matching, then {v['points']} points on the path")

BARRIER = register(Measurement(
    "barrier", "Barrier (loss along the path)",
    "loss and accuracy on the path anchor -> matched source",
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows, at_size=_at_size, check=_check,
    animate=_animate, animate_params={"examples": 4},
    narrower=True,
    at_size_help="matched streamed and evaluated with both checkpoints held as "
                 "stored, each point built block by block", section=SECTION, order=10))

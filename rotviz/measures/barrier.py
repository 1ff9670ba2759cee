"""The barrier: loss and accuracy along the straight path from the anchor to the matched
source, theta(alpha) = (1 - alpha) anchor + alpha matched source (docs/landscape.md): the
record, the curve on endpoints (`curve_on`, which the training, sweeps and distances records
call too; the path's points and fields are rotviz.analysis.paths'), `interpolate` (match,
then the curve) and the figure, `barrier_curves`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rotviz.limits import BATCH_SIZE, EXAMPLES, POINTS, REPEATS, SEED
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param, needs
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import torch

    from rotviz.analysis.paths import Curve
    from rotviz.data.split import Split
    from rotviz.dist import Group
    from rotviz.evaluation import Evaluator
    from rotviz.match.endpoints import HeldEndpoints
    from rotviz.match.options import MatchOptions
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

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
    Param("repair", "no", "yes: REPAIR each point of the path (rotviz.analysis.repair: each "
          "FFN hidden unit's and head output's mean and std reset to the interpolation of the "
          "endpoints', on the train split), beside the barrier without it (default no)",
          choices=("no", "yes"), label="REPAIR each point (reset unit statistics)"),
)


def _check(values: dict, given: set[str]) -> None:
    needs("--seed", "seed" in given, "--repeats N with N >= 2 (it seeds the subsets)",
          values["repeats"] > 1)


def _run(ends, ctx: Context, v: dict):
    return curve_on(ends, ctx.split, v["points"], ctx.device, ctx.progress, v["repeats"],
                    v["seed"], v["batch_size"], group=ctx.group,
                    examples=v["examples"], repair=v["repair"] == "yes")


def _sized_check(v: dict) -> None:
    """REPAIR measures whole interpolated models: in memory only."""
    from rotviz.errors import RotvizError

    if v.get("repair") == "yes":
        raise RotvizError("--repair measures each point's activations with the whole model "
                          "held; raise --max-memory, or drop --repair")


def _at_size(ends, ctx: Context, v: dict):
    from rotviz.atsize.landscape import sized_curve
    from rotviz.dist import SINGLE

    c = sized_curve(ends.anchor_path, ends.matched_path, ctx.split, v["points"], ctx.device,
                    v["batch_size"], repeats=v["repeats"], seed=v["seed"],
                    group=ctx.group or SINGLE, match_info=ends.info, layers=ends.layers)
    if c is not None:
        c.source = ends.source_ref
    return c


def _summary(c, how: str) -> str:
    spread = f" (mean {c.barrier_mean:.4f} +- {c.barrier_std:.4f} over {c.repeats} subsets)" \
        if c.repeats > 1 else ""
    fixed = (f" with REPAIR ({c.barrier_unrepaired:.4f} without)"
             if getattr(c, "repair", False) else "")
    return (f"barrier [{match_label(c.match, c.layers)}] on {c.device}{how}: {c.barrier:.4f}"
            f"{fixed}{spread}, loss range {c.loss_range:.4f}, accuracy at alpha 0.5 "
            f"{c.mid_acc:.4f}; "
            f"endpoint losses {c.loss[0]:.4f} / {c.loss[-1]:.4f}; distance "
            f"{c.distance_before:.3f} -> {c.distance_after:.3f}; {len(c.alphas)} points on "
            f"{c.n} {c.split} samples in {c.seconds:.2f} s")


def match_label(match: str, layers: list[int] | None) -> str:
    """A matching SPEC with the layers it was limited to."""
    return match if layers is None else f"{match}, layers {','.join(map(str, layers))}"


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
    group: Group | None = None,
    examples: int = 0,
    repair: bool = False,
) -> Curve | None:
    """curve_on(endpoints, split, points=21, device=) -> Curve

    Loss and accuracy along the straight path from the anchor (alpha = 0) to the matched
    source (alpha = 1) at `points` evenly spaced alphas. `repeats` > 1 also reports the
    spread over that many disjoint seeded subsets of the split; `evaluator` reuses data
    already on the device. Under torchrun (`group`) the points are shared among the
    processes and rank 0 returns the curve (None elsewhere). `examples` > 0: the model's
    answers on that many fixed test inputs at each alpha too (`Curve.examples`, for the
    path's animation: rotviz.analysis.examples). `repair`: each point REPAIRed on the train
    split (rotviz.analysis.repair), the curve without it kept beside (a `RepairedCurve`).
    """
    import time

    import numpy as np

    from rotviz.analysis import examples as ex
    from rotviz.analysis.paths import Curve, check_path, path_curve
    from rotviz.dist import SINGLE
    from rotviz.evaluation import Evaluator

    check_path(points, repeats, split)
    t0 = time.perf_counter()
    ev = evaluator or Evaluator(ends.anchor, split, device, batch_size)
    info = ends.info
    alphas = np.linspace(0.0, 1.0, points).tolist()
    probe = ex.probe(ev, split, examples) if examples else None
    fixed = None
    if repair:
        from rotviz.analysis.repair import repaired_fields

        fixed = repaired_fields(ev, ends.anchor, ends.anchor.state, ends.matched, alphas,
                                split.sibling("train"), repeats, seed, progress, group, probe)
    fields = path_curve(ev, ev.params(ends.anchor.state), ev.params(ends.matched), alphas,
                        repeats, seed, None if repair else progress, group or SINGLE,
                        None if repair else probe)
    if fields is None:  # another rank than 0: its points are with rank 0
        return None
    if fixed is not None:  # the curve is the repaired path's (its answers too), plain beside
        fields, fixed = fixed, fields
    shown = {}
    if probe is not None:
        shown, name = ex.describe(split, examples), ex.namer(split)
        answers = fields.pop("answers")
        shown["pred"] = [p for p, _ in answers]
        shown["prob"] = [q for _, q in answers]
        shown["pred_names"] = [[name(i) for i in p] for p, _ in answers]
    curve = Curve(
        **fields, examples=shown, match=info.match, data=split.data, split=split.split,
        device=str(ev.device),
        seconds=time.perf_counter() - t0 + info.seconds, n=split.n, layers=ends.layers,
        anchor=ends.anchor_ref, source=ends.source_ref, distance_before=info.distance_before,
        distance_after=info.distance_after, max_output_diff=info.max_output_diff,
        match_seconds=info.seconds,
    )
    if fixed is None:
        return curve
    from rotviz.analysis.repair import repaired_curve

    return repaired_curve(curve, fixed)


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
    group: Group | None = None,
) -> Curve | None:
    """interpolate(anchor, source, split, options|None, points=21, device=, progress=) -> Curve

    Match the source onto the anchor with `options` (a MatchOptions, a SPEC string, or None
    for no matching; activation and learned matching train on the split's train sibling),
    then `curve_on` the endpoints.
    """
    from rotviz.analysis.paths import check_path
    from rotviz.evaluation import Evaluator
    from rotviz.match.endpoints import match_endpoints

    check_path(points, repeats, split)
    ev = Evaluator(anchor, split, device, batch_size)
    ends = match_endpoints(anchor, source, options, ev.device, data=split)
    return curve_on(ends, split, points, device, progress, repeats, seed, batch_size, ev, group)


def barrier_curves(
    curves: Sequence[Mapping],
    metric: str = "loss",
    font_size: int = 14,
    title: str | None = None,
    acc_range: Sequence[float] | None = None,
) -> go.Figure:
    """One line per matching option along θ(α) = (1-α)·anchor + α·matched source.

    Each curve is a mapping like ``Curve.to_dict()` (rotviz.analysis.paths)`: `match` (the matching
    SPEC), `alphas`, `loss` and `acc`. For the loss the barrier is drawn as a vertical
    segment from the straight line between the end points up to the curve, and its height
    is given in the legend. The accuracy axis follows the curves (`style.acc_range`) unless
    `acc_range` is given: `style.ACC_FIXED` for the 0-1 scale, or one range shared with
    the panels it is compared with.
    """
    import plotly.graph_objects as go

    from rotviz.plots import style
    from rotviz.plots.paths import barrier_point, path_title

    fig = go.Figure()
    key = "loss" if metric == "loss" else "acc"
    for i, c in enumerate(curves):
        name = style.nice_label(str(c["match"]))
        a, v = list(map(float, c["alphas"])), list(map(float, c[key]))
        if metric == "loss":
            am, top, base = barrier_point(a, v)
            name = f"{name} (barrier {top - base:.3f})"
        fig.add_scatter(
            x=a, y=v, mode="lines+markers", name=name, legendgroup=str(i),
            line={"color": style.color(i), "dash": style.dash(i), "width": 2.5},
            marker={"symbol": style.marker(i), "size": 6},
            hovertemplate="α=%{x:.2f}: %{y:.4f}<extra>" + name + "</extra>",
        )
        if metric == "loss":
            fig.add_scatter(
                x=[am, am], y=[base, top], mode="lines", legendgroup=str(i), showlegend=False,
                line={"color": style.color(i), "width": 1.5, "dash": "dot"},
                hovertemplate=f"barrier {top - base:.3f} at α={am:.2f}<extra></extra>",
            )
    y = style.LOSS if metric == "loss" else style.ACCURACY
    what = "Loss" if metric == "loss" else "Accuracy"
    fig = style.finish(fig, title or path_title(what, [str(c["match"]) for c in curves]),
                       style.ALPHA, y, "matching option", font_size)
    fig.update_layout(legend={"orientation": "h", "y": -0.22, "x": 0})
    if metric == "acc":
        fig.update_yaxes(range=list(acc_range) if acc_range is not None else
                         style.acc_range(v for c in curves for v in c["acc"]))
    return fig


def _plot(d: dict, look: Style):
    return barrier_curves([d], font_size=look.font_size)


def _animate(d: dict):
    from rotviz.plots.animate import path_animation

    return path_animation(d)


def _rows(d: dict) -> list[dict]:
    return [{"alpha": a, "loss": lo, "acc": ac}
            for a, lo, ac in zip(d["alphas"], d["loss"], d["acc"], strict=True)]


def _figures(d: dict, style: Style) -> dict:
    """The Barrier page's two figures over every matching it picked (a line each): the loss,
    each barrier marked, and the accuracy."""
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
    at_size_check=_sized_check, animate=_animate, animate_params={"examples": 4},
    narrower=True,
    at_size_help="matched at size and evaluated with both checkpoints held as "
                 "stored, each point built block by block", section=SECTION, order=10))

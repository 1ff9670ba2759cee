"""Weight matching round by round: the distance to the anchor and the barrier after each
round of the residual alternation (rotviz.analysis.rounds), drawn and animated."""

from __future__ import annotations

from rotviz.limits import BATCH_SIZE, POINTS
from rotviz.measures.registry import Context, Measurement, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

PARAMS = (
    Param("points", 5, f"alphas on each round's path (default 5: a few, for each of up to "
          f"dozens of rounds; {POINTS.text})", POINTS, label="Points on each round's path",
          widget=(3, 21, 1)),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.rounds import rounds_on

    return rounds_on(ends, ctx.split, v["points"], ctx.device, v["batch_size"], ctx.progress)


def _match_check(options) -> str | None:
    from rotviz.analysis.rounds import why_not_options

    return why_not_options(options)


def _summary(r, how: str) -> str:
    first, last = r.rounds[0], r.rounds[-1]
    return (f"rounds [{r.match}] on {r.device}{how}: {len(r.rounds) - 1} rounds "
            f"({' + '.join(map(str, r.phases))} by phase); distance {first['distance']:.3f} -> "
            f"{last['distance']:.3f}, barrier {first['barrier']:.4f} -> {last['barrier']:.4f} "
            f"({len(r.alphas)} points on {r.n} {r.split} samples); last round vs matched "
            f"source {r.last_round_diff:.1e}; {r.seconds:.2f} s")


def _rows(d: dict) -> list[dict]:
    return [{"phase": x["phase"], "round": x["round"], "distance": x["distance"],
             "barrier": x["barrier"], "mid_acc": x["mid_acc"]} for x in d["rounds"]]


def _plot(d: dict, style: Style):
    from rotviz.plots.animate import rounds_figure

    return rounds_figure(d)


def _animate(d: dict):
    from rotviz.plots.animate import rounds_animation

    return rounds_animation(d)


RECORD = register(Measurement(
    "rounds", "Weight matching round by round",
    "distance and barrier after each round of weight matching's alternation (--match weight)",
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows, animate=_animate,
    match_default="weight", match_check=_match_check,
    refusal="it replays the alternation with the pair in memory; run it on models that fit",
    order=180))

"""Barriers over training (Frankle et al., ICML 2020): two series of checkpoints paired by
step, each step's pair matched and its barrier measured as `rotviz barrier` does, one line
per matching (rotviz.analysis.training, docs/landscape.md)."""

from __future__ import annotations

from rotviz.limits import BATCH_SIZE, POINTS
from rotviz.measures.registry import Context, Inputs, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

SERIES_HELP = ("series: a folder of checkpoint-<step>/ model folders (Hugging Face "
               "Trainer's layout), zoo:NAME, or ORG/NAME from the local Hugging Face cache "
               "(its step<N> revisions, or those named: ORG/NAME@step1000,step2000; never "
               "downloaded)")

PARAMS = (
    Param("points", 11, f"number of alphas in [0, 1] on each step's path (default 11, "
          f"{POINTS.text})", POINTS, label="Points on each path", widget=(3, 41, 2),
          essential=True),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)

AT_SIZE = ("it loads both models of every step in memory, one step at a time; run it on "
           "checkpoints that fit")


def read_inputs(refs, specs, confined):
    from rotviz.analysis.training import TwoSeries

    return TwoSeries.read(refs, specs, confined)


def _run(inputs, ctx: Context, v: dict):
    from rotviz.analysis.training import barriers_over_training

    return barriers_over_training(inputs, ctx.split, v["points"], ctx.device, v["batch_size"],
                                  ctx.progress, ctx.cancel)


def steps_note(r) -> str:
    """The steps only one series holds, in a few words ('' when none)."""
    e = r.extra if hasattr(r, "extra") else r["extra"]
    parts = [f"{len(e[k])} step(s) only in {e[s]} ({', '.join(map(str, e[k][:5]))}"
             f"{', ...' if len(e[k]) > 5 else ''})" for k, s in (("only_a", "series_a"),
                                                                  ("only_b", "series_b"))
             if e[k]]
    return "; left out: " + "; ".join(parts) if parts else ""


def _summary(r, how: str) -> str:
    last = {m: r.barrier[m][-1] for m in r.matches}
    peak = {m: max(r.barrier[m]) for m in r.matches}
    said = ", ".join(f"{m} {last[m]:.4f} (peak {peak[m]:.4f})" for m in r.matches)
    return (f"barriers over training on {r.device}{how}: {len(r.x)} common steps "
            f"{r.x[0]}..{r.x[-1]}; barrier at the last step: {said}{steps_note(r)}; "
            f"{r.points} points on {r.n} {r.split} samples in {r.seconds:.2f} s")


def rows(d: dict) -> list[dict]:
    """One row per step (or spawn step) and matching."""
    key = "step" if d["extra"].get("kind") == "training" else "spawn_step"
    return [{key: x, "match": m, "barrier": d["barrier"][m][i], "mid_acc": d["mid_acc"][m][i],
             "loss_a": d["loss_a"][i], "loss_b": d["loss_b"][i],
             "distance_before": d["distance_before"][i],
             "distance_after": d["distance_after"][m][i]}
            for i, x in enumerate(d["x"]) for m in d["matches"]]


def _plot(d: dict, style: Style):
    from rotviz.plots.training import barriers_over_training

    return barriers_over_training(d)


def _caption(d: dict) -> str:
    """The line under the chart on the Training page: the steps paired, and those left out."""
    e = d["extra"]
    left = [f"{len(e[k])} step(s) only in {e[s]}" for k, s in (("only_a", "series_a"),
                                                                ("only_b", "series_b"))
            if e[k]]
    return (f"{len(d['x'])} common steps on {d['n']} test samples"
            + (f"; left out: {'; '.join(left)}." if left else "."))


SECTION = Section(
    "training", 10, "1. The barrier between two runs over training",
    "Each series is a folder of `checkpoint-<step>/` model folders (Hugging Face Trainer's "
    "layout), `zoo:NAME`, or `ORG/NAME` from the local Hugging Face cache (its `step<N>` "
    "revisions, or those named: `ORG/NAME@step1000,step2000`; when the cache lies under the "
    "model roots). Steps are paired by number. The zoo's two runs share their start, so "
    "their barrier is 0 at step 0.",
    defaults={"points": 5}, caption=_caption,
    doing=lambda v: f"every matching at each step, {v['points']} points per path")

TRAINING = register(Measurement(
    "training", "Barriers over training",
    "the barrier between two runs at each common checkpoint step, per matching",
    _run, PARAMS, summary=_summary, plot=_plot, rows=rows, refusal=AT_SIZE,
    inputs=Inputs((("series_a", "the first " + SERIES_HELP), ("series_b", "second series, the "
                   "same architecture, paired with the first by step")), read_inputs),
    progress=True, section=SECTION, order=140))

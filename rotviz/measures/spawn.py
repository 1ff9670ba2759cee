"""Instability against the spawn step (Frankle et al., ICML 2020): for each step k of a
parent run, the barrier between two children trained from the parent's checkpoint at k to
the end in different data orders, per matching (rotviz.analysis.training,
docs/landscape.md)."""

from __future__ import annotations

from rotviz.measures.registry import Context, Inputs, Measurement, Section, register
from rotviz.measures.training import AT_SIZE, PARAMS, rows
from rotviz.plots.figure_style import Style


def read_inputs(refs, specs, confined):
    from rotviz.analysis.training import SpawnFolder

    return SpawnFolder.read(refs, specs, confined)


def _run(inputs, ctx: Context, v: dict):
    from rotviz.analysis.training import spawn_instability

    return spawn_instability(inputs, ctx.split, v["points"], ctx.device, v["batch_size"],
                             ctx.progress, ctx.cancel)


def _summary(r, how: str) -> str:
    said = "; ".join(f"{m}: " + ", ".join(f"k={k} {b:.4f}" for k, b in zip(r.x, r.barrier[m],
                                                                         strict=True))
                     for m in r.matches)
    return (f"spawn instability on {r.device}{how}: barrier between the two children by "
            f"spawn step, {said}; {r.points} points on {r.n} {r.split} samples in "
            f"{r.seconds:.2f} s")


def _plot(d: dict, style: Style):
    from rotviz.plots.training import instability_by_spawn_step

    return instability_by_spawn_step(d)


SECTION = Section(
    "training", 20, "2. Instability against the spawn step",
    "A spawn folder holds `spawn-<k>/a/` and `spawn-<k>/b/`: the two children copied from "
    "the parent at step *k* and trained to the end in different data orders. Children "
    "spawned at the last step are the parent itself, twice: their barrier is 0.",
    defaults={"points": 5},
    caption=lambda d: f"Spawn steps {', '.join(map(str, d['x']))}, on {d['n']} test samples.",
    doing=lambda v: f"every matching at each spawn step, {v['points']} points per path")

SPAWN = register(Measurement(
    "spawn", "Instability against the spawn step",
    "the barrier between two children spawned at step k and trained apart, against k",
    _run, PARAMS, summary=_summary, plot=_plot, rows=rows, refusal=AT_SIZE,
    inputs=Inputs((("spawn_dir", "a spawn folder: spawn-<k>/a/ and spawn-<k>/b/ model "
                    "folders (the two children spawned at step k), or zoo:NAME"),),
                  read_inputs),
    progress=True, section=SECTION, order=150))

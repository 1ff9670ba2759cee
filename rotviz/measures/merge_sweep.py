"""One merge number swept: the merged model's loss and accuracy as the source's weight, or a
method's own real parameter (task arithmetic's lambda, TIES's and DARE's density, RegMean's
alpha), runs from `--start` to `--stop`, every other parameter held. The matching is done
once; statistics, when the method needs them, are taken once; each value is one merge and one
evaluation (rotviz.analysis.fusion.sweep_on)."""

from __future__ import annotations

from rotviz.limits import SWEEP_POINTS, SWEEP_START, SWEEP_STOP
from rotviz.measures.barrier import match_label
from rotviz.measures.merge import _check as _merge_check
from rotviz.measures.merge import _given, _load_base
from rotviz.measures.merge import _params as _merge_params
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style


def _swept_names() -> tuple[str, ...]:
    from rotviz.merging import methods
    from rotviz.merging.registry import sweepable

    return tuple(dict.fromkeys(n for m in methods() for n in sweepable(m)))


def _params() -> tuple[Param, ...]:
    """The merge's own options, then what to sweep and over which range."""
    names = _swept_names()
    return (*_merge_params(),
            Param("param", "weight", f"the number swept: {', '.join(names)} (default weight; "
                  "each method sweeps the weight and its own real parameters)", choices=names,
                  label="Swept parameter", essential=True),
            Param("start", 0.0, f"first value (default 0, {SWEEP_START.text})", SWEEP_START,
                  label="From", essential=True),
            Param("stop", 1.0, f"last value (default 1, {SWEEP_STOP.text})", SWEEP_STOP,
                  label="To", essential=True),
            Param("points", 11, f"values from start to stop, evenly spaced (default 11, "
                  f"{SWEEP_POINTS.text})", SWEEP_POINTS, label="Values", widget=(2, 21, 1),
                  essential=True))


def _check(values: dict, given: set[str]) -> None:
    """The merge's own checks, and a parameter the chosen method can sweep (one line)."""
    from rotviz.errors import RotvizError
    from rotviz.merging import method
    from rotviz.merging.registry import sweepable

    _merge_check(values, given - {"param", "start", "stop", "points"})
    m = method(values["method"])
    if values["param"] not in sweepable(m):
        raise RotvizError(f"--param {values['param']} is not a number --method {m.name} can "
                          f"sweep; use one of {', '.join(sweepable(m))}")
    _check_range(values, m)


def _check_range(values: dict, m) -> None:
    """--start and --stop inside the swept parameter's own bound, before any model loads:
    each swept value is one merge, and a value out of range would be refused only at that
    merge, after the matching. The bound is the method's own (`m`, as
    rotviz.analysis.fusion.sweep_on checks it), the weight's the merge's. One line, with
    the hint argparse's refusals carry."""
    from rotviz.errors import RotvizError

    own = m.params if values["param"] != "weight" else _merge_params()
    swept = next((p for p in own if p.name == values["param"]), None)
    if swept is None or swept.bound is None:
        return
    for flag in ("start", "stop"):
        v = values[flag]
        try:
            swept.bound.check(v)
        except RotvizError:
            raise RotvizError(f"--{flag} {v:g} is outside {swept.flag}'s range: sweeping "
                              f"{values['param']}, --start and --stop must each be "
                              f"{swept.bound.text} (see rotviz merge_sweep --help)") from None


def _run(ends, ctx: Context, v: dict):
    import numpy as np

    from rotviz.analysis.fusion import sweep_on

    values = np.linspace(v["start"], v["stop"], v["points"]).tolist()
    return sweep_on(ends, v["method"], v["param"], values, ctx.split, v["weight"], ctx.device,
                    ctx.progress, base=_load_base(ctx, v), **_given(v))  # the swept one: held out



def _summary(r, how: str) -> str:
    b = r.best
    return (f"merge sweep [{r.method}, match {match_label(r.match, None)}] of {r.param} on "
            f"{r.device}{how}: accuracy {min(r.acc):.4f} to {max(r.acc):.4f}, best at "
            f"{r.param} {r.values[b]:g} ({r.acc[b]:.4f}, loss {r.loss[b]:.4f}); anchor "
            f"{r.anchor_acc:.4f}, source {r.source_acc:.4f}; {len(r.values)} merges in "
            f"{r.seconds:.2f} s")


def _rows(d: dict) -> list[dict]:
    return [{d["param"]: x, "loss": lo, "acc": a}
            for x, lo, a in zip(d["values"], d["loss"], d["acc"], strict=True)]


def _plot(d: dict, style: Style):
    from rotviz.plots.merge import sweep_chart

    return sweep_chart([d])


def _figures(d: dict, style: Style) -> dict:
    """The sweeps of every matching the Merge page picked, one line each."""
    from rotviz.plots.merge import sweep_chart

    return {"sweep": sweep_chart(d["runs"], "acc", style.font_size, style.accuracy_axis())}


SECTION = Section(
    "merge", 20, "Sweep one number",
    "How the merged model's accuracy changes as one number of the merge is turned: the "
    "weight of the source, task arithmetic's λ (scale), the density TIES and DARE keep, or "
    "RegMean's α. Every other parameter keeps its value; one line per matching option "
    "picked above.",
    defaults={"points": 6}, hidden=("base", "seed"), per_matching=True, figures=_figures,
    doing=lambda v: f"{v['points']} merges")

MERGE_SWEEP = register(Measurement(
    "merge_sweep", "Merge sweep (one parameter turned)",
    "merged accuracy as the source's weight or one merge parameter (lambda, density, alpha) "
    "runs over a range, every other one held",
    _run, _params, summary=_summary, plot=_plot, rows=_rows, check=_check, models=("base",),
    refusal="a merge sweep evaluates whole merged models in memory; use rotviz merge at size",
    section=SECTION, order=40))

"""One merge number swept: the merged model's loss and accuracy as the source's weight, or a
method's own real parameter (task arithmetic's lambda, TIES's and DARE's density, RegMean's
alpha), runs from `--start` to `--stop`, every other parameter held. The matching is done
once; statistics, when the method needs them, are taken once; each value is one merge and one
evaluation (`sweep_on`). Here: the record, the sweep and its figure, `sweep_chart`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from rotviz.limits import SWEEP_POINTS, SWEEP_START, SWEEP_STOP
from rotviz.measures.barrier import match_label
from rotviz.measures.merge import _check as _merge_check
from rotviz.measures.merge import _given, _load_base
from rotviz.measures.merge import _params as _merge_params
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import torch

    from rotviz.data.split import Split
    from rotviz.match.endpoints import HeldEndpoints
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress


def _swept_names() -> tuple[str, ...]:
    from rotviz.merging import methods
    from rotviz.merging.registry import sweepable

    return tuple(dict.fromkeys(n for m in methods() for n in sweepable(m)))


def _params() -> tuple[Param, ...]:
    """The merge's own options, then what to sweep and over which range."""
    names = _swept_names()
    return (*_merge_params(),
            Param("param", "weight", f"the number swept: {', '.join(names)} (default weight; "
                  "each method sweeps its own real parameters, and the weight where it "
                  "changes the merge)", choices=names,
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
    from rotviz.merging import method

    _merge_check(values, given - {"param", "start", "stop", "points"})
    m = method(values["method"])
    check_param(m, values["param"])
    _check_range(values, m)


def check_param(m, param: str) -> None:
    """A number method `m` can sweep (`sweepable`), else one line saying which it has: the
    weight of a method that ignores it would only draw a flat line."""
    from rotviz.errors import RotvizError
    from rotviz.merging.registry import sweepable

    choices = sweepable(m)
    if param in choices:
        return
    if not choices:
        raise RotvizError(f"--method {m.name} has no number a sweep can turn (it takes no "
                          "weight and no parameter of its own); sweep another method, or run "
                          "rotviz merge")
    if param == "weight":
        raise RotvizError(f"--method {m.name} takes no weight (--weight does not change it, "
                          f"a sweep of it is flat); use --param {' or '.join(choices)}")
    raise RotvizError(f"--param {param} is not a number --method {m.name} can sweep; use one "
                      f"of {', '.join(choices)}")


def _check_range(values: dict, m) -> None:
    """--start and --stop inside the swept parameter's own bound, before any model loads:
    each swept value is one merge, and a value out of range would be refused only at that
    merge, after the matching. The bound is the method's own (`m`, as
    `sweep_on` checks it), the weight's the merge's. One line, with
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


@dataclass
class MergeSweep:
    """Merged loss and accuracy as one number of a merge is turned (the weight of the source,
    or a method's own parameter: lambda, density, RegMean's alpha), every other one held."""

    method: str
    param: str  # "weight" or the method's parameter name
    values: list[float]
    loss: list[float]
    acc: list[float]
    match: str
    weight: float  # the source's weight where it is not the swept number
    anchor_loss: float
    anchor_acc: float
    source_loss: float
    source_acc: float
    data: str
    split: str
    n: int
    device: str
    seconds: float
    anchor: str = ""
    source: str = ""
    base: str = ""
    params: dict[str, Any] = field(default_factory=dict)  # the held values of the others

    @property
    def best(self) -> int:
        """Index of the value with the highest merged accuracy (the first of equals)."""
        return max(range(len(self.acc)), key=lambda i: (self.acc[i], -i))

    def to_dict(self) -> dict:
        return asdict(self)


def sweep_on(
    ends: HeldEndpoints,
    method_name: str,
    param: str,
    values: Sequence[float],
    split: Split,
    weight: float = 0.5,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    stats_data: Split | None = None,
    base: Loaded | None = None,
    **params: Any,
) -> MergeSweep:
    """sweep_on(endpoints, "ties", "density", [0.1, 0.3, 1.0], split, base=base) -> MergeSweep

    Merge the matched source into the anchor at each value of `param` (the source's
    `weight`, or one of the method's own real parameters: `sweepable`) and evaluate each
    merged model on `split`. Statistics, when the method needs them, are taken once. The
    values are checked against the parameter's bound before anything is computed."""
    import time

    from rotviz.analysis.merges import check_base_model, method_params, pair_statistics
    from rotviz.errors import RotvizError
    from rotviz.evaluation import Evaluator
    from rotviz.merging import check_weight
    from rotviz.merging import method as method_record
    from rotviz.merging.combine import merge_states

    m = method_record(method_name)
    check_param(m, param)
    if not values:
        raise RotvizError("a sweep needs at least one value")
    bound = next((p.bound for p in m.params if p.name == param), None)
    checked = [check_weight(v) if param == "weight" else bound.check(v) for v in values]
    weight = check_weight(weight)
    held = method_params(m, {k: v for k, v in params.items() if k != param})
    check_base_model(m, ends.anchor, base)
    t0 = time.perf_counter()
    anchor = ends.anchor
    ev = Evaluator(anchor, split, device)
    _, sa, sb = pair_statistics(m, ends, split, ev.device, held, stats_data, progress)
    base_state = None if base is None else base.state

    def merged_at(v: float) -> dict[str, torch.Tensor]:
        w, own = (v, held) if param == "weight" else (weight, {**held, param: v})
        return ev.params(merge_states(anchor, m.name, anchor.state, ends.matched, w, sa, sb,
                                      base_state, **own))

    def done(k: int) -> None:
        if progress:
            progress(k, len(checked), f"{param} = {checked[k - 1]:g}")

    found = ev.evaluate_each(merged_at, checked, done)
    a_loss, a_acc = ev.evaluate(ev.params(anchor.state))
    s_loss, s_acc = ev.evaluate(ev.params(ends.matched))
    return MergeSweep(
        method=m.name, param=param, values=[float(v) for v in checked],
        loss=[f[0] for f in found], acc=[f[1] for f in found], match=ends.info.match,
        weight=weight, anchor_loss=a_loss, anchor_acc=a_acc, source_loss=s_loss,
        source_acc=s_acc, data=split.data, split=split.split, n=split.n, device=str(ev.device),
        seconds=time.perf_counter() - t0 + ends.info.seconds, anchor=anchor.ref,
        source=ends.source_ref, base="" if base is None else base.ref,
        params={k: v for k, v in held.items() if k in m.extra and k != param},
    )


SWEPT = {"weight": "weight of the source (0 = anchor, 1 = source)",
         "scale": "λ, the scale of the merged task vector",
         "density": "density (share of each task vector kept, 0-1)",
         "alpha": "RegMean's off-diagonal scale α (0-1)"}


def axis_label(method_name: str, param: str) -> str:
    """The swept number in words for the x axis: the common ones' plain words, else the
    method's own label of its parameter (its widget's), then its name."""
    from rotviz.merging import method

    if param in SWEPT:
        return SWEPT[param]
    own = next((p for p in method(method_name).params if p.name == param), None)
    return own.title if own is not None else param


def sweep_chart(sweeps: Sequence[Mapping], metric: str = "acc", font_size: int = 14,
                acc_range: Sequence[float] | None = None) -> go.Figure:
    """Merged accuracy (or loss) against the swept number, one line per matching setting
    (each a `MergeSweep.to_dict()` of one method and parameter), the anchor's and the
    source's own values as dashed lines. The accuracy axis follows the lines
    (`style.acc_range`) unless `acc_range` is given (`style.ACC_FIXED`: 0-1)."""
    import plotly.graph_objects as go

    from rotviz.plots import style

    first = sweeps[0]
    param = str(first["param"])
    fig = go.Figure()
    for i, d in enumerate(sweeps):
        fig.add_scatter(x=d["values"], y=d[metric], mode="lines+markers",
                        name=style.nice_label(d["match"]),
                        line={"color": style.color(i), "dash": style.dash(i)},
                        marker={"symbol": style.marker(i)},
                        hovertemplate=f"{param} %{{x:.3g}}: %{{y:.4f}}<extra>"
                                      f"{style.nice_label(d['match'])}</extra>")
    xs = [min(min(d["values"]) for d in sweeps), max(max(d["values"]) for d in sweeps)]
    for j, who in enumerate(("anchor", "source")):
        value = float(first[f"{who}_{metric}"])
        fig.add_scatter(x=xs, y=[value, value], mode="lines", name=f"{who} ({value:.3f})",
                        line={"color": "#000000" if j == 0 else style.GREY,
                              "dash": ("dash", "dot")[j]},
                        hovertemplate=f"{who}: {value:.4f}<extra></extra>")
    named = {"acc": ("accuracy", style.ACCURACY), "loss": ("loss", style.LOSS)}
    word, y = named.get(metric, (metric, metric))
    title = (f"Merged model {word} against {param} ({first['method']}"
             f"{', base ' + first['base'] if first.get('base') else ''})")
    fig = style.finish(fig, title, axis_label(str(first["method"]), param), y,
                       "matching before merging",
                       font_size)
    if metric == "acc":
        fig.update_yaxes(range=list(acc_range) if acc_range is not None else style.acc_range(
            [v for d in sweeps for v in d["acc"]] + [first["anchor_acc"], first["source_acc"]]))
    return fig


def _plot(d: dict, look: Style):
    return sweep_chart([d], font_size=look.font_size, acc_range=look.accuracy_axis())


def _figures(d: dict, style: Style) -> dict:
    """The sweeps of every matching the Merge page picked, one line each."""
    return {"sweep": sweep_chart(d["runs"], "acc", style.font_size, style.accuracy_axis())}


SECTION = Section(
    "merge", 20, "Sweep one number",
    "How the merged model's accuracy changes as one number of the merge is turned: the "
    "weight of the source, or a number of the chosen method's own (its scale, density, α). "
    "Every other parameter keeps its value; one line per matching option picked above.",
    defaults={"points": 6}, hidden=("base", "seed"), per_matching=True, figures=_figures,
    doing=lambda v: f"{v['points']} merges")

MERGE_SWEEP = register(Measurement(
    "merge_sweep", "Merge sweep (one parameter turned)",
    "merged accuracy as the source's weight or one merge parameter (lambda, density, alpha) "
    "runs over a range, every other one held",
    _run, _params, summary=_summary, plot=_plot, rows=_rows, check=_check, models=("base",),
    refusal="a merge sweep evaluates whole merged models in memory; use rotviz merge at size",
    section=SECTION, order=40))

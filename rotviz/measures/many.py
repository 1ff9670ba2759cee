"""Many models at once: N >= 3 models of one architecture aligned into one basis (onto the
first, or onto their iteratively refined barycentre) and merged, the merged accuracy against
the number of models (docs/symmetries.md). Here: the record, the merged curve (`many`; the
alignment is rotviz.match.many's) and the figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from rotviz.limits import ROUNDS, TOL
from rotviz.measures.registry import Context, Inputs, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style
from rotviz.sources import hf_cache

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import torch

    from rotviz.data.split import Split
    from rotviz.match.many import Alignment, Merge
    from rotviz.match.options import MatchOptions
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

    Tensor = torch.Tensor

# the fewest models `many` takes (rotviz.match.many.MIN_MODELS, which imports torch: this
# copy keeps listing the record cheap; a test holds them equal)
LEAST = 3
BARYCENTRE = ("to", ("barycentre",))  # rounds and tolerance of the barycentre's refinement

PARAMS = (
    Param("to", "barycentre", "anchor (every model matched onto the first) or barycentre "
          "(onto the mean, refined round by round; default barycentre)",
          choices=("anchor", "barycentre"), label="Align to", essential=True),
    Param("rounds", 10, f"barycentre: at most this many rounds (default 10, {ROUNDS.text})",
          ROUNDS, label="Barycentre rounds", widget=(1, 30, 1), needs=BARYCENTRE),
    Param("tol", 1e-4, "barycentre: stop when the mean moves less than this fraction of its "
          f"norm in a round (default 1e-4, {TOL.text})", TOL, label="Barycentre tolerance",
          needs=BARYCENTRE),
)


class ManyModels:
    """What `rotviz many` takes: N >= 3 models of one architecture, loaded and checked, and
    one matching SPEC."""

    def __init__(self, refs, specs, confined) -> None:
        from rotviz.errors import RotvizError
        from rotviz.match.many import MIN_MODELS
        from rotviz.match.selection import label_of, match_options
        from rotviz.sources.loading import resolve_ref

        specs = list(specs or ("seed",))
        if len(specs) != 1:
            raise RotvizError(f"many aligns with one matching, got {len(specs)} --match "
                              "options; give one --match SPEC")
        options = match_options(specs[0])
        if options is None:  # before any model is loaded (rotviz.match.many says it late)
            raise RotvizError("aligning many models needs a matching: give a SPEC such as "
                              "seed or weight, not none")
        self.spec = label_of(options)
        if len(refs) < MIN_MODELS:  # before any model is loaded
            raise RotvizError(f"aligning many models takes at least {MIN_MODELS} models, got "
                              f"{len(refs)}; give {MIN_MODELS} or more (for two, use rotviz "
                              "match)")
        self.paths = [resolve_ref(r, confined) for r in refs]
        self._refs, self._confined = tuple(refs), confined

    @cached_property
    def models(self):
        """The models, loaded and checked for one architecture at first use: after the
        command has checked its outputs, so that a bad --json is refused before three
        models are read."""
        from rotviz.match.many import check_models
        from rotviz.sources.loading import load_model

        models = [load_model(r, confined=self._confined) for r in self._refs]
        check_models(models)
        return models

    def first_pair(self):
        return self.paths[0], self.paths[1]


def _params() -> tuple[Param, ...]:
    """Where to align, then the merge of the curve: a registered method without statistics
    (every model weighs 1/k) that combines any number of models (a method with
    `max_models` below LEAST, slerp's two, could never merge the curve's last point, so
    it is not offered and --method refuses it at parse time), with its own parameters and,
    for the task-vector methods, the base (rotviz.measures.merge's options, less the pair's
    weight)."""
    from rotviz.measures.merge import _params as merge_params
    from rotviz.merging import methods

    able = [m for m in methods() if not m.needs_statistics
            and (m.max_models is None or m.max_models >= LEAST)]
    names = tuple(m.name for m in able)
    own = {q.name for m in able for q in m.params} | {"base"}
    out = [Param("method", "simple", f"the curve's merge: {', '.join(names)} (default simple; "
                 "every model weighs 1/k)", choices=names, label="Merge method")]
    out += [p for p in merge_params() if p.name in own]
    return (*PARAMS, *out)


def _check(values: dict, given: set[str]) -> None:
    """The merge options as `rotviz merge` checks them: a method's own parameters only, a
    base where the method needs one (the methods that need statistics are not offered, and
    `registered_merge` refuses them)."""
    from rotviz.measures.merge import _check as merge_check

    merge_check(values, given - {p.name for p in PARAMS})


@dataclass
class ManyMerged:
    """An alignment and the merged models of the first k for k = 2..N, aligned and not."""

    alignment: Alignment
    k: list[int]
    acc: dict[str, list[float]]  # "aligned" / "unaligned" -> accuracy per k
    loss: dict[str, list[float]]
    model_acc: list[float]  # each model alone
    model_loss: list[float]
    data: str
    split: str
    n: int
    device: str
    seconds: float
    method: str = "simple"  # the registered merge method of the curve
    base: str = ""  # its base model, for the task-vector methods

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "alignment"}
        return {**self.alignment.to_dict(), **out}


def merged_curve(
    models: Sequence[Loaded],
    alignment: Alignment,
    split: Split,
    device: str | torch.device = "cpu",
    merge: Merge | None = None,
    progress: Progress | None = None,
) -> ManyMerged:
    """The merged model of the first k models (k = 2..N), as given and as aligned, evaluated
    on `split` on the anchor's module: test loss and accuracy against k (`merge`: the plain
    mean by default)."""
    import time

    from rotviz.evaluation import Evaluator
    from rotviz.match.many import mean_states

    merge = merge or mean_states
    t0 = time.perf_counter()
    anchor = models[0]
    ev = Evaluator(anchor, split, device)
    ks = list(range(2, len(models) + 1))
    sets = {"unaligned": [dict(m.state) for m in models], "aligned": alignment.states}
    acc: dict[str, list[float]] = {k: [] for k in sets}
    loss: dict[str, list[float]] = {k: [] for k in sets}
    total, step = 2 * len(ks), 0
    for name, states in sets.items():
        for k in ks:
            merged = merge(anchor, states[:k], [1.0 / k] * k)
            lo, ac = ev.evaluate(ev.params(merged))
            loss[name].append(lo)
            acc[name].append(ac)
            step += 1
            if progress is not None:
                progress(step, total, f"merged {name}, first {k}")
    alone = [ev.evaluate(ev.params(m.state)) for m in models]
    return ManyMerged(alignment, ks, acc, loss, [a for _, a in alone], [lo for lo, _ in alone],
                      split.data, split.split, split.n, str(ev.device),
                      time.perf_counter() - t0 + alignment.seconds)


def many(
    models: Sequence[Loaded],
    split: Split,
    options: MatchOptions | str | None = "seed",
    to: str = "barycentre",
    rounds: int | None = None,
    tol: float | None = None,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    merge: Merge | None = None,
    final: Merge | None = None,
) -> ManyMerged:
    """many(models, split, "seed", to="barycentre") -> ManyMerged

    `align_many`, then `merged_curve`: what `rotviz many` measures. The barycentre is the
    mean that `merge` makes; `final` (default `merge`) merges the first k models for the
    curve: a registered merge method (`registered_merge`). `rounds` and `tol` default to
    rotviz.match.many's."""
    from rotviz.match.many import DEFAULT_ROUNDS, DEFAULT_TOL, align_many, mean_states

    merge = merge or mean_states
    rounds = DEFAULT_ROUNDS if rounds is None else rounds
    tol = DEFAULT_TOL if tol is None else tol
    a = align_many(models, options, to, rounds, tol, device, progress, split, merge)
    return merged_curve(models, a, split, device, final or merge, progress)


def registered_merge(method: str, base: Mapping[str, Tensor] | None = None,
                     **params: object) -> Merge:
    """A `Merge` by a registered merge method (rotviz.merging: TIES, task arithmetic, ... about
    `base` where the method needs one), for `many`'s curve; one that needs statistics of
    each model is refused in one line."""
    from rotviz.errors import RotvizError
    from rotviz.merging import method as method_record
    from rotviz.merging import methods
    from rotviz.merging.combine import merge_many

    m = method_record(method)
    if m.needs_statistics:
        able = ", ".join(x.name for x in methods() if not x.needs_statistics)
        raise RotvizError(f"--method {m.name} needs statistics of each model; many merges with "
                          f"a method that needs none ({able})")

    def merge(anchor: Loaded, states: Sequence[Mapping[str, Tensor]],
              weights: Sequence[float]) -> dict[str, Tensor]:
        return merge_many(anchor, m.name, states, weights, base, **params)

    return merge


def _run(inputs: ManyModels, ctx: Context, v: dict):
    from rotviz.measures.merge import _given, _load_base

    final = None  # the simple average: the plain mean the barycentre is made of
    if v["method"] != "simple":
        base = _load_base(ctx, v)
        final = registered_merge(v["method"], None if base is None else base.state,
                                 **_given(v))
    r = many(inputs.models, ctx.split, ctx.matching(inputs.spec), v["to"], v["rounds"], v["tol"],
             ctx.device, ctx.progress, final=final)
    r.method, r.base = v["method"], v["base"]
    return r


def _summary(r, how: str) -> str:
    a = r.alignment
    ended = (f"{a.rounds} round(s), {a.ended}" if a.to == "barycentre" else "one pass")
    return (f"many [{a.match}, to {a.to}] of {len(a.refs)} models on {r.device}{how}: mean "
            f"pairwise distance {a.spread[0]:.4f} -> {a.spread[-1]:.4f} ({ended}); merged "
            f"accuracy of all {r.k[-1]} ({r.method}): aligned {r.acc['aligned'][-1]:.4f}, not "
            f"aligned {r.acc['unaligned'][-1]:.4f}; max output difference {a.max_output_diff:.2e}; "
            f"{r.seconds:.2f} s")


def _rows(d: dict) -> list[dict]:
    """One row per number of models merged, aligned and not."""
    return [{"models": k, "aligned_acc": d["acc"]["aligned"][i],
             "aligned_loss": d["loss"]["aligned"][i],
             "unaligned_acc": d["acc"]["unaligned"][i],
             "unaligned_loss": d["loss"]["unaligned"][i]} for i, k in enumerate(d["k"])]


def short_names(refs: Sequence[str]) -> list[str]:
    """Model references without their `zoo:` prefix or folder path, for axis ticks."""
    return [str(r).removeprefix("zoo:").rstrip("/").rsplit("/", 1)[-1] for r in refs]


def distance_matrices(d: Mapping, font_size: int = 14,
                      colour_range: Sequence[float] | None = None) -> go.Figure:
    """Two heat maps side by side, the pairwise distances before and after alignment, on one
    shared colour scale (0 to the largest distance of either, or `colour_range`: one shared
    with other figures), so colours compare across."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from rotviz.plots import style

    names = short_names(d["refs"])
    top = max(max(row) for m in (d["before"], d["after"]) for row in m) or 1.0
    how = "the anchor" if d["to"] == "anchor" else "the barycentre"
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("as given", f"aligned to {how}"))
    for col, key in enumerate(("before", "after"), start=1):
        z = d[key]
        fig.add_trace(go.Heatmap(
            z=z, x=names, y=names, coloraxis="coloraxis", name=key,
            text=[[f"{v:.2f}" for v in row] for row in z], texttemplate="%{text}",
            hovertemplate="%{y} to %{x}: %{z:.3f}<extra>" + key + "</extra>"), 1, col)
        fig.update_xaxes(title_text="model", row=1, col=col)
        fig.update_yaxes(title_text="model", autorange="reversed", row=1, col=col)
    low, top = (0.0, top) if colour_range is None else map(float, colour_range)
    fig.update_layout(coloraxis={"colorscale": style.SEQUENTIAL, "cmin": low, "cmax": top,
                                 "colorbar": {"title": {"text": "distance (L2)"}}})
    style.finish(fig, f"Pairwise parameter distance before and after alignment "
                 f"[{style.nice_label(d['match'])}]", "model", "model", font_size=font_size,
                 legend=False)
    fig.update_xaxes(title_text="model")
    return fig


def merged_by_count(d: Mapping, font_size: int = 14,
                    acc_range: Sequence[float] | None = None) -> go.Figure:
    """The merged model's test accuracy against the number of models merged (the first k),
    aligned and as given, beside the best single model. The accuracy axis follows the data
    unless `acc_range` is given (`style.ACC_FIXED`: 0-1)."""
    import plotly.graph_objects as go

    from rotviz.plots import style

    fig = go.Figure()
    for i, key in enumerate(("aligned", "unaligned")):
        label = f"aligned ({d['to']})" if key == "aligned" else "not aligned"
        fig.add_scatter(x=d["k"], y=d["acc"][key], mode="lines+markers", name=label,
                        line={"color": style.color(3 if i == 0 else 0), "dash": style.dash(i)},
                        marker={"symbol": style.marker(i)},
                        hovertemplate="%{x} models: %{y:.4f}<extra>" + label + "</extra>")
    best = max(d["model_acc"])
    fig.add_scatter(x=[d["k"][0], d["k"][-1]], y=[best, best], mode="lines",
                    name="best single model", line={"color": style.GREY, "dash": "dot"})
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(range=list(acc_range) if acc_range is not None else style.acc_range(
        [*d["acc"]["aligned"], *d["acc"]["unaligned"], best]))
    return style.finish(fig, "Merged model's accuracy against the number of models merged",
                        "models merged (the first k, equal weights)", style.ACCURACY,
                        "models", font_size)


def _plot(d: dict, look: Style):
    return distance_matrices(d, font_size=look.font_size, colour_range=look.colour_range)


def _figures(d: dict, style: Style) -> dict:
    """The distance matrices (the record's figure) and the merged accuracy against the
    number of models merged."""
    return {"many": _plot(d, style),
            "many_merged": merged_by_count(d, style.font_size, style.accuracy_axis())}


def _caption(r: dict) -> str:
    ended = "one pass" if r["to"] == "anchor" else f"{r['rounds']} round(s), {r['ended']}"
    return (f"Mean pairwise distance {r['spread'][0]:.3f} as given, {r['spread'][-1]:.3f} "
            f"aligned ({ended}); on {r['n']} {r['split']} samples, {r['seconds']:.1f} s.")


SECTION = Section(
    "merge", 30, "Many models at once",
    "Three or more models of one architecture, aligned into one basis, then averaged: onto "
    "the first model (the anchor), or onto their **barycentre**, the mean refined round by "
    "round (every model matched onto the current mean, the aligned models averaged into the "
    "next). Each aligned model is its original moved by a symmetry, so it computes the same "
    "function. Left: the distance between every two models as given; right: aligned (one "
    "colour scale). Below: the equal-weight mean of the first *k* models, aligned and not, "
    "against *k*.",
    figures=_figures, caption=_caption, busy="Aligning many models",
    doing=lambda v: "matching every model, then merging the first k")

MANY = register(Measurement(
    "many", "Many models",
    "align N >= 3 models (onto the first or their barycentre), then merge the first k",
    _run, _params, summary=_summary, plot=_plot, rows=_rows, check=_check, models=("base",),
    refusal="it holds every model in memory; run it on models that fit",
    inputs=Inputs((("models", "three or more models of one architecture (each "
                    f"{hf_cache.MODEL_HELP}); the first is the anchor"),), ManyModels, ("seed",),
                  least=LEAST, one_spec=True),
    progress=True, section=SECTION, order=160))

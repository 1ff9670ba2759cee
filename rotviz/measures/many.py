"""Many models at once: N >= 3 models of one architecture aligned into one basis (onto the
first, or onto their iteratively refined barycentre) and merged, the merged accuracy against
the number of models (rotviz.analysis.many, docs/symmetries.md)."""

from __future__ import annotations

from functools import cached_property

from rotviz import hub
from rotviz.limits import ROUNDS, TOL
from rotviz.measures.registry import Context, Inputs, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

# the fewest models `many` takes (rotviz.analysis.many.MIN_MODELS, which imports torch: this
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
        from rotviz.analysis.many import MIN_MODELS
        from rotviz.errors import RotvizError
        from rotviz.match.selection import label_of, match_options
        from rotviz.models import resolve_ref

        specs = list(specs or ("seed",))
        if len(specs) != 1:
            raise RotvizError(f"many aligns with one matching, got {len(specs)} --match "
                              "options; give one --match SPEC")
        options = match_options(specs[0])
        if options is None:  # before any model is loaded (rotviz.analysis.many says it late)
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
        from rotviz.analysis.many import check_models
        from rotviz.models import load_model

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


def _run(inputs: ManyModels, ctx: Context, v: dict):
    from rotviz.analysis.many import many, registered_merge
    from rotviz.measures.merge import _given, _load_base

    final = None  # the simple average: the plain mean the barycentre is made of
    if v["method"] != "simple":
        base = _load_base(ctx, v)
        final = registered_merge(v["method"], None if base is None else base.state,
                                 **_given(v))
    r = many(inputs.models, ctx.split, inputs.spec, v["to"], v["rounds"], v["tol"],
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


def _plot(d: dict, style: Style):
    from rotviz.plots.many import distance_matrices

    return distance_matrices(d)


def _figures(d: dict, style: Style) -> dict:
    """The distance matrices (the record's figure) and the merged accuracy against the
    number of models merged."""
    from rotviz.plots.many import merged_by_count

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
                    f"{hub.MODEL_HELP}); the first is the anchor"),), ManyModels, ("seed",),
                  least=LEAST, one_spec=True),
    progress=True, section=SECTION, order=160))

"""The fusion table: every chosen merge method (rotviz.merging) on one matched pair, each
merged model's test accuracy, loss and the task's own scores beside the two models (the
seed paper's Tables 1-2, one matching per column: run it once per matching and `combine`).

Its parameters are the merge record's (`merge`), with `methods` (a comma-separated list)
in place of its one `method`. At size, the methods that merge tensor by tensor (the merge
record's own at-size path) run, and each other method is left `off` with its reason. It is
the Merge page's first section."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rotviz.errors import RotvizError
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style


class Table(dict):
    """The result: plain data (`to_dict`), a table of methods by matchings."""

    def to_dict(self) -> dict:
        return dict(self)


def _merge_record() -> Measurement:
    from rotviz.measures import measurement

    return measurement("merge")


def _params() -> tuple[Param, ...]:
    """--methods, then the merge record's own (weight, base, each method's parameters), not
    its --repair (REPAIR is an option of one merge, `rotviz merge --repair`, the Measure
    page, not of the table, as merge_sweep leaves it too) nor its routes for a pair of
    different depths (the table measures a pair of one depth)."""
    from rotviz.merging import names

    return (Param("methods", "", f"comma-separated merge methods, of {', '.join(names())} "
                  "(default: every one that needs no base model, and with --base every one)",
                  label="Merge methods", metavar="NAMES", essential=True),
            ) + tuple(p for p in _merge_record().parameters()
                      if p.name not in ("method", "repair", "depth_pairing", "depth_route"))


def methods_of(v: dict) -> list[str]:
    """The methods a run merges with: those named, else the default set
    (rotviz.merging.registry.table_methods: with a base, also those built on task vectors)."""
    from rotviz.merging import names
    from rotviz.merging.registry import table_methods

    named = [m.strip() for m in str(v["methods"]).split(",") if m.strip()]
    unknown = [m for m in named if m not in names()]
    if unknown:
        raise RotvizError(f"--methods {','.join(unknown)}: no such merge method; use "
                          f"{', '.join(names())}")
    return named or table_methods(bool(v.get("base")))


def _own(v: dict) -> dict:
    """The merge methods' own parameter values (not methods, weight, base)."""
    return {k: x for k, x in v.items() if k not in ("methods", "weight", "base")}


def _check(values: dict, given: set[str]) -> None:
    """Each method checked as the merge record checks it (a base where it needs one, its
    parameters; the base goes to those methods only): a parameter none of the chosen methods
    takes is refused, and so is a base none of them takes."""
    from rotviz.analysis.merges import method_params
    from rotviz.merging import check_base, check_models, method, names

    if "methods" in given and not str(values["methods"]).strip(" ,"):
        raise RotvizError(f"--methods names no method; give one or more of {', '.join(names())}, "
                          "or leave it out for the default set")
    chosen = [method(m) for m in methods_of(values)]
    for m in chosen:
        if m.needs_base:
            check_base(m, bool(values["base"]))
        check_models(m, 2)
    if values["base"] and not any(m.needs_base or m.base_optional for m in chosen):
        check_base(chosen[0], True)  # its one line: drop --base, or a method that takes one
    for k in given - {"methods", "weight", "base"}:
        takers = [m for m in chosen if any(p.name == k for p in m.params)]
        if not takers:
            raise RotvizError(f"--{k.replace('_', '-')} is taken by none of the methods "
                              f"chosen ({', '.join(m.name for m in chosen)})")
        for m in takers:
            method_params(m, {k: values[k]})


def _run(ends, ctx: Context, v: dict) -> Table:
    from rotviz.analysis.fusion import fusion_on

    base = None
    if v["base"]:
        from rotviz.sources.loading import load_model

        base = ctx.load(v["base"]) if ctx.load is not None else load_model(v["base"])
    t = fusion_on({ends.match: ends}, ctx.split, None, methods_of(v), v["weight"], ctx.device,
                  ctx.progress, base=base, **_own(v)).to_dict()
    t["timing"] = {k: x for k, x in t["timing"].items() if not k.startswith("match:")}
    return Table(t, match=ends.match, off={})  # `off`: the methods left off at size


def _at_size(ends, ctx: Context, v: dict) -> Table:
    """At size: each method that merges tensor by tensor through the merge record's own
    at-size path, the others `off` with their reason."""
    import time

    from rotviz.analysis.fusion import NO_STATISTICS
    from rotviz.merging import method

    merge = _merge_record()
    t0 = time.perf_counter()
    runs, off = {}, {}
    for name in methods_of(v):
        m = method(name)
        if not m.at_size:
            off[name] = (f"{m.label} needs statistics of whole models (Fisher information, "
                         "Gram matrices), which a pair read block by block does not hold")
            continue
        base = v["base"] if m.needs_base or m.base_optional else ""  # as in memory
        values = merge.values({"method": name, "weight": v["weight"], "base": base,
                               **{p.name: v[p.name] for p in m.params if p.name in v}})
        runs[name] = merge.at_size(ends, ctx, values).to_dict()
    if not runs:
        from rotviz.merging import merges_at_size

        raise RotvizError("no merge method chosen merges block by block: "
                          + "; ".join(off.values()) + f"; pick {merges_at_size()}, or raise "
                          "the memory budget")
    first = next(iter(runs.values()))
    sp = ends.match
    return Table(
        methods=list(runs), specs=[sp], match=sp,
        acc={m: {sp: r["acc"]} for m, r in runs.items()},
        loss={m: {sp: r["loss"]} for m, r in runs.items()},
        scores={m: {sp: r["scores"]} for m, r in runs.items()},
        distance={sp: first["distance_after"]},
        **{k: first[k] for k in ("anchor_acc", "source_acc", "anchor_loss", "source_loss",
                                 "anchor_scores", "source_scores", "data", "split",
                                 "batches", "batch_size", "device")},
        weight=v["weight"], alpha=v.get("alpha"), stats_split=NO_STATISTICS,
        seconds=time.perf_counter() - t0, timing={}, off=off)


def combine(tables: Sequence[dict]) -> dict:
    """The tables of one pair under several matchings as one (a column per matching), as
    `rotviz.analysis.fusion.fusion_on` makes it of several endpoints at once; each
    matching's function check under `checks`, the most memory a run held under `at_size`."""
    first = tables[0]
    out = {**first, "specs": [sp for t in tables for sp in t["specs"]],
           "seconds": sum(t["seconds"] for t in tables),
           "checks": [{"spec": t["match"], "max_output_diff": t.get("max_output_diff"),
                       "tolerance": t.get("tolerance")}
                      for t in tables if t["match"] != "none"]}
    for key in ("acc", "loss", "scores"):
        out[key] = {m: {sp: x for t in tables for sp, x in (t.get(key) or {}).get(m, {}).items()}
                    for m in first["methods"]}
    out["distance"] = {sp: d for t in tables for sp, d in t["distance"].items()}
    sized = [t["at_size"] for t in tables if t.get("at_size")]
    if sized:
        out["at_size"] = {**sized[0], "held": max(s.get("held") or 0 for s in sized)}
    return out


def rows(d: dict) -> list[dict]:
    """One row per method and matching: the merged model's accuracy, loss, the task's own
    scores and the (matched) source's distance to the anchor."""
    from rotviz.merging import method

    scored = d.get("scores") or {}
    return [{"method": method(m).label, "matching": sp, "acc": d["acc"][m][sp],
             "loss": d["loss"][m][sp], **(scored.get(m, {}).get(sp) or {}),
             "distance": d["distance"][sp]}
            for m in d["methods"] for sp in d["specs"]]


def score_of(d: dict) -> str | None:
    """The task's F1 the seed paper's Table 1 scores merges by, where the task has one."""
    return next((k for k in ("entity_f1", "macro_f1") if k in (d.get("anchor_scores") or {})),
                None)


def figures(d: dict, style: Style) -> dict[str, Any]:
    """The merged accuracy per method (one bar per matching, the two models as lines) and,
    where the task has one, its F1 on the same scale (read side by side)."""
    from rotviz.measures.merge import bar_range, fusion_chart

    table = rows(d)
    f1 = score_of(d)
    refs = {f"anchor ({d['anchor_acc']:.3f})": d["anchor_acc"],
            f"source ({d['source_acc']:.3f})": d["source_acc"]}
    f1_refs = {} if f1 is None else {
        f"anchor ({d['anchor_scores'][f1]:.3f})": d["anchor_scores"][f1],
        f"source ({d['source_scores'][f1]:.3f})": d["source_scores"][f1]}
    shared = bar_range([r[k] for r in table for k in ("acc", f1) if k in r]
                       + [*refs.values(), *f1_refs.values()], style.fixed_accuracy)
    figs = {"fusion": fusion_chart(table, "acc", style.font_size, refs, shared)}
    if f1 is not None:
        figs["fusion_f1"] = fusion_chart(table, f1, style.font_size, f1_refs, shared)
    return figs


def _plot(d: dict, style: Style):
    return figures(d, style)["fusion"]


def _summary(t, how: str) -> str:
    best = max(rows(t), key=lambda r: r["acc"])
    return (f"fusion [{t['match']}] on {t['device']}{how}: {len(t['methods'])} method(s), "
            f"best {best['method']} accuracy {best['acc']:.4f}; anchor {t['anchor_acc']:.4f}, "
            f"source {t['source_acc']:.4f}; {t['seconds']:.2f} s")


def caption(d: dict) -> str:
    """The line under the Merge page's chart: the best merge, what it was measured on, and
    the task's F1 where it is drawn."""
    from rotviz.plots.style import metric_help, metric_label, nice_label

    best = max(rows(d), key=lambda r: r["acc"])
    f1 = score_of(d)
    said = "" if f1 is None else f"{metric_label(f1)}: {metric_help(f1)}. "
    return (f"{said}Best: {best['method']} after {nice_label(best['matching'])}, accuracy "
            f"{best['acc']:.3f} (anchor {d['anchor_acc']:.3f}, source {d['source_acc']:.3f}). "
            f"Evaluated on {d['split']} ({d['data']}); statistics from the {d['stats_split']} "
            f"split, {d['batches']} x {d['batch_size']} examples; {d['seconds']:.1f} s on "
            f"{d['device']}.")


SECTION = Section(
    "merge", 10, "",
    "Fusing two models into one only works when their neurons and heads line up. Each method "
    "is run on the raw pair and after each matching picked above; the dashed lines are the "
    "two original models. Statistics (Fisher information, Gram matrices) come from the "
    "training split, computed on the matched models.",
    hidden=("methods", "base"), caption=caption, on_open=True, per_matching=True,
    combine=combine, figures=figures,
    doing=lambda v: "every method on the matched pair")

FUSION = register(Measurement(
    "fusion", "Fusion table (every merge method)",
    "merged accuracy and loss of every chosen merge method on the matched pair, beside both "
    "models (the Merge page runs it once per matching, a column each)",
    _run, _params, summary=_summary, plot=_plot, rows=rows, at_size=_at_size, check=_check,
    models=("base",), section=SECTION,
    at_size_help="matched at size, and each method without statistics built and "
                 "evaluated block by block (the others left off, with their reason)",
    at_size_how=" (at size: built block by block)", order=35))

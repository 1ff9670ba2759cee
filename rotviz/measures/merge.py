"""A merged model: the matched source merged into the anchor with a registered merge method
(rotviz.merging), evaluated beside both endpoints. Its parameters are the method's, and
`--base MODEL` for the methods built on task vectors: the base is read as the pair is
(through the host's confined loading), never matched (alignment moves the source only), and
must share the anchor's architecture and shapes. Here: the record, `merge` (match, then
rotviz.analysis.merges.merge_on, which the sweep, the fusion table and the at-size merge
share) and its figure, `fusion_chart`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rotviz.limits import WEIGHT
from rotviz.measures.barrier import match_label
from rotviz.measures.registry import Context, Measurement, OutputFile, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style
from rotviz.sources import hf_cache

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import torch

    from rotviz.analysis.merges import Merged
    from rotviz.data.split import Split
    from rotviz.match.options import MatchOptions
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress


def _params() -> tuple[Param, ...]:
    """--method and --weight, then every registered method's own parameters (a parameter
    given for a method that does not take it is refused by `_check`)."""
    from rotviz.merging import all_params, methods, names

    based = [m.name for m in methods() if m.needs_base]
    out = [Param("method", "simple", f"{', '.join(names())} (default simple)", choices=names(),
                 label="Merge method", essential=True),
           Param("weight", 0.5, "weight of the source in [0, 1] (default 0.5)", WEIGHT,
                 label="Weight of the source", widget=(0.0, 1.0, 0.05), essential=True),
           Param("base", "", f"{' and '.join(based)} (needed): the model both were fine-tuned "
                 f"from, {hf_cache.MODEL_HELP}; never matched, so it must share the "
                 "anchor's basis (default none)", label="Base model (task vectors)",
                 metavar="MODEL")]
    for p in all_params():
        helps: dict[str, list[str]] = {}  # one help per wording, with the methods that use it
        for m in methods():
            for q in m.params:
                if q.name == p.name:
                    helps.setdefault(q.help, []).append(m.name)
        text = "; ".join(f"{' and '.join(who)}: {h}" for h, who in helps.items())
        out.append(Param(p.name, p.default, text, p.bound, p.choices, p.title, p.widget))
    return tuple(out)


REPAIR = Param("repair", "no", "yes: REPAIR the merged model (rotviz.analysis.repair, alpha "
               "= --weight): each FFN hidden unit's and head output's mean and std reset to "
               "the interpolation of the endpoints', on the train split; reports the merge "
               "without it beside (default no)", choices=("no", "yes"),
               label="REPAIR the merged model (reset unit statistics)")


DEPTH_PAIRING = Param(
    "depth_pairing", "similarity", "a source with more blocks than the anchor (one family and "
    "width): how the anchor's blocks are paired with the source's; similarity: by the linear "
    "CKA of their outputs on the train split, position: spread evenly (default similarity)",
    choices=("similarity", "position"), label="Depths: pair blocks by")
DEPTH_ROUTE = Param(
    "depth_route", "groups", "a source with more blocks than the anchor: groups: each group "
    "of the source's blocks paired with one of the anchor's collapsed into one block (the "
    "merge has the anchor's depth); expand: the anchor expanded with identity blocks (the "
    "merge has the source's depth) (default groups)",
    choices=("groups", "expand"), label="Depths: route to one depth")


EVALUATE = Param(
    "evaluate", "yes", "no: only merge and write the model (--out DIR), the work mergekit "
    "does: neither it nor the two models are evaluated, nor a pair not matched measured (at "
    "size: no float32 cache, no passes over the data or the pair), so the result holds no "
    "losses, and no distance of a pair not matched (default yes)",
    choices=("yes", "no"), label="Evaluate the merged model")


def _record_params() -> tuple[Param, ...]:
    """The merge's options, --repair, the routes for a pair of different depths and
    --evaluate (the record's own: the sweep takes the rest)."""
    return (*_params(), REPAIR, DEPTH_PAIRING, DEPTH_ROUTE, EVALUATE)


def _one_depth(anchor: Loaded, source: Loaded, v: dict, split: Split | None, device):
    """A source deeper than the anchor brought to the anchor's depth (`groups`) or the anchor
    to the source's (`expand`), rotviz.analysis.depths; the block pairing by similarity reads
    the train split of the evaluation data. A method that takes a base is refused: the base
    has one depth, the merged pair may have another."""
    from rotviz.analysis.depths import OneDepth, depth_refusal, same_depth
    from rotviz.errors import RotvizError
    from rotviz.merging import method, methods

    m = method(v["method"])
    if m.needs_base or v.get("base"):
        free = ", ".join(x.name for x in methods() if not x.needs_base)
        raise RotvizError(depth_refusal(anchor, source, f"--method {m.name} with --base takes "
                                        f"task vectors from a base of one depth; use --method "
                                        f"{free} without --base"))
    train = split.sibling("train") if split is not None and \
        v["depth_pairing"] == "similarity" else None
    a, b, info = same_depth(anchor, source, v["depth_pairing"], v["depth_route"], train,
                            device)
    return a, b, OneDepth(info, anchor, source)


def _names() -> tuple[str, ...]:
    from rotviz.merging import names

    return names()


def _given(v: dict) -> dict:
    """The values of the chosen method's own parameters."""
    from rotviz.merging import method

    declared = {p.name for p in method(v["method"]).params}
    return {k: x for k, x in v.items() if k in declared}


def _check(values: dict, given: set[str]) -> None:
    """A parameter given for a method that does not take it is refused, and so is a method
    that needs a base given none or one that takes none given one (one line each)."""
    from rotviz.analysis.merges import method_params
    from rotviz.merging import check_base, check_models, method

    m = method(values["method"])
    method_params(m, {k: values[k] for k in given
                      if k not in ("method", "weight", "base", "repair", "depth_pairing",
                                   "depth_route", "evaluate")})
    if values.get("evaluate") == "no" and values.get("repair") == "yes":
        from rotviz.errors import RotvizError

        raise RotvizError("--repair is judged by evaluating the merged model, and --evaluate "
                          "no skips that; drop one of them")
    check_base(m, bool(values["base"]))
    check_models(m, 2)


def _pair_check(anchor, source, v: dict) -> None:
    """A method that builds the model from whole blocks (passthrough) is tried on the pair
    as loaded (references only, nothing copied), so slices beyond a model's depth are
    refused before the pair is matched."""
    from rotviz.merging import method

    m = method(v["method"])
    if m.assemble is not None:
        from rotviz.merging.combine import build_pair

        build_pair(anchor, m.name, anchor.state, source.state, **_given(v))


def _load_base(ctx: Context, v: dict):
    """The base model, read through the host's loading (the app's confined roots), or None."""
    if not v["base"]:
        return None
    if ctx.load is not None:
        return ctx.load(v["base"])
    from rotviz.sources.loading import load_model

    return load_model(v["base"])


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.merges import merge_on

    r = merge_on(ends, v["method"], ctx.split, v["weight"], ctx.device, ctx.progress,
                 base=_load_base(ctx, v), evaluate=_evaluates(v), **_given(v))
    if v.get("repair") == "yes":
        from rotviz.analysis.repair import repair_merged

        if not r.state:  # ZipIt!'s partial zip: two paths, no one model to measure
            from rotviz.errors import RotvizError

            raise RotvizError("--repair resets the units of one merged model, and a partial "
                              "zip keeps each model's later blocks; drop --repair, or zip "
                              "every block (--zip-layers -1)")

        r = repair_merged(r, ends.anchor, ends.matched, ctx.split, ctx.device)
    if ctx.depths is not None:
        r.depths = _depth_report(ctx.depths, ctx.split, ctx.device, _evaluates(v))
    return r


def _evaluates(v: dict) -> bool:
    """Whether the merge is evaluated (--evaluate; a caller's values without it: yes)."""
    return v.get("evaluate", "yes") != "no"


def _depth_report(one, split: Split, device, evaluate: bool = True) -> dict:
    """What the pairing did, and the two models as they were (the shallower, the deeper:
    the source collapsed or the anchor expanded are not them) evaluated on the split
    (unless the merge is not evaluated)."""
    from rotviz.evaluation import Evaluator

    out = one.depths.to_dict()
    for name, model in (("shallow", one.shallow), ("deep", one.deep)) if evaluate else ():
        ev = Evaluator(model, split, device)
        out[f"{name}_loss"], out[f"{name}_acc"] = ev.evaluate(ev.params(model.state))
        out[name] = model.ref
    return out


def _sized_check(v: dict) -> None:
    """Only a method that combines tensor by tensor without statistics merges at size."""
    from rotviz.errors import RotvizError
    from rotviz.merging import method

    if v.get("repair") == "yes":
        raise RotvizError("--repair measures the merged model's activations with the whole "
                          "model held; raise --max-memory, or drop --repair")
    m = method(v["method"])
    if m.assemble is not None:
        raise RotvizError(f"--method {m.name} builds a model of its own depth from whole "
                          "blocks, and the at-size merge writes and evaluates the anchor's "
                          "blocks in place, one by one; raise --max-memory")
    if not m.at_size:
        from rotviz.merging import methods

        sized = ", ".join(x.name for x in methods() if x.at_size)
        raise RotvizError(f"the pair is evaluated block by block (--max-memory), and --method "
                          f"{m.name} needs statistics of whole models; use --method {sized}, "
                          "or raise --max-memory")


def _at_size(ends, ctx: Context, v: dict):
    from rotviz.atsize.merge import sized_merge

    _sized_check(v)
    r = sized_merge(ends.anchor, ends.matched_path, ctx.split, v["weight"], ctx.device,
                    folder=ctx.out, layers=ends.layers,
                    # a merge only written measures nothing: not the distance of a pair it did
                    # not match either (at size a pass over both models, as long as the merge
                    # itself), whose thread is stopped before the merge begins
                    match_info=(lambda: ends.info) if _evaluates(v) else ends.unmeasured(),
                    method=v["method"], base=v["base"] or None, evaluate=_evaluates(v),
                    **_given(v))
    r.source = ends.source_ref
    return r


def _summary(r, how: str) -> str:
    """One line: the merged model's accuracy, loss and the task's own scores (F1 where the
    task has it, as the seed paper's Table 1 reports merges), beside both end models'."""
    base = f", base {r.base}" if getattr(r, "base", "") else ""
    d = getattr(r, "depths", None)
    if d:
        base += (f", depths {d['blocks'][0]} and {d['blocks'][1]} blocks by {d['route']} "
                 f"paired by {d['pairing']} {d['paired']}")
    if getattr(r, "repair", False):
        base += f", REPAIR (without: accuracy {r.acc_unrepaired:.4f}, loss {r.loss_unrepaired:.4f})"
    if getattr(r, "block_checks", None) is not None:
        base += f", {_blocks(r.block_checks)}"
    if r.acc is None:  # only merged and written (--evaluate no)
        return (f"merged [{r.method}, match {match_label(r.match, r.layers)}, weight "
                f"{r.weight:g}{base}] on {r.device}{how}: not evaluated (--evaluate no); "
                f"{r.seconds:.2f} s")
    return (f"merged [{r.method}, match {match_label(r.match, r.layers)}, weight {r.weight:g}"
            f"{base}] "
            f"on {r.device}{how}: accuracy {r.acc:.4f} (loss {r.loss:.4f})"
            f"{_scores(r.scores, ', ')}; anchor {r.anchor_acc:.4f}"
            f"{_scores(r.anchor_scores, ' ', True)}, source {r.source_acc:.4f}"
            f"{_scores(r.source_scores, ' ', True)}"
            + (f"; shallower {d['shallow_acc']:.4f}, deeper {d['deep_acc']:.4f}"
               if d and "shallow_acc" in d else "")
            + f"; {r.seconds:.2f} s")


def _blocks(rows: Sequence[Mapping]) -> str:
    """A stacked model's blocks in words, with their check against the blocks they were
    copied from: '5 blocks (anchor 0-1, source 1-2, anchor 2), each equal to its source
    block bit for bit'."""
    runs: list[list] = []
    for r in rows:
        if runs and runs[-1][0] == r["model"] and runs[-1][2] == r["from"] - 1:
            runs[-1][2] = r["from"]
        else:
            runs.append([r["model"], r["from"], r["from"]])
    where = ", ".join(f"{m} {a}" + (f"-{b}" if b != a else "") for m, a, b in runs)
    bad = [str(r["block"]) for r in rows if not r["equal"]]
    check = "each equal to its source block bit for bit" if not bad else \
        f"blocks {', '.join(bad)} NOT equal to their source blocks"
    return f"{len(rows)} blocks ({where}), {check}"


def _scores(scores: dict[str, float] | None, lead: str, paren: bool = False) -> str:
    """The task's metrics beyond accuracy (macro-F1, entity F1, ...), named as
    rotviz.data.tasks names them; empty for a task without any (a language model)."""
    from rotviz.data.tasks import METRIC_LABELS

    text = ", ".join(f"{METRIC_LABELS.get(k, k)} {v:.4f}" for k, v in (scores or {}).items())
    if not text:
        return ""
    return f"{lead}({text})" if paren else f"{lead}{text}"


def _rows(d: dict) -> list[dict]:
    """Each model's loss and accuracy, and the task's own scores (F1) where it has them."""
    return [{"model": name, "loss": d[f"{p}loss"], "acc": d[f"{p}acc"],
             **(d.get(f"{p}scores") or {})}
            for name, p in (("anchor", "anchor_"), ("merged", ""), ("source", "source_"))]


def merge(
    anchor: Loaded,
    source: Loaded,
    method: str,
    options: MatchOptions | str | None,
    split: Split,
    stats_split: Split | str | None = None,
    weight: float = 0.5,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    base: Loaded | None = None,
    depth_pairing: str = "similarity",
    depth_route: str = "groups",
    evaluate: bool = True,
    **params: Any,
) -> Merged:
    """merge(anchor, source, method, options, split, stats_split=None, weight=0.5, ...) -> Merged

    Match the source onto the anchor with `options` (MatchOptions, SPEC or None), then
    `merge_on` the endpoints with `method` (any registered merge method, rotviz.merging),
    its parameters (`batches`, `alpha`, `density`, ...) and, for a method built on task
    vectors, the `base` (not matched: it must share the anchor's basis). A source with more
    blocks than the anchor is first brought to one depth by `depth_pairing` and
    `depth_route` (rotviz.analysis.depths; `Merged.depths` then says how). `evaluate=False`
    only merges: `Merged.state` holds the merge, and its losses are None."""
    from rotviz.analysis.depths import differs_in_depth

    one = None
    if differs_in_depth(anchor, source):
        anchor, source, one = _one_depth(
            anchor, source, {"method": method, "base": base, "depth_pairing": depth_pairing,
                             "depth_route": depth_route}, split, device)
    from rotviz.analysis.merges import check_base_model, merge_on, method_params
    from rotviz.match.endpoints import match_endpoints
    from rotviz.merging import check_weight
    from rotviz.merging import method as method_record

    m = method_record(method)
    weight = check_weight(weight)
    method_params(m, params)  # a bad parameter is refused before matching
    check_base_model(m, anchor, base)
    if m.assemble is not None:  # the slices against the depths, before matching
        from rotviz.merging.combine import build_pair

        build_pair(anchor, m.name, anchor.state, source.state, **params)
    ends = match_endpoints(anchor, source, options, device, data=split)
    if isinstance(stats_split, str):  # a split's name, as the method's parameter takes it
        params, stats_split = {**params, "stats_split": stats_split}, None
    r = merge_on(ends, m.name, split, weight, device, progress, stats_split, base,
                 evaluate=evaluate, **params)
    if one is not None:
        r.depths = _depth_report(one, split, device, evaluate)
    return r


def fusion_chart(rows: Sequence[Mapping], metric: str = "acc", font_size: int = 14,
                 references: Mapping[str, float] | None = None,
                 y_range: Sequence[float] | None = None) -> go.Figure:
    """Grouped bars: one group per fusion method, one bar per matching setting.

    Each row has `method`, `matching` (a label) and the metric (`acc` or `loss`).
    `references` (e.g. {"anchor": 0.95, "source": 0.94}) are drawn as horizontal lines.
    A 0-1 score's axis starts at 0 (bars) and ends just above the highest bar or line,
    unless `y_range` is given (`style.ACC_FIXED` for the 0-1 scale, or one range shared
    with a chart it is compared with).
    """
    import plotly.graph_objects as go

    from rotviz.plots import style

    methods = list(dict.fromkeys(str(r["method"]) for r in rows))
    settings = list(dict.fromkeys(str(r["matching"]) for r in rows))
    fig = go.Figure()
    for i, s in enumerate(settings):
        by_method = {str(r["method"]): r for r in rows if str(r["matching"]) == s}
        fig.add_bar(
            x=methods, y=[by_method[m][metric] if m in by_method else None for m in methods],
            name=style.nice_label(s), marker_color=style.color(i),
            marker_pattern_shape=("", "/", ".", "x", "-")[i % 5],
            hovertemplate="%{x}: %{y:.3f}<extra>" + style.nice_label(s) + "</extra>",
        )
    for j, (name, value) in enumerate((references or {}).items()):
        fig.add_scatter(
            x=methods, y=[float(value)] * len(methods), mode="lines", name=name,
            line={"color": "#000000" if j == 0 else style.GREY, "dash": ("dash", "dot")[j % 2]},
            hovertemplate=f"{name}: {float(value):.3f}<extra></extra>",
        )
    fig.update_layout(barmode="group")
    named = {"acc": ("accuracy", style.ACCURACY), "loss": ("loss", style.LOSS)}
    what = style.metric_label(metric)
    word, y = named.get(metric, (what, f"test {what} (0-1, higher is better)"))
    if metric not in ("loss", "mse"):
        values = [r[metric] for r in rows if metric in r] + list((references or {}).values())
        fig.update_yaxes(range=list(y_range) if y_range is not None else bar_range(values))
    title = f"Merged model {word} per fusion method"
    return style.finish(fig, title, "fusion method", y, "matching before fusion", font_size)


def bar_range(values: Sequence[float], fixed: bool = False) -> list[float]:
    """The y range of bars of a 0-1 score: from 0 (a bar's length is its value) to just above
    the data (`style.acc_range`'s top), or the fixed 0-1 scale."""
    from rotviz.plots import style

    return [0.0, style.acc_range(values, fixed)[1]]


def _plot(d: dict, look: Style):
    if d["acc"] is None:  # only merged and written (--evaluate no): nothing measured
        return _unevaluated(d, look)
    return fusion_chart([{"method": d["method"], "matching": d["match"], "acc": d["acc"]}],
                        font_size=look.font_size,
                        references={"anchor": d["anchor_acc"], "source": d["source_acc"]},
                        y_range=look.accuracy_axis())


def _unevaluated(d: dict, look: Style) -> go.Figure:
    """The figure of a merge that was not evaluated: its method's empty bar and a note
    saying so, on the accuracy axis it would have had."""
    import plotly.graph_objects as go

    from rotviz.plots import style

    fig = go.Figure()
    fig.add_bar(x=[d["method"]], y=[None], name=style.nice_label(d["match"]),
                marker_color=style.color(0))
    fig.add_annotation(text="not evaluated (--evaluate no): the merge was only written",
                       x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False)
    fig.update_yaxes(range=[0.0, 1.0])
    return style.finish(fig, f"Merged model ({d['method']}): not evaluated", "fusion method",
                        style.ACCURACY, "matching before fusion", look.font_size)


def _mergekit_check(v: dict) -> None:
    """A method or value mergekit cannot express is refused before any model is loaded."""
    from rotviz.merging import names
    from rotviz.merging.mergekit import check

    if v.get("repair") == "yes":
        from rotviz.errors import RotvizError

        raise RotvizError("--mergekit-config: mergekit cannot express REPAIR; drop --repair")
    check(v["method"], _given(v), names(), base=bool(v.get("base")), weight=v["weight"])


def _mergekit_folders(path):
    from rotviz.merging.mergekit import matched_folder

    return (matched_folder(path),)


def _mergekit_write(ends, result, v: dict, file, folders, final) -> None:
    """The matched source as a model folder beside the configuration (held: written from
    memory; at size: the streamed match's files copied), and the configuration naming the
    anchor's folder, that one and the base's (absolute paths, as they will be named)."""
    from rotviz.merging.mergekit import mergekit_config
    from rotviz.outputs import text_stamp
    from rotviz.sources.loading import resolve_ref

    if getattr(result, "depths", None):
        from rotviz.errors import RotvizError

        raise RotvizError("--mergekit-config: mergekit merges models of one depth, and this "
                          "pair's depths differ; drop --mergekit-config")
    (matched,) = folders
    if hasattr(ends, "matched_path"):  # at size: the matched source is a checkpoint folder
        _copy_model(resolve_ref(ends.matched_path), matched)
    else:
        from rotviz.sources.writing import write_model

        same = all(ends.source.state[k].shape == t.shape for k, t in ends.matched.items()
                   if k in ends.source.state)  # a narrower source is written in A's width
        write_model(ends.source if same else ends.anchor, ends.matched, matched)
    base = v.get("base") or None  # a model reference, where the method takes a base
    text = mergekit_config(v["method"], _given(v), v["weight"], ends.anchor.path.resolve(),
                           final[1][0].resolve(),
                           str(ends.anchor.stored_dtype).removeprefix("torch."),
                           None if base is None else resolve_ref(base).resolve(),
                           note=f" (rotviz merge --method {v['method']} --weight "
                                f"{v['weight']:g}, match {ends.match})")
    with open(file, "x") as f:  # stamped, so --overwrite may replace it later
        f.write(text_stamp("merge") + text)


def _copy_model(src, folder) -> None:
    """The files of the model folder `src` (its checkpoint, config and reading files) into
    the output `folder` (rotviz's own output marker left: the folder gets its own)."""
    import shutil

    from rotviz.outputs import MARKER

    for e in sorted(src.iterdir()):
        if e.is_file() and e.name != MARKER:
            shutil.copyfile(e, folder / e.name)


MERGEKIT_FILE = OutputFile(
    "--mergekit-config",
    "also write a mergekit configuration (YAML, for mergekit-yaml) of this merge to this new "
    "file, named .yml or .yaml, and the matched source it reads to FILE's name less its "
    "suffix plus -matched (merge.yaml: merge-matched/)",
    folders=_mergekit_folders, check=_mergekit_check, write=_mergekit_write,
    suffixes=(".yml", ".yaml"))


MERGE = register(Measurement(
    "merge", "Merge", "merge the matched source into the anchor and evaluate it",
    _run, _record_params, summary=_summary, plot=_plot, rows=_rows, at_size=_at_size, check=_check,
    writes_model=True, at_size_check=_sized_check, pair_check=_pair_check, narrower=True,
    models=("base",), depths=_one_depth,
    files=(MERGEKIT_FILE,),
    more=lambda: f" (methods: {', '.join(_names())})",
    at_size_how=" (at size: built block by block)",
    at_size_help="matched at size, and the merge (the methods without "
                 "statistics) built, evaluated and written block by block", order=30))

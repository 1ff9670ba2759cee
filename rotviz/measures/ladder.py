"""The symmetry ladder: the pair's barrier, distance and merged accuracy as the group it is
matched in grows, one rung per matching SPEC, and an align-to-self rung (docs/symmetries.md,
"ladder").

Each rung is an existing matching SPEC (rotviz.match.selection), so each rung's numbers are
exactly what `rotviz barrier`, `rotviz distances` and `rotviz merge --method simple` say for
that `--match` (the rungs and what each adds: rotviz.match.rungs), and one more,
**align-to-self**: the anchor matched onto itself with the ladder's largest
data-free matching (`weight`), whose barrier and distance are exactly 0 (rotviz.match.engine
returns the identity when matching lowers nothing).

Per rung: the barrier (the GLMC definition, on `points` alphas of the test split), the
Euclidean distance to the anchor after matching, and the accuracy of the simple merge at 0.5
(`(anchor + matched source) / 2`, rotviz.merging's `simple`). Each rung carries the one
sentence of the symmetry registry that says why its maps keep the function
(rotviz.symmetry.registry: the sentence of the symmetry the rung adds).

Work shared across rungs: one evaluator,
an evaluation cache keyed by the parameters' bytes (alpha = 0 is the anchor itself, bit for
bit, on every path; align-to-self's path and merge are the anchor), learned matching
starting from the activation rung's match, training on a thread of its own while the main
thread solves the data-free rungs, and the evaluations run by whichever thread is free, at
most one per core (rotviz.analysis.workpool; bench/ladder.py).

    from rotviz import load_model, measure
    from rotviz.measures.ladder import LadderPair, ladder
    r = ladder(LadderPair.of(load_model(A), load_model(B)), split)   # or:
    r = measure("ladder", [A, B], split, match=["none", "seed", "weight"], points=21)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rotviz.confine import ANYWHERE, Confined
from rotviz.limits import BATCH_SIZE, DEFAULT_STEPS, POINTS, STEPS
from rotviz.measures.registry import Context, Inputs, Measurement, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style
from rotviz.sources import hf_cache
from rotviz.symmetry.registry import LADDER

if TYPE_CHECKING:
    import torch

    from rotviz.data.split import Split
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

SELF = "self"  # the align-to-self rung's kind

PARAMS = (
    Param("points", 11, f"number of alphas in [0, 1] on each rung's path (default 11, "
          f"{POINTS.text})", POINTS, label="Points on each path", widget=(3, 41, 2)),
    Param("steps", DEFAULT_STEPS, f"learned rung: at most this many learned-matching steps "
          f"(default {DEFAULT_STEPS}, {STEPS.text}; given, it needs a learned rung)", STEPS,
          label="Learned matching steps"),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)


class LadderPair:
    """What `rotviz ladder` takes: the anchor and the source, and the rungs' SPECs. `read`
    checks the SPECs and finds both model folders (one line each); the models are loaded
    through `confined` when first used, so that a command's other refusals (its data, its
    outputs) come before that, and checked to be matchable as they are."""

    def __init__(self, refs: Sequence[str], specs: Sequence[str] | None = None,
                 confined: Confined = ANYWHERE) -> None:
        from rotviz.match.rungs import rung_specs
        from rotviz.sources.loading import resolve_ref

        self.specs = rung_specs(specs)  # SPEC errors before any model is read
        self.refs = (str(refs[0]), str(refs[1]))
        self.paths = (resolve_ref(refs[0], confined), resolve_ref(refs[1], confined))
        self.confined = confined
        self._models: tuple[Loaded, Loaded] | None = None

    @classmethod
    def read(cls, refs: Sequence[str], specs: Sequence[str] | None = None,
             confined: Confined = ANYWHERE) -> LadderPair:
        return cls(refs, specs, confined)

    @classmethod
    def of(cls, anchor: Loaded, source: Loaded, specs: Sequence[str] | None = None
           ) -> LadderPair:
        """A pair already loaded (the library: `ladder(LadderPair.of(a, b), split)`)."""
        from rotviz.match.rungs import rung_specs

        pair = cls.__new__(cls)
        pair.specs, pair.refs = rung_specs(specs), (anchor.ref, source.ref)
        pair.paths, pair.confined = (Path(anchor.ref), Path(source.ref)), ANYWHERE
        pair._models = pair._check(anchor, source)
        return pair

    @staticmethod
    def _check(anchor: Loaded, source: Loaded) -> tuple[Loaded, Loaded]:
        from rotviz.match.widths import check_pair, refuse_narrower

        if check_pair(anchor, source):  # also refuses two architectures, in one line
            refuse_narrower("the ladder's first rung compares the pair as it is",
                            "compare two models of one width")
        return anchor, source

    def models(self) -> tuple[Loaded, Loaded]:
        """Both models, loaded once and checked: in plain torch where that computes the same
        logits (rotviz.sources.plain_torch: no transformers import), as the barrier command loads
        them."""
        if self._models is None:
            from rotviz.sources.plain_torch import load_for_eval

            self._models = self._check(*(load_for_eval(r, confined=self.confined)
                                         for r in self.refs))
        return self._models

    def first_pair(self) -> tuple[Path, Path]:
        return self.paths


@dataclass
class Ladder:
    """Every rung's barrier, distance and merged accuracy (`rungs`, in order, then the
    align-to-self rung), with what they were measured on."""

    anchor: str
    source: str
    rungs: list[dict]  # one per rung: see `ladder`
    skipped: dict[str, str]  # SPEC -> why the pair cannot use it
    alphas: list[float]
    points: int
    data: str
    split: str
    n: int
    device: str
    seconds: float
    anchor_loss: float = 0.0
    anchor_acc: float = 0.0
    learn_steps: int = DEFAULT_STEPS
    stopped: str = ""  # "cancelled" when the caller's cancel() stopped learned matching
    task: str = ""
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _inputs_check(inputs, values: dict, given: set[str]) -> None:
    """--steps bounds the learned rung alone: with none among the rungs it would be ignored."""
    from rotviz.match.selection import parse_selection
    from rotviz.params import needs

    needs("--steps", "steps" in given, "a learned rung (--match learned)",
          any(parse_selection(s).learned for s in inputs.specs))


def ladder(pair: LadderPair, split: Split, points: int = 11, device: str | torch.device = "cpu",
           batch_size: int = 512, steps: int = DEFAULT_STEPS,
           progress: Progress | None = None,
           cancel: Callable[[], bool] | None = None,
           time_limit: float | None = None) -> Ladder:
    """ladder(LadderPair.read([anchor, source]), split) -> Ladder

    Match the source onto the anchor with each rung's SPEC (activation and learned matching
    train on `split`'s train sibling, learned matching for at most `steps` steps), and for
    each: the barrier on `points` alphas as `rotviz barrier` measures it, the distance after
    matching, and the simple merge at 0.5 evaluated as `rotviz merge --method simple` does.
    Then the align-to-self rung (`time_limit`: seconds each weight matching's alternation
    may take, in every rung that has one). Each rung dict holds: kind (rung or self), spec, asked,
    words, adds, reason, barrier, loss_range, distance_before, distance, mid_acc (the path's
    point at 0.5), merged_acc, merged_loss, scores of the merge, loss and acc along the path,
    max_output_diff, match_seconds, seconds (its evaluations', summed).

    Matching runs in the calling thread, rung after rung (the unmatched rung, then the
    rungs a learned rung starts from), except learned matching, which trains on a thread of
    its own on twins of the pair's modules (rotviz.sources.running.twin) as soon as its start is
    matched: on the default pair it is half of the ladder's computing. Each rung's points
    and merge are evaluated meanwhile, one parameter set per task, by whichever thread is
    free, each on its own twin of the module (rotviz.analysis.workpool.Work): matching and
    learning first, at most as many threads at once as the caller has torch threads, each
    evaluating on one torch thread. Evaluation is deterministic, so which thread evaluates a
    point changes no number."""
    import threading
    from concurrent.futures import Future, ThreadPoolExecutor
    from dataclasses import replace

    import numpy as np
    import torch

    from rotviz.analysis.paths import check_path, path_point, path_points
    from rotviz.analysis.workpool import EvaluationCache, TaskGroup, Work
    from rotviz.devices import pair_params, resolve_device, threads_for
    from rotviz.evaluation import Evaluator
    from rotviz.limits import STEPS
    from rotviz.match.endpoints import from_matched, unmatched
    from rotviz.match.options import LearnOptions, with_time_limit
    from rotviz.match.pipeline import match_models
    from rotviz.match.rungs import describe, start_of, why_not
    from rotviz.match.selection import match_options, parse_selection
    from rotviz.merging.combine import merge_states
    from rotviz.sources.running import twin
    from rotviz.symmetry import registry

    check_path(points, 1, split)
    STEPS.check(steps)
    t0 = time.perf_counter()
    anchor, source = pair.models()
    ev = Evaluator(anchor, split, device, batch_size)
    dev = resolve_device(device)
    pa = ev.params(anchor.state)
    cache = EvaluationCache()
    alphas = np.linspace(0.0, 1.0, points).tolist()
    # and the point at 0.5 where `points` is even: path_points reads it (mid_acc)
    todo = alphas + ([] if any(abs(a - 0.5) < 1e-12 for a in alphas) else [0.5])
    rungs = describe(pair.specs)
    skipped = {r["asked"]: why for r in rungs if (why := why_not(r["asked"], anchor))}
    rungs = [r for r in rungs if r["asked"] not in skipped]
    # align-to-self: the largest data-free matching asked for (weight, by default)
    free = [parse_selection(r["spec"]) for r in rungs]
    free = [sel for sel in free if not any(f in registry.DATA_SOLVERS for f in sel.flags)]
    self_spec = max(free, key=lambda sel: len(sel.flags)).label if free else "none"
    starts = {start_of(o) for r in rungs if (o := match_options(r["spec"])) is not None}
    total = len(rungs) + 1
    size = pair_params(anchor.state, source.state)
    work = Work(max(1, torch.get_num_threads()))
    mine = threading.get_ident()
    evaluators: dict[int, Evaluator] = {mine: ev}  # per thread: its own module

    def evaluator() -> Evaluator:
        e = evaluators.get(threading.get_ident())
        if e is None:  # functional_call swaps a module's parameters: one module per thread
            e = evaluators[threading.get_ident()] = ev.twin()
        return e

    def evaluate(params: Callable[[], dict[str, torch.Tensor]], scores: bool = False):
        return lambda: cache.evaluate(evaluator(), params(), scores)

    def queue(ends, kind: str, rung: dict, match_s: float) -> Future:
        """The rung's points (each made when evaluated: one parameter set at a time) and its
        merge, queued; the rung's dict comes in the returned future."""
        pm = ev.params(ends.matched)
        merged = ev.params(merge_states(anchor, "simple", anchor.state, ends.matched, 0.5))
        jobs = [evaluate(lambda a=a: path_point(pa, pm, a)) for a in todo] + \
            [evaluate(lambda: merged, scores=True)]

        def finish(results: list, seconds: float) -> dict:
            at = {a: (r[0], {}) for a, r in zip(todo, results[:-1], strict=True)}
            (loss, correct, count), scores = results[-1]
            f = path_points(at.__getitem__, alphas, ev.n, split.task)
            assert f is not None  # one process
            i = ends.info
            return {**rung, "kind": kind, "barrier": f["barrier"],
                    "loss_range": f["loss_range"], "distance_before": i.distance_before,
                    "distance": i.distance_after, "mid_acc": f["mid_acc"],
                    "merged_loss": float(loss.sum() / count.sum()),
                    "merged_acc": float(correct.sum() / count.sum()), "merged_scores": scores,
                    "loss": f["loss"], "acc": f["acc"], "max_output_diff": i.max_output_diff,
                    "match_seconds": match_s, "seconds": seconds}

        r = TaskGroup(jobs, finish)
        work.put(r.tasks())
        return r.future

    learners = [0]  # learned rungs still learning

    def learn_later(rung: dict, options, begun) -> Future:
        """Learned matching on twins of the pair (own modules, shared tensors: no module is
        run by two threads at once); then its points queued, and this thread evaluates what
        is queued. The future holds the rung's future (None when cancelled)."""
        def run():
            try:
                with work.computing():
                    t1 = time.perf_counter()
                    m = match_models(twin(anchor), twin(source), options, dev, None, split,
                                     cancel, begun)
                    if (m.report.learned or {}).get("stopped") == "cancelled":
                        return None
                    ends = from_matched(anchor, source, m, options)
                    later = queue(ends, "rung", rung, time.perf_counter() - t1)
            finally:
                with work.cv:
                    learners[0] -= 1
                    work.cv.notify_all()
            with threads_for(size, dev):
                work.run(lambda: True)
            return later

        with work.cv:
            learners[0] += 1
        return learner.submit(run)

    def matching(n: int, said: str):
        if progress:
            progress(n, total, said)
        return work.computing()

    stopped = ""
    pending: dict[int, Future] = {}
    learning: dict[int, Future] = {}
    done: dict[str, object] = {}  # data-free matches a learned rung starts from
    # the unmatched rung (its points are queued at once), the matches learned rungs start
    # from, then the learned rungs (on their own thread: each trains while the calling
    # thread solves the rungs left), then the others
    kinds = {k: (-1 if (o := match_options(r["spec"])) is None else 0 if r["spec"] in starts
                 else 1 if o.learned else 2) for k, r in enumerate(rungs)}
    order = sorted(kinds, key=lambda k: (kinds[k], k))
    # the anchor: every path's first point, and with its scores align-to-self's merge
    anchor_at = TaskGroup([evaluate(lambda: pa, scores=True)], lambda results, _: results[0])
    work.put(anchor_at.tasks())
    pool = ThreadPoolExecutor(1, thread_name_prefix="rotviz-ladder")
    learner = ThreadPoolExecutor(1, thread_name_prefix="rotviz-ladder-learn")

    def serve() -> None:
        with threads_for(size, dev):  # the worker's own count, as match_models sets its own
            work.run(lambda: work.closed)

    try:
        pool.submit(serve)
        for n, k in enumerate(order):
            rung = rungs[k]
            t1 = time.perf_counter()
            options = with_time_limit(match_options(rung["spec"]), time_limit)
            if options is not None and options.learned:
                if progress:
                    progress(n, total, f"{rung['words']}: matching")
                options = replace(options, learn=LearnOptions(steps=steps))
                learning[k] = learn_later(rung, options, done.get(start_of(options) or ""))
                continue
            with matching(n, f"{rung['words']}: matching"):
                if options is None:
                    ends = unmatched(anchor, source)
                else:
                    m = match_models(anchor, source, options, dev, None, split, cancel)
                    if rung["spec"] in starts:
                        done[rung["spec"]] = m
                    ends = from_matched(anchor, source, m, options)
                pending[k] = queue(ends, "rung", rung, time.perf_counter() - t1)
        if cancel is not None and cancel():
            stopped = "cancelled"
        else:  # before learning ends: its points join the queue meanwhile
            t1 = time.perf_counter()
            with matching(len(rungs), "align-to-self: the anchor matched onto itself"):
                options = with_time_limit(match_options(self_spec), time_limit)
                ends = (unmatched(anchor, anchor) if options is None else
                        from_matched(anchor, anchor, match_models(anchor, anchor, options, dev),
                                     options))
            me = {"spec": self_spec, "asked": self_spec, "words": "align-to-self",
                  "adds": [], "reason": registry.SELF_REASON}
            pending[len(rungs)] = queue(ends, SELF, me, time.perf_counter() - t1)
        with threads_for(size, dev):  # this thread evaluates too, until learning ends
            work.run(lambda: learners[0] == 0)
        for k, f in learning.items():
            later = f.result()
            if later is None:
                stopped = "cancelled"
            else:
                pending[k] = later
        if stopped:
            pending.pop(len(rungs), None)
        out = [pending[k].result() for k in sorted(pending)]
        anchor_per = anchor_at.future.result()[0]
    finally:
        work.close()
        learner.shutdown(wait=True, cancel_futures=True)
        pool.shutdown(wait=True, cancel_futures=True)
    if progress and not stopped:
        progress(total, total, "done")
    return Ladder(anchor.ref, source.ref, out, skipped, alphas, points, split.data,
                  split.split, split.n, str(ev.device), time.perf_counter() - t0,
                  float(anchor_per[0].sum() / anchor_per[2].sum()),
                  float(anchor_per[1].sum() / anchor_per[2].sum()), steps, stopped,
                  split.task)


def _run(inputs, ctx: Context, v: dict):
    return ladder(inputs, ctx.split, v["points"], ctx.device, v["batch_size"], v["steps"],
                  ctx.progress, ctx.cancel, ctx.time_limit)


def _summary(r, how: str) -> str:
    said = "; ".join(f"{x['words']} [{x['spec']}]: barrier {x['barrier']:.4f}, distance "
                     f"{x['distance']:.4f}, merged accuracy {x['merged_acc']:.4f}"
                     for x in r.rungs)
    left = "".join(f"; left out {spec}: {why}" for spec, why in r.skipped.items())
    return (f"ladder on {r.device}{how}: {said}{left}; {r.points} points on {r.n} {r.split} "
            f"samples in {r.seconds:.2f} s")


def _rows(d: dict) -> list[dict]:
    """One row per rung, the align-to-self rung last."""
    return [{"rung": i, "kind": x["kind"], "match": x["spec"], "words": x["words"],
             "barrier": x["barrier"], "distance": x["distance"],
             "distance_before": x["distance_before"], "merged_acc": x["merged_acc"],
             "merged_loss": x["merged_loss"], "mid_acc": x["mid_acc"],
             "loss_range": x["loss_range"], "max_output_diff": x["max_output_diff"],
             "reason": x["reason"]} for i, x in enumerate(d["rungs"])]


def markdown(d: dict) -> str:
    """The ladder as a table for a page: each rung's numbers (4 decimals: the align-to-self
    rung reads 0.0000 and 0.0000) and its reason the function is unchanged."""
    lines = ["| rung | `--match` | barrier (nats) | distance (L2) | merged accuracy | why the "
             "function is unchanged |", "|---|---|---|---|---|---|"]
    for x in d["rungs"]:
        words = f"**{x['words']}**" if x["kind"] == "self" else x["words"]
        lines.append(f"| {words} | `{x['asked']}` | {x['barrier']:.4f} | {x['distance']:.4f} "
                     f"| {x['merged_acc']:.4f} | {x['reason']} |")
    left = "".join(f"\n\nLeft out `{spec}`: {why}." for spec, why in d["skipped"].items())
    return ("\n".join(lines) + f"\n\nBarriers on {d['points']} points of the {d['split']} split "
            f"({d['n']} samples); merged accuracy: the simple average at 0.5; the anchor alone: "
            f"{d['anchor_acc']:.4f}." + left)


PATTERNS = ("", "/", ".")  # per panel, so the bars also differ in grey
SELF_NAME = "align-to-self (the anchor matched onto itself)"
PANELS = (  # key, panel title, axis title (None: rotviz.plots.style.BARRIER), format
    ("barrier", "loss barrier", None, "{:.4f}"),
    ("distance", "distance to the anchor", "Euclidean distance after matching (L2 norm)",
     "{:.4f}"),
    ("merged_acc", "merged accuracy (simple, 0.5)", "test accuracy of the merge (fraction, 0-1)",
     "{:.4f}"),
)


def rung_label(r: Mapping) -> str:
    """A rung's row label: its words over its matching SPEC."""
    return f"{r['words']}<br>--match {r['asked']}"


def ladder_figure(d: Mapping, style: Style | None = None, title: str | None = None):
    """Horizontal bars per rung (a `Ladder.to_dict()`): each metric in its own panel and
    colour, the align-to-self rung in black; hovering a bar shows the rung's reason the
    function is unchanged. The accuracy panel marks the anchor's own; its axis spans 0-1 (a
    `style.accuracy_range` replaces it)."""
    import textwrap

    from plotly.subplots import make_subplots

    from rotviz.plots import style as look

    style = style or Style()
    rungs = list(d["rungs"])
    labels = [rung_label(r) for r in rungs]
    fig = make_subplots(rows=1, cols=len(PANELS), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[p[1] for p in PANELS])
    for col, (key, name, axis, fmt) in enumerate(PANELS, start=1):
        axis = axis or look.BARRIER
        for is_self in (False, True):
            idx = [i for i, r in enumerate(rungs) if (r["kind"] == "self") == is_self]
            if not idx:
                continue
            values = [float(rungs[i][key]) for i in idx]
            fig.add_bar(
                y=[labels[i] for i in idx], x=values, orientation="h",
                name=SELF_NAME if is_self else name,
                legendgroup="self" if is_self else key, showlegend=not is_self or col == 1,
                marker_color="#000000" if is_self else look.color(col - 1),
                marker_pattern_shape="x" if is_self else PATTERNS[col - 1],
                text=[fmt.format(v) for v in values], textposition="outside",
                cliponaxis=False, customdata=["<br>".join(textwrap.wrap(rungs[i]["reason"], 60))
                                              for i in idx],
                hovertemplate=f"%{{y}}<br>{name}: %{{x:.4f}}<br><br>Why the function is "
                              "unchanged:<br>%{customdata}<extra></extra>", row=1, col=col)
        fig.update_xaxes(title_text=axis, row=1, col=col, rangemode="tozero")
    if d.get("anchor_acc") is not None:
        fig.add_vline(x=float(d["anchor_acc"]), line_dash="dash", line_color=look.GREY,
                      row=1, col=len(PANELS))
        fig.add_scatter(x=[None], y=[None], mode="lines", name="the anchor's own accuracy",
                        line={"dash": "dash", "color": look.GREY})
    lo, hi = style.accuracy_range or (0.0, 1.0)
    fig.update_xaxes(range=[lo, lo + (hi - lo) * 1.15], row=1, col=len(PANELS))
    fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=labels)
    look.finish(fig, title or "The symmetry ladder: what each larger group of symmetries buys",
                look.BARRIER, "rung (the group grows downwards)", "measure", style.font_size,
                height=230 + 56 * len(rungs))
    fig.update_yaxes(title_standoff=8, automargin=True, row=1, col=1)
    fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -70 / (56 * len(rungs)
                                                                             + 80), "x": 0},
                      bargap=0.3, margin={"t": 90, "b": 120})
    return fig


RECORD = register(Measurement(
    "ladder", "Symmetry ladder",
    "barrier, distance and merged accuracy as the matching group grows, one rung per "
    "matching, and the anchor aligned to itself",
    _run, PARAMS, summary=_summary, plot=ladder_figure, rows=_rows,
    refusal="it matches the pair once per rung in memory; run it on models that fit",
    inputs=Inputs((("anchor", f"anchor model (kept fixed): {hf_cache.MODEL_HELP}"),
                   ("source", "source model, same architecture; matched onto the anchor at "
                              "each rung")), LadderPair.read, LADDER,
                  spec_help="a rung of the ladder, once per rung, in order",
                  check=_inputs_check),
    progress=True, markdown=markdown, order=170))

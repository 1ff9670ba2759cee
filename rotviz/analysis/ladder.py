"""The symmetry ladder: one pair measured as the group it is matched in grows.

Each rung is an existing matching SPEC (rotviz.match.selection), so each rung's numbers are
exactly what `rotviz barrier`, `rotviz distances` and `rotviz merge --method simple` say for
that `--match`:

| rung | SPEC | what it adds |
|---|---|---|
| none | `none` | nothing: the pair as trained |
| FFN permutation | `ffn` | FFN neuron permutations |
| + attention rotation | `ffn,attn` | per-head Q-K and V-O rotations |
| + rescale (seed paper) | `seed` | per-head Q-K and V-O scales |
| + head permutation | `seed,heads` | head order |
| + residual rotation (weight matching) | `weight` | the residual stream's map, alternated |
| activation matching | `act` | the same maps, FFN and stream picked from activations |
| learned matching | `learned` | activation matching, then its maps tuned on data |

and one more, **align-to-self**: the anchor matched onto itself with the ladder's largest
data-free matching (`weight`), whose barrier and distance are exactly 0 (rotviz.match.engine
returns the identity when matching lowers nothing).

Per rung: the barrier (the GLMC definition, on `points` alphas of the test split), the
Euclidean distance to the anchor after matching, and the accuracy of the simple merge at 0.5
(`(anchor + matched source) / 2`, rotviz.merging's `simple`). Each rung carries the one
sentence of the symmetry registry that says why its maps keep the function
(rotviz.symmetry.registry: the sentence of the symmetry the rung adds).

Work shared across rungs: one evaluator (the split on the device once), an evaluation cache
keyed by the parameters' bytes (alpha = 0 is the anchor itself, bit for bit, on every path;
align-to-self's path and merge are the anchor), learned matching starting from the
activation rung's match instead of solving it again, learned matching training on a thread
of its own (on twins of the two modules) while the main thread solves the data-free rungs,
and the evaluations (one task per parameter set) run by whichever thread is free, at most
one per core, so that no core idles while points wait and the last rung's points are split
among the threads (bench/ladder.py).

    from rotviz import load_model, measure
    from rotviz.analysis.ladder import LadderPair, ladder
    r = ladder(LadderPair.of(load_model(A), load_model(B)), split)   # or:
    r = measure("ladder", [A, B], split, match=["none", "seed", "weight"], points=21)
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from rotviz.confine import ANYWHERE, Confined
from rotviz.data.split import Split
from rotviz.limits import DEFAULT_STEPS
from rotviz.match.selection import parse_selection
from rotviz.sources.loading import Loaded
from rotviz.symmetry import registry
from rotviz.types import Progress

RUNGS = registry.LADDER
SELF = "self"  # the align-to-self rung's kind


def rung_specs(specs: Sequence[str] | None) -> tuple[str, ...]:
    """The rungs asked for, each a matching SPEC as given (checked; default `RUNGS`), each
    meaning once and in the order given."""
    out: list[str] = []
    seen: set[str] = set()
    for s in specs or RUNGS:
        label = parse_selection(s).label  # one line for an unknown SPEC
        if label not in seen:
            seen.add(label)
            out.append(str(s).strip())
    return tuple(out)


# The rungs that are the shorthands of the matching string, named as the literature does
SHORTHAND_WORDS = {"seed": "seed paper", "weight": "weight matching"}


def describe(specs: Sequence[str]) -> list[dict]:
    """Each rung's SPEC (canonical and as asked), its words, the symmetries it adds and its
    one sentence from rotviz.symmetry.registry. A rung of maps adds the maps the rung of
    maps before it lacked ("+ attention rotation"), and its sentence is the first of those
    symmetries'; a data solver's rung (activations, learned) solves for maps the rungs
    before had, and its sentence is the solver's."""
    out = []
    before: set[str] = set()
    for spec in specs:
        sel = parse_selection(spec)
        flags = list(sel.flags)
        solvers = [f for f in flags if f in registry.DATA_SOLVERS]
        if not flags:
            adds, words, reason = [], "none", registry.NONE_REASON
        elif solvers:  # learned matching from activation matching: its own sentence
            adds = solvers
            words = registry.BY_NAME[solvers[-1]].label
            if len(solvers) > 1:
                words += " (from " + ", ".join(registry.BY_NAME[f].label
                                               for f in solvers[:-1]) + ")"
            reason = registry.BY_NAME[solvers[-1]].one_sentence()
        else:
            adds = [f for f in flags if f not in before] or flags
            words = ("+ " if before and set(flags) > before else "") + " + ".join(
                registry.BY_NAME[f].label for f in adds)
            short = sel.label.split(",")
            if len(short) == 1 and short[0] in SHORTHAND_WORDS:
                words += f" ({SHORTHAND_WORDS[short[0]]})"
            reason = registry.BY_NAME[adds[0]].one_sentence()
            before = set(flags)
        out.append({"spec": sel.label, "asked": str(spec).strip(), "words": words,
                    "adds": adds, "reason": reason})
    return out


class LadderPair:
    """What `rotviz ladder` takes: the anchor and the source, and the rungs' SPECs. `read`
    checks the SPECs and finds both model folders (one line each); the models are loaded
    through `confined` when first used, so that a command's other refusals (its data, its
    outputs) come before that, and checked to be matchable as they are."""

    def __init__(self, refs: Sequence[str], specs: Sequence[str] | None = None,
                 confined: Confined = ANYWHERE) -> None:
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


class Points:
    """Evaluations by parameter values: each distinct parameter set is evaluated once (keyed
    by a hash of its bytes), whichever rung asks. Every path starts at the anchor itself
    (torch.lerp at alpha 0 is the anchor, bit for bit), and a path whose two ends are one
    model (align-to-self) is that model at every alpha, so those are look-ups. Evaluation is
    deterministic, so a look-up is what evaluating again would give."""

    def __init__(self) -> None:
        self.seen: dict[bytes, tuple] = {}
        self.hits = 0

    @staticmethod
    def key(params: dict[str, torch.Tensor]) -> bytes:
        h = hashlib.blake2b(digest_size=32)
        for name in sorted(params):
            t = params[name].detach().cpu().contiguous()
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
        return h.digest()

    def evaluate(self, ev, params: dict[str, torch.Tensor], scores: bool = False) -> tuple:
        """(per-sample loss, correct and count arrays; with `scores`, the task's scores of the
        same pass, else None) of `params`. The path's points need no scores: only the merge
        reports them."""
        key = self.key(params)
        found = self.seen.get(key)
        if found is not None and (found[1] is not None or not scores):
            self.hits += 1
            return found
        scored: list[dict[str, float]] | None = [] if scores else None
        out = (ev.per_sample(params, scored), scored[0] if scored is not None else None)
        self.seen[key] = out
        return out


def _why_not(spec: str, anchor: Loaded) -> str | None:
    """Why the pair cannot use `spec` (a residual map its architecture lacks), or None."""
    if not parse_selection(spec).residual:
        return None
    from rotviz.match.pipeline import view_of
    from rotviz.symmetry import residual as rs

    why = rs.unsupported(view_of(anchor))
    return None if why is None else f"no residual map for {anchor.spec.family}: {why}"


def _start_of(options) -> str | None:
    """The matching learned matching starts from (its SPEC label: activation matching for
    `learned`, a data-free matching for `weight,learned` and the like), or None."""
    from dataclasses import replace

    if not options.learned:
        return None
    return parse_selection(replace(options, learned=False).label).label


class _Work:
    """The ladder's evaluations, one parameter set each, shared among its threads: at most
    `slots` threads compute at once (one per torch thread of the caller: more would only
    wait for each other and for the GIL), matching and learning go before evaluation
    (learned matching is the ladder's longest chain), and a thread with nothing else to do
    evaluates what is queued, so that the last rung's points are split among them."""

    def __init__(self, slots: int) -> None:
        self.cv = threading.Condition()
        self.queue: deque[Callable[[], None]] = deque()
        self.slots = slots
        self.busy = 0
        self.closed = False

    @contextmanager
    def computing(self) -> Iterator[None]:
        """Matching or learning inside: a slot taken whatever the count."""
        with self.cv:
            self.busy += 1
        try:
            yield
        finally:
            self.done()

    def done(self) -> None:
        with self.cv:
            self.busy -= 1
            self.cv.notify_all()

    def put(self, tasks: Sequence[Callable[[], None]]) -> None:
        with self.cv:
            self.queue.extend(tasks)
            self.cv.notify_all()

    def close(self) -> None:
        """Stop every thread's `run` (what is queued is dropped)."""
        with self.cv:
            self.closed = True
            self.queue.clear()
            self.cv.notify_all()

    def run(self, until: Callable[[], bool]) -> None:
        """Evaluate queued points on this thread, each when a slot is free, until nothing is
        queued and `until()` holds (checked under `cv`: notify it when `until` may turn)."""
        while True:
            with self.cv:
                while not self.closed and not (self.queue and self.busy < self.slots) and (
                        self.queue or not until()):
                    self.cv.wait()
                if self.closed or not self.queue:
                    return
                task = self.queue.popleft()
                self.busy += 1
            try:
                task()  # never raises: a rung keeps its points' errors (_Rung.task)
            finally:
                self.done()


class _Rung:
    """One rung's evaluations: its path's points and its merge, each a task of `_Work`; the
    task that ends last makes the rung's dict (`finish`) into `future`, and the first error
    of any goes there instead."""

    def __init__(self, jobs: list[Callable[[], tuple]], finish: Callable[[list, float], dict]):
        self.jobs, self.finish = jobs, finish
        self.results: list = [None] * len(jobs)
        self.left = len(jobs)
        self.seconds = 0.0
        self.lock = threading.Lock()
        self.future: Future = Future()

    def tasks(self) -> list[Callable[[], None]]:
        return [lambda j=j: self.task(j) for j in range(len(self.jobs))]

    def task(self, j: int) -> None:
        if self.future.done():  # an earlier point failed
            return
        t1 = time.perf_counter()
        try:
            out = self.jobs[j]()
        except BaseException as e:  # noqa: BLE001 - the caller's result() raises it
            self.fail(e)
            return
        with self.lock:
            self.results[j] = out
            self.seconds += time.perf_counter() - t1
            self.left -= 1
            last = self.left == 0
        if last:
            try:
                self.future.set_result(self.finish(self.results, self.seconds))
            except BaseException as e:  # noqa: BLE001
                self.fail(e)

    def fail(self, e: BaseException) -> None:
        with self.lock:  # two points may fail at once: the first error is kept
            if not self.future.done():
                self.future.set_exception(e)


def ladder(pair: LadderPair, split: Split, points: int = 11, device: str | torch.device = "cpu",
           batch_size: int = 512, steps: int = DEFAULT_STEPS,
           progress: Progress | None = None,
           cancel: Callable[[], bool] | None = None) -> Ladder:
    """ladder(LadderPair.read([anchor, source]), split) -> Ladder

    Match the source onto the anchor with each rung's SPEC (activation and learned matching
    train on `split`'s train sibling, learned matching for at most `steps` steps), and for
    each: the barrier on `points` alphas as `rotviz barrier` measures it, the distance after
    matching, and the simple merge at 0.5 evaluated as `rotviz merge --method simple` does.
    Then the align-to-self rung. Each rung dict holds: kind (rung or self), spec, asked,
    words, adds, reason, barrier, loss_range, distance_before, distance, mid_acc (the path's
    point at 0.5), merged_acc, merged_loss, scores of the merge, loss and acc along the path,
    max_output_diff, match_seconds, seconds (its evaluations', summed).

    Matching runs in the calling thread, rung after rung (the rungs a learned rung starts
    from first, after the unmatched rung, whose points need no matching), except learned
    matching, which trains on a thread of its own, on twins of the pair's modules
    (rotviz.sources.running.twin), as soon as its start is matched: on the default pair it is half
    of the ladder's computing and its longest chain. Each rung's points and merge are
    evaluated meanwhile, one parameter set per task (`_Work`), by a worker thread on its own
    twin of the module, by the calling thread once its matching is done, and by the learned
    thread once it has learned: at most as many threads compute at once as the caller has
    torch threads, matching and learning first, so that the learned rung keeps a core and
    its own points, last, are split among the threads. On the CPU a small pair's matching
    runs on one torch thread (rotviz.match.pipeline.match_models, as for `rotviz barrier`),
    and so does each thread's evaluation (each thread keeps its own count). Evaluation is
    deterministic, so which thread evaluates a point changes no number."""
    from dataclasses import replace

    from rotviz.analysis.paths import check_path, path_points
    from rotviz.devices import pair_params, resolve_device, threads_for
    from rotviz.evaluation import Evaluator
    from rotviz.limits import STEPS
    from rotviz.match.endpoints import from_matched, unmatched
    from rotviz.match.options import LearnOptions
    from rotviz.match.pipeline import match_models
    from rotviz.match.selection import match_options
    from rotviz.merging.combine import merge_states
    from rotviz.sources.running import twin

    check_path(points, 1, split)
    STEPS.check(steps)
    t0 = time.perf_counter()
    anchor, source = pair.models()
    ev = Evaluator(anchor, split, device, batch_size)
    dev = resolve_device(device)
    pa = ev.params(anchor.state)
    cache = Points()
    alphas = np.linspace(0.0, 1.0, points).tolist()
    # and the point at 0.5 where `points` is even: path_points reads it (mid_acc)
    todo = alphas + ([] if any(abs(a - 0.5) < 1e-12 for a in alphas) else [0.5])
    rungs = describe(pair.specs)
    skipped = {r["asked"]: why for r in rungs if (why := _why_not(r["asked"], anchor))}
    rungs = [r for r in rungs if r["asked"] not in skipped]
    # align-to-self: the largest data-free matching asked for (weight, by default)
    free = [parse_selection(r["spec"]) for r in rungs]
    free = [sel for sel in free if not any(f in registry.DATA_SOLVERS for f in sel.flags)]
    self_spec = max(free, key=lambda sel: len(sel.flags)).label if free else "none"
    starts = {_start_of(o) for r in rungs if (o := match_options(r["spec"])) is not None}
    total = len(rungs) + 1
    size = pair_params(anchor.state, source.state)
    work = _Work(max(1, torch.get_num_threads()))
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
        jobs = [evaluate(lambda a=a: {k: torch.lerp(pa[k], pm[k], a) for k in pa})
                for a in todo] + [evaluate(lambda: merged, scores=True)]

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

        r = _Rung(jobs, finish)
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
    anchor_at = _Rung([evaluate(lambda: pa, scores=True)], lambda results, _: results[0])
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
            options = match_options(rung["spec"])
            if options is not None and options.learned:
                if progress:
                    progress(n, total, f"{rung['words']}: matching")
                options = replace(options, learn=LearnOptions(steps=steps))
                learning[k] = learn_later(rung, options, done.get(_start_of(options) or ""))
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
                options = match_options(self_spec)
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

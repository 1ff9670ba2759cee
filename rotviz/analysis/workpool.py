"""Evaluations shared among threads: a cache of evaluations keyed by the parameters' bytes
(`EvaluationCache`), a queue of evaluation tasks that threads take while a slot is free
(`Work`), and a group of tasks whose last one makes one result (`TaskGroup`). The symmetry
ladder (rotviz.measures.ladder) runs its rungs' points and merges on them: matching and
learning go first, and whichever thread is free evaluates, at most one per core, so that no
core idles while points wait (bench/ladder.py).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import torch


class EvaluationCache:
    """Evaluations by parameter values: each distinct parameter set is evaluated once (keyed
    by a hash of its bytes), whichever caller asks. On the ladder every path starts at the
    anchor itself (rotviz.analysis.paths.path_point at alpha 0 is the anchor, bit for bit),
    and a path whose two ends are one model (align-to-self) is that model at every alpha, so
    those are look-ups. Evaluation is deterministic, so a look-up is what evaluating again
    would give."""

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


class Work:
    """Evaluations, one parameter set each, shared among threads (the ladder's): at most
    `slots` threads compute at once (one per torch thread of the caller: more would only
    wait for each other and for the GIL), matching and learning go before evaluation
    (learned matching is the ladder's longest chain), and a thread with nothing else to do
    evaluates what is queued, so that the last tasks are split among them."""

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
                task()  # never raises: a group keeps its tasks' errors (TaskGroup.task)
            finally:
                self.done()


class TaskGroup:
    """Tasks that make one result (the ladder: one rung's path points and its merge), each a
    task of `Work`; the task that ends last makes the result (`finish`, from every task's
    result and their seconds summed) into `future`, and the first error of any goes there
    instead."""

    def __init__(self, jobs: list[Callable[[], tuple]], finish: Callable[[list, float], Any]):
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


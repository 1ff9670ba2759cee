"""The app's runtime, one per server process: its caches, its per-model locks, its start-up
and the computations run through them (no widgets here but a spinner).

- Caches: results (plain data, a copy for each caller), matched sources and loaded models
  (shared, never modified) live in `rotviz.app.cache.ResultCache`s keyed by a hash of the
  configuration; splits are `st.cache_resource`. Results compute outside any
  Streamlit-cached function, so a long computation can show its progress and be stopped,
  and only finished results are stored (`compute`).
- Starting up: before the first visitor's run, the launcher's thread (rotviz/ui/boot.py)
  computes the Models page's cards for the pair the app opens on (`opening_cards`).
- Per-model locks: evaluating parameter sets through `torch.func.functional_call` swaps
  tensors on the shared module for the duration of a call, so two sessions must not run a
  model at the same moment (`using`).
- The warm-up's locks (`_WARMING`, `_AHEAD`): rotviz/ui/run.py's `warm_up` holds them while
  it gets the next page ready; scripts wait for `_WARMING` before they import the engine.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import streamlit as st

from rotviz import app
from rotviz.app import Progress, cache
from rotviz.app import roots as app_roots
from rotviz.errors import RotvizError

SMALL_PAIR = 5_000_000  # parameters in the pair: below this, pages compute without a click


# What the current script run's open progress box counts (results computed, results from the
# cache), and what started the computation the next box shows ("run", "open" or None). Context
# variables: each session's script runs in its own thread, so no two sessions share them.
_TALLY: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar(
    "rotviz_tally", default=None)
# whether this run of a page has shown the note on a pair read block by block (require_pair)
_SIZED_SHOWN: contextvars.ContextVar[bool] = contextvars.ContextVar("rotviz_sized_shown",
                                                                    default=False)
_TRIGGER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "rotviz_trigger", default=None)


@st.cache_resource(show_spinner=False)
def _locks() -> tuple[threading.Lock, dict[str, threading.RLock]]:
    return threading.Lock(), {}


@contextlib.contextmanager
def using(*refs: str) -> Iterator[None]:
    """Hold the locks of these models (sorted: no deadlock) while running them."""
    master, table = _locks()
    with master:
        locks = [table.setdefault(r, threading.RLock()) for r in sorted(set(refs))]
    with contextlib.ExitStack() as stack:
        for lock in locks:
            stack.enter_context(lock)
        yield


@st.cache_resource(show_spinner=False)
def _stores() -> dict[str, cache.ResultCache]:
    """The app's caches, one per server process: results (plain data, a copy for every
    caller, keyed by the configuration's hash), matched sources and loaded models (shared,
    never modified). Computations run outside any Streamlit-cached function, so they can
    report progress to the page and be interrupted (Stop, or a changed widget); an
    interrupted or cancelled computation stores nothing. A store computes each key once:
    a second caller waits for the first (the page for the warm-up thread, say)."""
    return {"results": cache.ResultCache(256, copy=True),
            "matched": cache.ResultCache(24, copy=False),
            "models": cache.ResultCache(8, copy=False),
            "eval_models": cache.ResultCache(8, copy=False)}


@st.cache_resource(max_entries=8, show_spinner=False)
def split(data: str, seed: int, n: int, ref: str):
    """The test split (first `n` examples when n > 0) as model `ref` reads it, shared
    read-only."""
    return app.load_test_split(data, seed, n, AppResources().load_eval(ref))


class AppResources(app.Resources):
    """rotviz.app's computations get their models, splits and matched sources from the
    app's caches (shared by every session), and hold the models' locks while running them."""

    def load(self, ref: str):
        app_roots.resolve_choice(ref)  # checked on every call, cached or not
        stores = _stores()
        loaded = stores["models"].get_or_compute(ref, lambda: app.load_full(ref))
        stores["eval_models"].discard(ref)  # the full model stands in for it from now on
        return loaded

    def load_eval(self, ref: str):
        app_roots.resolve_choice(ref)
        stores = _stores()
        if ref in stores["models"]:  # the full model computes the same numbers
            return stores["models"].get_or_compute(ref, lambda: app.load_full(ref))
        return stores["eval_models"].get_or_compute(ref, lambda: app.load_eval(ref))

    def split(self, data: str, seed: int, n: int, ref: str):
        return split(data, seed, n, ref)

    def using(self, *refs: str):
        return using(*refs)

    def remember(self, key: str, compute: Callable[[], Any]) -> Any:
        return _stores()["matched"].get_or_compute(key, compute)


def resources() -> AppResources:
    """The app's `rotviz.app.Resources`, once the warm-up (if one runs) has finished."""
    _ready()
    return AppResources()


# ---- warming up, after the first paint ---------------------------------------------------------


# Held while a warm-up thread imports and loads; scripts wait for it (`_ready`) before they
# import the engine or load, so two threads never import the same modules at once. A module
# global (one per server process), so that clearing Streamlit's caches cannot replace it.
_WARMING = threading.Lock()
# Held while a warm-up thread computes ahead (after `_WARMING`); pages never wait for it (a
# page asking for a result under way waits for that result only), tests do.
_AHEAD = threading.Lock()



def default_pair(roots: tuple[str, ...]) -> tuple[str, str]:
    """The pair the app opens on (rotviz.app.roots.default_pair), under these roots."""
    return app_roots.default_pair([Path(r) for r in roots])


def opening_cards(seed: int = 0, n_eval: int = 0) -> list[dict]:
    """The Models page's two cards for the pair the app opens on (the sidebar's defaults: the
    default pair, its card's data, seed 0, the whole test split), computed into the results
    cache as the page computes them. The launcher's start-up thread calls it before the
    browser has connected (rotviz/ui/boot.py); a visitor whose URL chose otherwise computes
    their own. Only for a small pair read whole (as `warm_up`): nothing otherwise."""
    roots = tuple(str(r) for r in app_roots.model_roots())
    anchor, source = default_pair(roots)
    res = AppResources()
    if not anchor or not source or not 0 < _params_in(res, (anchor, source)) <= SMALL_PAIR \
            or _sized(anchor, source, 0)[0]:
        return []
    data = app_roots.auto_data(anchor)[0]  # the sidebar's "auto"
    return [_compute(res, "card", {"ref": ref, "data": data, "seed": seed, "n_eval": n_eval})
            for ref in (anchor, source)]


def _ready() -> None:
    """Wait for a running warm-up (with a spinner), so this script thread does not import
    the modules the warm-up is importing."""
    busy = _WARMING
    if not busy.locked():
        return
    with st.spinner("Loading the models (the first time after the app started)...",
                    show_time=True):
        with busy:
            pass


def residual_why(ref: str, sized: bool = False) -> str | None:
    """Why this model's residual stream cannot be matched (e.g. a tied output head), or
    None. Asked of the anchor: both models of a pair share the architecture. At size, of
    its skeleton (no weights loaded)."""
    _ready()
    return _residual_why(ref, sized)


@st.cache_data(max_entries=64, show_spinner=False)
def _residual_why(ref: str, sized: bool = False) -> str | None:
    try:
        return app.residual_why(AppResources(), ref, sized)
    except RotvizError:
        return None



def compute(kind: str, cfg: dict, progress: Progress | None = None,
            cancel: Callable[[], bool] | None = None) -> Any:
    """The result of computation `kind` (rotviz.app.COMPUTE) for a configuration, from the
    cache when possible (keyed by a hash of kind and configuration; every caller gets its own
    copy). While it computes, `progress(done, total, message)` hears from the long steps
    (matching); `cancel()` returning True stops a training measurement (`stopper`), and
    nothing of it is cached. Inside a `progress` box, the box counts what came from the
    cache and what was computed."""
    tally = _TALLY.get()
    ran: list[bool] = []  # whether this call computed it (not the cache, nor another caller)
    out = _compute(resources(), kind, cfg, progress, cancel, ran)
    if tally is not None:  # waited for another caller (the start-up thread): from the cache
        tally["computed" if ran else "cached"] += 1
    held = out.get("at_size") if isinstance(out, dict) else None
    if tally is not None and held:  # read block by block: the box says what it held
        tally["held"] = max(tally.get("held", 0), held.get("held") or 0)
    return out


def _compute(res: AppResources, kind: str, cfg: dict, progress: Progress | None = None,
             cancel: Callable[[], bool] | None = None, ran: list[bool] | None = None) -> Any:
    cfg = keyed(kind, cfg)
    key = cache.config_hash({"kind": kind, **cfg})

    def run() -> Any:
        if ran is not None:
            ran.append(True)
        _pin_threads(res, cfg)
        return app.run(kind, res, json.loads(json.dumps(cfg)), progress, cancel)

    return _stores()["results"].get_or_compute(key, run)


_THREADS: list[int] = []  # torch's own thread count, read before the app first changes it


def _pin_threads(res: AppResources, cfg: dict) -> None:
    """One torch thread for a small pair's computation, torch's own count otherwise. A
    small model's many small operations cost more to hand out to a second thread than they
    gain (weight matching on the default pair: about 2x slower with two threads on a 2-core
    machine, bench/RESULTS.md, app). Threads split the same work, so no number changes. Set
    in the thread that computes (OpenMP keeps the count per thread)."""
    import torch

    if not _THREADS:
        _THREADS.append(torch.get_num_threads())
    refs = [cfg[k] for k in ("anchor", "source", "ref") if cfg.get(k)]
    small = 0 < _params_in(res, refs) <= SMALL_PAIR  # 0: unreadable, the computation says so
    want = 1 if small else _THREADS[0]
    if torch.get_num_threads() != want:
        torch.set_num_threads(want)


def keyed(kind: str, cfg: dict) -> dict:
    """The configuration as the caches key it: canonical, and a registered measurement's
    parameters that hold their defaults left out (the record fills them in as it runs), so
    that a section drawing every parameter and the warm-up giving only some ask for, and
    find, one result."""
    from rotviz.measures import measurements

    cfg = cache.canonical(cfg)
    record = next((m for m in measurements() if m.name == kind), None)
    if record is not None and isinstance(cfg.get("params"), dict):
        defaults = {p.name: cache.canonical(p.default) for p in record.parameters()}
        cfg["params"] = {k: v for k, v in cfg["params"].items()
                         if k not in defaults or v != defaults[k]}
    return cfg


def is_cached(kind: str, cfg: dict) -> bool:
    """Whether `compute(kind, cfg)` would come straight from the cache."""
    cfg = keyed(kind, cfg)
    return cache.config_hash({"kind": kind, **cfg}) in _stores()["results"]


def _params_in(res: AppResources, refs) -> int:
    """Parameters in the models `refs` together, from their safetensors headers where they
    have them (app.params_in: nothing loaded); 0 when one cannot be read."""
    try:
        return sum(app.params_in(res, r) for r in refs)
    except RotvizError:
        return 0


@st.cache_data(ttl=60, show_spinner=False)
def _sized(anchor: str, source: str, max_memory: int) -> tuple[bool, int | None, int | None]:
    if not anchor or not source:
        return False, None, None
    try:
        return app.at_size(resources(), {"anchor": anchor, "source": source,
                                         "max_memory": max_memory})
    except RotvizError:  # the page's own check says what is wrong with the pair
        return False, None, None


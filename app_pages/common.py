"""Streamlit helpers shared by the app's pages (this file is not a page): the UI layer.

The computations themselves live in `rotviz.app` (no Streamlit); this file gives them the
app's caches and locks, shows their progress and lets the user stop them.

- The sidebar (model pair, data, seed, device, presenter mode), bound to the URL; app_main.py
  draws it, then runs the page picked in its `st.navigation`.
- Caches, one per server process: results (plain data, a copy for each caller), matched
  sources and loaded models (shared, never modified) live in `rotviz.app.cache.ResultCache`s
  keyed by a hash of the configuration; splits are `st.cache_resource`. Results compute
  outside any Streamlit-cached function, so a long computation can show its progress and be
  stopped, and only finished results are stored.
- Starting up: before the first visitor's run, the launcher's thread (app_pages/boot.py)
  computes the Models page's cards for the pair the app opens on (`opening_cards`).
- Warming up: once a page has painted, a background thread imports the engine, loads the
  pair and computes the Barrier page's default curves, for the next page (`warm_up`).
- Per-model locks: evaluating parameter sets through `torch.func.functional_call` swaps
  tensors on the shared module for the duration of a call, so two sessions must not run a
  model at the same moment.
- Progress boxes with a Stop button, badges for the function check, export buttons,
  presenter styling.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from rotviz import app
from rotviz.app import Progress, cache, specs, summaries
from rotviz.app import export as app_export
from rotviz.app import roots as app_roots
from rotviz.devices import (
    device_badge,
    device_choices,
    device_kind,
    device_note,
    device_summary,
    surely_cpu_only,
)
from rotviz.errors import RotvizError

PAIR_NAMES = {"default": "two seeds", "finetuned": "two fine-tunes",
              "lineage": "fine-tunes of two seeds", "gpt2": "GPT-2 pair",
              "nlp-mlm": "RoBERTa MLMs", "nlp-cls": "RoBERTa topic classifiers",
              "nlp-tok": "RoBERTa code taggers"}
SMALL_PAIR = 5_000_000  # parameters in the pair: below this, pages compute without a click
PRESENTER_FONT = 22
FONT = 14


# ---- the sidebar -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What the sidebar chose; every page reads it."""

    anchor: str
    source: str
    data: str
    seed: int
    n_eval: int  # 0 = the whole test split
    device: str  # resolved: cpu, cuda, mps
    presenter: bool
    error: str | None = None  # a message when the pair cannot be used
    acc_fixed: bool = False  # accuracy axes on the fixed 0-1 scale (else they follow the data)
    max_memory: int = 0  # bytes the pair may take in memory (0: what the machine has free)

    @property
    def font(self) -> int:
        return PRESENTER_FONT if self.presenter else FONT

    def acc_range(self, values) -> list[float]:
        """One accuracy axis range for charts that are compared (rotviz.plots.style)."""
        from rotviz.plots.style import acc_range

        return acc_range(values, self.acc_fixed)

    def acc_axis(self) -> list[float] | None:
        """The range a single chart's accuracy axis gets: the fixed 0-1 scale, or None (the
        chart follows its own data)."""
        from rotviz.plots.style import ACC_FIXED

        return list(ACC_FIXED) if self.acc_fixed else None

    def base(self) -> dict[str, Any]:
        """The part of every run's configuration that the sidebar decides."""
        base = {"anchor": self.anchor, "source": self.source, "data": self.data,
                "seed": self.seed, "n_eval": self.n_eval, "device": self.device}
        if self.max_memory:  # only a budget the user set: results keep their keys otherwise
            base["max_memory"] = self.max_memory
        return base

    @property
    def sized(self) -> tuple[bool, int | None, int | None]:
        """(read block by block, what the pair needs in memory, the budget), in bytes."""
        return _sized(self.anchor, self.source, self.max_memory)


@st.cache_data(ttl=60, show_spinner=False)
def model_choices(roots: tuple[str, ...]) -> list[str]:
    """Zoo entries first, then model folders under the roots."""
    return app_roots.zoo_refs() + app_roots.discover(map(Path, roots))


@st.cache_data(ttl=60, show_spinner=False)
def data_found(roots: tuple[str, ...]) -> list[str]:
    """The user's data files and folders under the roots (rotviz.app.roots.discover_data)."""
    return app_roots.discover_data(map(Path, roots))


def _typed(key: str) -> str:
    """A sidebar text box's value before it is drawn (its state, or the URL)."""
    value = st.session_state.get(key)
    if value is None:
        value = st.query_params.get(key, "")
    return str(value).strip()


def default_pair(roots: tuple[str, ...]) -> tuple[str, str]:
    return app_roots.default_pair([Path(r) for r in roots])


def sidebar(before_torch: Callable[[], None] | None = None) -> Setup:
    """Draw the sidebar and return the setup. Every widget is mirrored in the URL.
    `before_torch()` runs before the device picker, the first widget that needs torch
    (app_main.py passes the wait for the launcher's start-up thread, app_pages/boot.py): the
    widgets above it are drawn, and shown, while torch loads."""
    sb = st.sidebar
    roots = tuple(str(r) for r in app_roots.model_roots())
    choices = model_choices(roots)
    try:
        pair = default_pair(roots)
    except RotvizError as e:
        pair = (choices[0], choices[-1]) if choices else ("", "")
        sb.error(str(e))
    for ref in pair:
        if ref and ref not in choices:
            choices = [ref, *choices]
    sb.markdown("### Model pair")
    presets = {k: v for k, v in app_roots.zoo_pairs().items() if all(r in choices for r in v)}
    if len(presets) > 1:

        def use_preset() -> None:
            name = st.session_state.get("pair_preset")
            if name in presets:
                st.session_state["anchor"], st.session_state["source"] = presets[name]
            st.session_state["pair_preset"] = None

        sb.pills("Zoo pairs", list(presets), format_func=lambda k: PAIR_NAMES.get(k, k),
                 key="pair_preset", on_change=use_preset,
                 help="Set both models to one of the zoo's pairs.")
    typed = {k: _typed(k) for k in ("anchor_path", "source_path", "data_path")}
    anchor = sb.selectbox(
        "Anchor (model 1, stays fixed)", choices,
        index=choices.index(pair[0]) if pair[0] in choices else 0,
        format_func=app_roots.model_label, key="anchor", bind="query-params",
        disabled=bool(typed["anchor_path"]),
        help="The model the other one is moved towards: the first model of `rotviz barrier "
             "ANCHOR SOURCE`. Zoo entries, folders under the model roots "
             f"({app_roots.ENV_ROOTS}) and, when the Hugging Face cache lies under a root, its "
             "models (hf-cache:ORG/NAME[@REVISION]). A folder typed below replaces it.",
    )
    source = sb.selectbox(
        "Source (model 2, gets matched)", choices,
        index=choices.index(pair[1]) if pair[1] in choices else min(1, len(choices) - 1),
        format_func=app_roots.model_label, key="source", bind="query-params",
        disabled=bool(typed["source_path"]),
        help="The model that is permuted, rotated and rescaled onto the anchor: the second "
             "model of `rotviz barrier ANCHOR SOURCE`. A folder typed below replaces it.",
    )
    error = None
    with sb.expander("Use a folder instead", expanded=any(typed.values())):
        st.caption("Folders under: " + ", ".join(str(r) for r in app_roots.model_roots())
                   + "; or ORG/NAME[@REVISION], a model of the local Hugging Face cache "
                   "when the cache lies under one of them (a folder of that path wins)")
        a_path = st.text_input("anchor folder", key="anchor_path", bind="query-params")
        s_path = st.text_input("source folder", key="source_path", bind="query-params")
        d_path = st.text_input("data (KIND:PATH, e.g. csv:data/train.csv)", key="data_path",
                               bind="query-params",
                               help="csv:, tsv:, jsonl:, conll:, text: files, hf: datasets "
                                    "folders, imagefolder: folders, under the roots")
    try:
        if a_path.strip():
            anchor = app_roots.resolve_choice(a_path)
            sb.caption(f":material/folder_open: anchor: `{anchor}`")
        if s_path.strip():
            source = app_roots.resolve_choice(s_path)
            sb.caption(f":material/folder_open: source: `{source}`")
    except RotvizError as e:
        error = str(e)
    sb.markdown("### Data")
    auto, why = app_roots.auto_data(anchor) if anchor else ("digits", "the default")
    data_choices = ["auto", *app_roots.BUILTIN_DATA, *data_found(roots)]
    data = sb.selectbox("Data source", data_choices, key="data", bind="query-params",
                        format_func=lambda d: f"auto ({auto}, {why})"
                        if d == "auto" else d, disabled=bool(typed["data_path"]),
                        help="Evaluated on its fixed, seeded test split: the built-in sets and "
                             "the data files and folders found under the roots. Text goes "
                             "through each model's own tokenizer, images through its image "
                             "processor.")
    data = auto if data == "auto" else data
    if d_path.strip():
        try:
            data = app_roots.resolve_data(d_path)
            sb.caption(f":material/description: data: `{data}`")
        except RotvizError as e:
            error = error or str(e)
    seed = int(sb.number_input("Seed (data split and random draws)", 0, 10_000, 0, key="seed",
                               bind="query-params"))
    n_eval = int(sb.number_input("Test examples to evaluate (0 = all)", 0, 100_000, 0, step=50,
                                 key="n", bind="query-params"))
    sb.markdown("### Device")
    if before_torch is not None and not surely_cpu_only():
        before_torch()  # the picker asks torch what this machine has
    choice = sb.selectbox("Compute on", device_choices(), key="device",
                          bind="query-params", help="auto picks cuda, then mps, then cpu.")
    device = device_kind(choice)
    sb.markdown(f":material/memory: **{device_badge(device_summary(device))}**")
    note = device_note(device)
    if note:
        sb.caption(note)
    budget = float(sb.number_input(
        "Memory budget (GB, 0 = what is free now)", 0.0, 100_000.0, 0.0, step=1.0,
        key="mem_gb", bind="query-params",
        help="A pair that needs more than this in memory is read block by block: the "
             "barrier, slices and elementwise merges run as `--max-memory` runs them on the "
             "command line, and the other views say why they are off."))
    sb.markdown("### Display")
    acc_fixed = sb.toggle("Accuracy axes on the fixed 0-1 scale", key="acc01",
                          bind="query-params",
                          help="Off: each accuracy axis spans its data, so curves near 0.15 "
                               "are not flat lines. On: every accuracy axis spans 0-1, to "
                               "compare figures at a glance. Charts shown side by side to be "
                               "compared always share one scale.")
    presenter = sb.toggle("Presenter mode", key="present", bind="query-params",
              help="Wide layout, large fonts, controls hidden. Turn off with the button on top "
                   "or by removing present from the URL.")
    setup = Setup(anchor or "", source or "", data, seed, n_eval, device, bool(presenter),
                  error, bool(acc_fixed), int(budget * 1e9))
    st.session_state["_setup"] = setup
    return setup


def presenting() -> bool:
    """Presenter mode, known before the sidebar's toggle is drawn (from its state or the URL)."""
    if "present" in st.session_state:
        return bool(st.session_state["present"])
    return st.query_params.get("present", "").lower() in ("true", "1", "yes")


def setup() -> Setup:
    """The setup the sidebar drew in this run (app_main.py draws it before the page)."""
    _SIZED_SHOWN.set(False)  # a page calls this first: its run shows the at-size note once
    s = st.session_state.get("_setup")
    return s if s is not None else sidebar()


def presenter_style(presenter: bool) -> None:
    """Large fonts and no controls while presenting, with a way back."""
    if not presenter:
        return
    st.html(
        """<style>
        html, body, [data-testid="stMarkdownContainer"] p, li { font-size: 22px !important; }
        h1 { font-size: 3rem !important; } h2 { font-size: 2.3rem !important; }
        [data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"],
        [data-testid="stForm"], [data-testid="stExpander"],
        [data-testid="stStatusWidget"] { display: none !important; }
        .block-container { max-width: 100% !important; padding: 1rem 2rem !important; }
        </style>"""
    )

    def leave() -> None:
        st.session_state["present"] = False

    st.button("Leave presenter mode", on_click=leave, icon=":material/close_fullscreen:",
              type="tertiary")


# ---- caches ----------------------------------------------------------------------------------


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


def warm_up(s: Setup) -> None:
    """After a page has painted, get ready for the next one in a background thread: import
    the engine's modules (scipy, the solvers), load the pair as the computations take it
    (`AppResources.load_eval`), then compute the Barrier page's default curves into the
    results cache (the same computation the page would run; it finds them there, or waits
    for the one under way). Once per pair, and only for a small pair (the pages compute at
    once for those). A failure leaves nothing behind: the page that needs the result then
    computes it and says what went wrong."""
    if not s.anchor or not s.source or params_in_pair(s) > SMALL_PAIR or s.sized[0]:
        return
    ahead = app.barrier_defaults(s.base(), _residual_why(s.anchor))
    if all(is_cached("barrier", cfg) for cfg in ahead):
        return  # warmed up before: nothing to get ready
    busy = _WARMING
    if not busy.acquire(blocking=False):  # one warm-up at a time
        return

    def work() -> None:
        try:
            app.warm_up()
            loaded = [AppResources().load_eval(ref) for ref in (s.anchor, s.source)]
            scored = app.scored_pair(*loaded)
        except Exception:  # noqa: BLE001 - the page's own load reports it
            return
        finally:
            busy.release()  # pages go on from here; what follows shares the caches' locks
        if not scored:  # no loss on this pair (a headless one, say): no curve to compute
            return
        with _AHEAD:
            try:
                for cfg in ahead:
                    _compute(AppResources(), "barrier", cfg)
            except Exception:  # noqa: BLE001 - the Barrier page computes again and reports it
                pass

    threading.Thread(target=work, name="rotviz-warm-up", daemon=True).start()


def opening_cards(seed: int = 0, n_eval: int = 0) -> list[dict]:
    """The Models page's two cards for the pair the app opens on (the sidebar's defaults: the
    default pair, its card's data, seed 0, the whole test split), computed into the results
    cache as the page computes them. The launcher's start-up thread calls it before the
    browser has connected (app_pages/boot.py); a visitor whose URL chose otherwise computes
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


def offered_specs(s: Setup, choices) -> tuple[list[str], str | None]:
    """The SPECs this pair can use, and why residual ones are missing (None when offered)."""
    why = residual_why(s.anchor, s.sized[0]) if s.anchor else None
    return specs.offered(choices, why), why


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
    cfg = cache.canonical(cfg)
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


def is_cached(kind: str, cfg: dict) -> bool:
    """Whether `compute(kind, cfg)` would come straight from the cache."""
    cfg = cache.canonical(cfg)
    return cache.config_hash({"kind": kind, **cfg}) in _stores()["results"]


def params_in_pair(s: Setup) -> int:
    return _params_in(resources(), (s.anchor, s.source))


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


def should_run(page: str, submitted: bool, s: Setup) -> bool:
    """Compute when Run was pressed, once it has been in this session, or at once for a
    small pair (the default pair shows results on first paint, and says so in a note);
    never right after the user stopped a run on this page, until Run is pressed again.
    What started the run is what the next progress box reports (`progress`)."""
    flag, stopped = f"_ran_{page}", f"_stopped_{page}"
    if submitted:
        st.session_state[flag] = True
        st.session_state[stopped] = False
    if st.session_state.get(stopped):
        st.warning("Stopped. Nothing from the stopped run was kept or cached.",
                   icon=":material/stop_circle:")
        return False
    if submitted or st.session_state.get(flag):
        _TRIGGER.set("run" if submitted else None)
        return True
    n = params_in_pair(s)
    if n > SMALL_PAIR:
        return False
    _TRIGGER.set("open")
    st.caption(f":material/bolt: **Computed on open**: this pair is small ({n:,} parameters, "
               f"at most {SMALL_PAIR:,}), so the page computes its settings without a click. "
               "Change them and press **Run** to compute others; a larger pair waits for Run.")
    return True


def section_wanted(page: str, submitted: bool) -> bool:
    """For a section that computes only on Run (the Landscape and Training pages): once Run
    was pressed in this session (and again on every rerun, from the cache), never on first
    paint, and not right after the user stopped it; says which in a note."""
    flag, stopped = f"_ran_{page}", f"_stopped_{page}"
    if submitted:
        st.session_state[flag] = True
        st.session_state[stopped] = False
    if st.session_state.get(stopped):
        st.warning("Stopped. Nothing from the stopped run was kept or cached; press Run to "
                   "start again.", icon=":material/stop_circle:")
        return False
    if not st.session_state.get(flag):
        st.info("Press **Run** to compute this section.", icon=":material/play_arrow:")
        return False
    _TRIGGER.set("run" if submitted else None)
    return True


def stopper() -> Callable[[], bool]:
    """A `cancel()` for a training measurement (rotviz.measures' `Context.cancel`): True once
    Streamlit has been asked to stop or rerun this script (the Stop button, Streamlit's own
    Stop, a changed widget). Streamlit interrupts a script only where it touches the page;
    this lets a training loop end at its next step even between progress updates. Read in
    the thread that computes; False when there is no script (a test calling the library)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    requests = getattr(ctx, "script_requests", None)

    def cancel() -> bool:
        state = getattr(requests, "_state", None)  # Streamlit's own: CONTINUE while running
        return state is not None and getattr(state, "name", "CONTINUE") != "CONTINUE"

    return cancel


def _request_stop(page: str) -> None:
    st.session_state[f"_stopped_{page}"] = True


class Steps:
    """What `progress` yields: `step(message)` starts the next of `steps` units of work;
    `step.detail(done, total, message)` (a `Progress` callback for the library) moves the
    bar within the current unit.

    Every update touches Streamlit, which is where Streamlit interrupts a running script
    when the user presses Stop or changes a widget. Detail updates are sent at most every
    `EVERY` seconds (and always at the end of a loop), so a long loop such as learned
    matching stays interruptible within one of its steps without flooding the page."""

    EVERY = 0.15

    def __init__(self, label: str, steps: int, box, bar, stop_slot=None,
                 stop_page: str | None = None):
        self.label, self.steps = label, max(steps, 1)
        self.box, self.bar = box, bar
        self.stop_slot, self.stop_page = stop_slot, stop_page
        self.done = 0
        self.message = ""
        self.updates = 0  # detail updates sent to the page
        self._last = 0.0
        self._stop_shown = False

    def __call__(self, message: str) -> None:
        self.message = message
        self.box.update(label=f"{self.label}: {message}")
        self.bar.progress(min(1.0, self.done / self.steps), text=message)
        self.done += 1

    def detail(self, done: int, total: int, message: str) -> None:
        now = time.perf_counter()
        if now - self._last < self.EVERY and done < total:
            return
        self._last = now
        self._show_stop()
        unit = max(self.done - 1, 0)
        frac = (unit + min(max(done / max(total, 1), 0.0), 1.0)) / self.steps
        text = f"{self.message} · {message} [{done}/{total}]" if self.message else message
        self.box.update(label=f"{self.label}: {text}")  # readable while the box is closed
        self.bar.progress(min(1.0, frac), text=text)
        self.updates += 1

    def _show_stop(self) -> None:
        """A Stop button under the box once real work starts (results from the cache never
        show it). A click ends this run at its next update, and the page then waits for
        Run instead of starting over."""
        if self._stop_shown:
            return
        self._stop_shown = True
        if self.stop_slot is None or self.stop_page is None:
            return
        self.stop_slot.button(
            "Stop", key=f"stop_{self.stop_page}", on_click=_request_stop,
            args=(self.stop_page,), icon=":material/stop_circle:",
            help="Stop this computation. Nothing from a stopped run is kept; press Run to "
                 "start again. (Streamlit's own Stop, top right, works too.)")


@contextlib.contextmanager
def progress(label: str, steps: int, stop: str | None = None) -> Iterator[Steps]:
    """An `st.status` box with a progress bar; yields `step` (see `Steps`). With `stop` (the
    page's name) a Stop button appears while something is being computed.

    When done, the box says what ran and how: "Run" when the user pressed Run (with a
    toast, so that a Run answered from the cache in 0.1 s visibly did something), "computed
    on open" for a small pair's first results, the seconds it took, and how many results
    were computed and how many came from the cache (`done_label`)."""
    t0 = time.perf_counter()
    trigger = _TRIGGER.get()
    _TRIGGER.set(None)  # one box reports one decision
    tally = {"cached": 0, "computed": 0}
    token = _TALLY.set(tally)
    box = st.status(label, expanded=False)
    bar = box.progress(0.0)
    slot = st.empty() if stop else None
    step = Steps(label, steps, box, bar, slot, stop)
    try:
        yield step
    except RotvizError as e:  # Streamlit's stop and rerun signals pass through untouched
        if slot is not None:
            slot.empty()
        box.update(label=f"{label}: failed", state="error", expanded=True)
        box.error(str(e))
        raise
    finally:
        _TALLY.reset(token)
    if slot is not None:
        slot.empty()
    bar.progress(1.0, text="done")
    text = done_label(time.perf_counter() - t0, tally["computed"], tally["cached"], trigger)
    if "held" in tally:
        text += (f"; read block by block, holding at most {app.gb(tally['held'])} above what "
                 "the app held")
    box.update(label=f"{label}: {text}", state="complete")
    if trigger == "run":
        st.toast(f"{label}: {text}", icon=":material/play_arrow:")


def done_label(seconds: float, computed: int, cached: int, trigger: str | None) -> str:
    """What a finished progress box says: what started it, how long it took, and how many
    results were computed or came from the cache (same settings as an earlier run, or
    computed ahead while another page was open)."""
    how = {"run": "Run: ", "open": "computed on open: "}.get(trigger or "", "")
    if cached and not computed:
        counts = (f", all {cached} from the cache (computed earlier with these settings)"
                  if cached > 1 else ", from the cache (computed earlier with these settings)")
    else:
        counts = "".join(f", {n} {what}" for n, what in ((computed, "computed"),
                                                          (cached, "from the cache")) if n)
    return f"{how}done in {seconds:.1f} s{counts}"


def guard(fn: Callable[[], Any]) -> Any:
    """Run a page body; a user error becomes a clear message instead of a traceback, and an
    unexpected one a short message with the details folded away. The app stays usable."""
    try:
        return fn()
    except RotvizError as e:
        st.error(f"{e}", icon=":material/error:")
        st.info("Pick another pair or setting in the sidebar; the rest of the app keeps working.")
    except Exception as e:  # noqa: BLE001 - a page must never take the session down
        st.error(f"This computation failed ({e.__class__.__name__}: {str(e)[:200]}). Pick "
                 "another pair or setting; if it persists, please report it with the details "
                 "below.", icon=":material/error:")
        with st.expander("Details"):
            st.exception(e)
    return None


def require_pair(s: Setup, loss: bool = True) -> bool:
    """Show why the pair cannot be used; False stops the page body. Checks the pair as the
    computations take it (rotviz.app.load_eval: no transformers import where plain torch
    computes the same logits); no page needs more. A page that evaluates no loss (`loss`
    False: the Models, Match and Spectra pages) takes a pair whose head no loss scores
    (headless, question answering, ...) and one body under two heads, with no data read;
    a page that does refuses them in one line, and says which pages take them."""
    if s.error:
        st.error(s.error, icon=":material/error:")
        return False
    if not s.anchor or not s.source:
        st.warning("Pick two models in the sidebar.")
        return False
    sized, need, limit = s.sized
    weights_only = False  # refused for want of a head a loss scores
    try:
        res = resources()
        if sized:
            app.check_pair_at_size(res, s.base(), loss)
        else:
            a, b = res.load_eval(s.anchor), res.load_eval(s.source)
            weights_only = not app.scored_pair(a, b)
            app.check_pair(a, b, res.split(s.data, s.seed, s.n_eval, s.anchor)
                           if app.needs_data(a, b, loss) else None, heads=not loss)
    except RotvizError as e:
        st.error(str(e), icon=":material/error:")
        if weights_only and loss:
            st.info(f"This page evaluates a loss. The {summaries.WEIGHT_PAGES} compare this "
                    "pair by its weights; the **Models** page says what each model's head "
                    "allows.", icon=":material/info:")
        else:
            st.info("Pick another pair or data source in the sidebar; the rest of the app "
                    "keeps working.")
        return False
    if sized and not _SIZED_SHOWN.get():
        _SIZED_SHOWN.set(True)
        st.info(f"**Read block by block.** This pair needs about {app.gb(need)} in memory, "
                f"over the budget of {app.gb(limit)}. What runs block by block runs as "
                "`rotviz ... --max-memory` runs it (the barrier, slices, and the elementwise "
                f"merges: {app.merges_at_size()}), matching the source "
                "block by block each time; every other view says why it is off. Each result "
                "says how much memory its run held.", icon=":material/memory:")
    return True


def unscored_why(s: Setup) -> str | None:
    """Why the sidebar's pair has no loss (a head none scores, or one body under two heads),
    for a form that offers what needs one (matching from data); None when it has one, or
    when the pair cannot be read (the page's `require_pair` says why)."""
    if not s.anchor or not s.source or s.error:
        return None
    try:
        return None if pair_scored(s) else ("no loss scores this pair, and matching from "
                                            "data evaluates one (the Models page says what "
                                            "each head allows)")
    except RotvizError:
        return None


def pair_scored(s: Setup) -> bool:
    """Whether a loss can be evaluated on the sidebar's pair (rotviz.app.scored_pair): the
    Match page measures its ablation's barriers only then. A pair read block by block is
    not loaded for it (its pages check it as they run)."""
    if s.sized[0]:
        return True
    res = resources()
    return app.scored_pair(res.load_eval(s.anchor), res.load_eval(s.source))


# ---- showing results ---------------------------------------------------------------------


def function_badge(diff: float | None, tol: float, what: str = "matched source") -> None:
    """The function-preservation check of a transform, as a pass/fail badge (icon and words,
    not colour alone), with what was compared in a caption."""
    with st.container(horizontal=True, vertical_alignment="center", gap="small"):
        if diff is None:
            st.badge("function check: not run", color="gray", icon=":material/help:")
        elif diff <= tol:
            st.badge(f"PASS · function preserved · max logit change {diff:.1e} ≤ {tol:g}",
                     color="green", icon=":material/check_circle:")
        else:
            st.badge(f"FAIL · function changed · max logit change {diff:.1e} > {tol:g}",
                     color="red", icon=":material/cancel:")
        st.caption(f"{what} vs. the model it came from, on seeded probe inputs")


def param_input(where: Any, p: Any, key: str, value: Any = None) -> Any:
    """The widget of a declared parameter (rotviz.params.Param, from a measurement's or a
    merge method's record): a slider within its `widget` range, a number input within its
    bound, a picker of its choices; labelled and explained by the record, kept in the URL."""
    value = p.default if value is None else value
    common = {"key": key, "help": p.help, "bind": "query-params"}
    if p.choices:
        return where.selectbox(p.title, list(p.choices), list(p.choices).index(value), **common)
    if p.bound is None:
        return where.text_input(p.title, str(value), **common)
    cast = int if p.bound.integer else float
    lo, hi, step = p.widget or (p.bound.lo, p.bound.hi, 1 if p.bound.integer else None)
    lo, hi = cast(lo), cast(hi)
    value = min(max(cast(value), lo), hi)
    if p.widget:
        return where.slider(p.title, lo, hi, value, cast(step), **common)
    # a small real default (a tolerance, 1e-4) reads as 0.00 in the default two decimals
    small = not p.bound.integer and 0 < abs(float(p.default)) < 0.01
    return where.number_input(p.title, lo, hi, value, None if step is None else cast(step),
                              format="%g" if small else None, **common)


def table(rows: Sequence[dict], column_config: dict | None = None) -> None:
    """A table that fits the page: every real-valued column shown to 4 significant digits,
    and a text column that holds one value in every row said once above it instead (the
    exports keep every column and every digit); `column_config` overrides."""
    same = {k: v for k, v in rows[0].items() if isinstance(v, str)} if len(rows) > 1 else {}
    same = {k: v for k, v in same.items() if all(r.get(k) == v for r in rows)}
    if same:
        st.caption(" · ".join(f"{k}: {v}" for k, v in same.items()))
    reals = {k for r in rows for k, v in r.items() if isinstance(v, float)}
    st.dataframe([{k: v for k, v in r.items() if k not in same} for r in rows],
                 hide_index=True, column_config={
                     k: st.column_config.NumberColumn(format="%.4g") for k in reals}
                 | (column_config or {}))


def chart(fig, key: str) -> None:
    """A figure exactly as exported (no Streamlit theme on top of rotviz's own style)."""
    st.plotly_chart(fig, key=key, theme=None, config={
        "displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}})


def animation(fig, key: str, name: str) -> None:
    """An animated figure (it plays with its own button and slider), with its downloads:
    HTML (plays offline), and GIF and MP4 for slides where a Chromium draws the frames (a
    second or more per frame: drawn when the button is pressed)."""
    chart(fig, key)
    formats = app_export.animation_formats()
    cols = st.columns(len(formats))
    for col, fmt in zip(cols, formats, strict=True):
        col.download_button(f"{name}.{fmt}", lambda fmt=fmt: app_export.animation_file(fig, fmt),
                            f"{name}.{fmt}", key=f"dl_anim_{key}_{fmt}", on_click="ignore",
                            icon=":material/movie:")
    if "gif" not in formats:
        st.caption("GIF and MP4 need kaleido, a Chromium, imageio and imageio-ffmpeg "
                   "(requirements.txt); HTML plays anywhere.")


def export(name: str, cfg: dict, results: Any, tables: dict[str, Sequence[dict]] | None = None,
           figures: dict[str, Any] | None = None,
           animations: dict[str, Any] | None = None) -> None:
    """Download buttons: every result as JSON and CSV, every figure as HTML (PNG, SVG and PDF
    when a Chromium and kaleido are there), every animation as HTML, and the whole run as a
    zip."""
    tables = tables or {}
    figures = figures or {}
    animations = animations or {}
    with st.expander(f"Export ({name})", icon=":material/download:"):
        rid = cache.config_hash(cfg)
        st.caption(f"Run id `{rid}` (a hash of the configuration). The URL of this page "
                   "reproduces the view.")
        cols = st.columns(4)
        cols[0].download_button("results.json", lambda: app_export.to_json(
            {"config": cfg, "results": results}), f"{name}-{rid}.json", "application/json",
            key=f"dl_{name}_json", on_click="ignore")
        for i, (tname, rows) in enumerate(tables.items()):
            cols[(i + 1) % 4].download_button(
                f"{tname}.csv", lambda rows=rows: app_export.rows_to_csv(rows),
                f"{name}-{tname}-{rid}.csv", "text/csv", key=f"dl_{name}_{tname}_csv",
                on_click="ignore")
        fcols = st.columns(4)
        fmts = app_export.static_formats()
        for i, (fname, fig) in enumerate(figures.items()):
            c = fcols[i % 4]
            c.download_button(f"{fname}.html", lambda fig=fig: app_export.figure_html(fig),
                              f"{fname}-{rid}.html", "text/html", key=f"dl_{name}_{fname}_html",
                              on_click="ignore")
            for fmt in fmts:
                c.download_button(f"{fname}.{fmt}", lambda fig=fig, fmt=fmt:
                                  app_export.figure_image(fig, fmt), f"{fname}-{rid}.{fmt}",
                                  key=f"dl_{name}_{fname}_{fmt}", on_click="ignore")
        for i, (aname, fig) in enumerate(animations.items()):
            fcols[(len(figures) + i) % 4].download_button(
                f"{aname} (animated).html", lambda fig=fig: app_export.animation_file(fig, "html"),
                f"{aname}-{rid}.html", "text/html", key=f"dl_{name}_{aname}_anim",
                on_click="ignore")
        st.download_button(
            "Whole run (zip: configuration, results, tables, figures, library versions)",
            lambda: app_export.run_zip(cfg, results, tables, figures, animations=animations),
            f"rotviz-{name}-{rid}.zip",
            "application/zip", key=f"dl_{name}_zip", on_click="ignore",
            icon=":material/folder_zip:")


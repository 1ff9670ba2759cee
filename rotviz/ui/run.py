"""Running a page's computations: whether to run (Run pressed, a small pair on open, a
stopped run), whether the sidebar's pair can be used at all, the matchings it offers, the
warm-up after the first paint, a Stop for training loops, and the guard that turns an error
into a message instead of a traceback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import streamlit as st

from rotviz import app
from rotviz.app import specs, summaries
from rotviz.errors import RotvizError
from rotviz.ui import runtime
from rotviz.ui.runtime import SMALL_PAIR, AppResources, resources
from rotviz.ui.sidebar import Setup


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
    ahead = app.barrier_defaults(s.base(), runtime._residual_why(s.anchor))
    if all(runtime.is_cached("barrier", cfg) for cfg in ahead):
        return  # warmed up before: nothing to get ready
    busy = runtime._WARMING
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
        with runtime._AHEAD:
            try:
                for cfg in ahead:
                    runtime._compute(AppResources(), "barrier", cfg)
            except Exception:  # noqa: BLE001 - the Barrier page computes again and reports it
                pass

    threading.Thread(target=work, name="rotviz-warm-up", daemon=True).start()



def offered_specs(s: Setup, choices) -> tuple[list[str], str | None]:
    """The SPECs this pair can use, and why residual ones are missing (None when offered)."""
    why = runtime.residual_why(s.anchor, s.sized[0]) if s.anchor else None
    return specs.offered(choices, why), why



def pair_matching(s: Setup, prefix: str, label: str, default: str, help: str
                  ) -> tuple[str, str]:
    """A page's one matching for B' (the SPECs this pair can use, `none` left out where any
    other is offered; `default` first when offered) and its layers to match, side by side,
    kept in the URL under `{prefix}_spec` and `{prefix}_layers`."""
    from rotviz.app import figures
    from rotviz.limits import MAX_LAYERS_TEXT

    offered, _ = offered_specs(s, specs.SPEC_CHOICES)
    choices = [sp for sp in offered if sp != "none"] or offered
    c = st.columns(2)
    spec = c[0].selectbox(label, choices, choices.index(default) if default in choices else 0,
                          format_func=figures.nice_label, key=f"{prefix}_spec",
                          bind="query-params", help=help)
    layers = c[1].text_input("Layers to match (empty = all)", "", key=f"{prefix}_layers",
                             max_chars=MAX_LAYERS_TEXT, bind="query-params")
    return spec, layers


def params_in_pair(s: Setup) -> int:
    return runtime._params_in(resources(), (s.anchor, s.source))




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
        runtime._TRIGGER.set("run" if submitted else None)
        return True
    n = params_in_pair(s)
    if n > SMALL_PAIR:
        return False
    runtime._TRIGGER.set("open")
    st.caption(f":material/bolt: **Computed on open**: this pair is small ({n:,} parameters, "
               f"at most {SMALL_PAIR:,}), so the page computes its settings without a click. "
               "Change them and press **Run** to compute others; a larger pair waits for Run.")
    return True


def ran_before(page: str) -> bool:
    """Whether Run was pressed on this page (or section) in this session."""
    return bool(st.session_state.get(f"_ran_{page}"))


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
    runtime._TRIGGER.set("run" if submitted else None)
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




def guard(fn: Callable[[], Any]) -> Any:
    """Run a page body; a user error becomes a clear message instead of a traceback, and an
    unexpected one a short message with the details folded away. The app stays usable."""
    try:
        return fn()
    except RotvizError as e:
        if not getattr(e, "shown", False):  # a failed progress box shows it already, once
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
    if sized and not runtime._SIZED_SHOWN.get():
        runtime._SIZED_SHOWN.set(True)
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

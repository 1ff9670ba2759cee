"""Showing results: progress boxes with a Stop button, badges for the function check, a
declared parameter's widget, tables, charts as exported, animations, and the export
buttons (JSON, CSV, figures, the whole run as a zip).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import streamlit as st

from rotviz import app
from rotviz.app import cache
from rotviz.app import export as app_export
from rotviz.errors import RotvizError
from rotviz.ui import runtime


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
    trigger = runtime._TRIGGER.get()
    runtime._TRIGGER.set(None)  # one box reports one decision
    tally = {"cached": 0, "computed": 0}
    token = runtime._TALLY.set(tally)
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
        e.shown = True  # type: ignore[attr-defined]  # run.guard then says it no second time
        raise
    finally:
        runtime._TALLY.reset(token)
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


def _request_stop(page: str) -> None:
    st.session_state[f"_stopped_{page}"] = True


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



def function_badge(diff: float | None, tol: float, what: str = "matched source",
                   relative: bool = False, compared: str = "") -> None:
    """The function-preservation check of a transform, as a pass/fail badge (icon and words,
    not colour alone), with what was compared in a caption (`relative`: the change is
    relative to the largest |logit|; `compared`: the caption in full, for a record's own
    check)."""
    change = "relative logit change" if relative else "logit change"
    with st.container(horizontal=True, vertical_alignment="center", gap="small"):
        if diff is None:
            st.badge("function check: not run", color="gray", icon=":material/help:")
        elif diff <= tol:
            st.badge(f"PASS · function preserved · max {change} {diff:.1e} ≤ {tol:g}",
                     color="green", icon=":material/check_circle:")
        else:
            st.badge(f"FAIL · function changed · max {change} {diff:.1e} > {tol:g}",
                     color="red", icon=":material/cancel:")
        st.caption(compared or f"{what} vs. the model it came from, on seeded probe inputs")


def blocks_badge(rows: Sequence[dict] | None) -> None:
    """The check of a model stacked from blocks (passthrough): each of its blocks against
    the block it was copied from, tensor by tensor (`block_checks`), as a pass/fail badge;
    nothing for a result without them."""
    if not rows:
        return
    bad = [str(r["block"]) for r in rows if not r["equal"]]
    with st.container(horizontal=True, vertical_alignment="center", gap="small"):
        if not bad:
            st.badge(f"PASS · {len(rows)} blocks, each equal to its source block bit for bit",
                     color="green", icon=":material/check_circle:")
        else:
            st.badge(f"FAIL · blocks {', '.join(bad)} differ from their source blocks",
                     color="red", icon=":material/cancel:")
        st.caption("each block of the built model vs. the anchor's or the matched source's "
                   "block it was copied from (tensor equality)")


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


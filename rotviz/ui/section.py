"""One record's section on a topic page, drawn from what the record declares.

A measurement that declares a `section` (rotviz.measures.Section: its page, its place, its
header and intro, its small defaults, its caption) appears on that page with nothing else
to write: `compose(page, ...)` draws every such record in order through `draw`, which
gives each a form of the record's parameters (the essential ones, `Param.essential`, at
first sight, every other under one "More options" expander), computes it through the
app's cache when its Run is pressed, and shows the record's figure (`Measurement.plot` in
the page's `Style`), its caption, its table and its exports. What a page adds that no
record holds (the Landscape page's gauge-fixed twin, the bend drawn on the A/B/B' plane)
comes in through `Hooks`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from rotviz.app import figures as app_figures
from rotviz.app.export import measurement_files
from rotviz.measures import Measurement, sections
from rotviz.measures.registry import matched
from rotviz.measures.registry import runs as combined
from rotviz.plots.figure_style import Style
from rotviz.ui import run, runtime, show
from rotviz.ui.sidebar import Setup

COLUMNS = 4  # widgets per row, in the form and in its "More options"


@dataclass(frozen=True)
class Drawn:
    """What a section drew: its form's values, the page's style for it, and (once its Run
    was pressed and it computed) its configuration and result."""

    values: dict[str, Any]  # the record's parameters, and the page's fields in its form
    style: Style
    cfg: dict | None = None
    result: dict | None = None


@dataclass(frozen=True)
class Hooks:
    """What a page adds to the sections it composes, by record name."""

    # (record, form values, its inputs' references, a matching or None) -> the computation's
    # configuration (the page's pair and matching, or the references with its matchings)
    cfg: Callable[[Measurement, dict, list[str], str | None], dict]
    # (record, values, result, style) -> (further results, figures, tables) drawn under the
    # record's figure and written into its export (the bend on the A/B/B' plane)
    extend: Mapping[str, Callable[[Measurement, dict, dict, Style],
                                  tuple[dict, dict, dict]]] = field(default_factory=dict)
    # (what the section drew) -> a view of the page's own after the section (a subsection
    # with a Run of its own, such as the gauge-fixed twin of a slice)
    after: Mapping[str, Callable[[Drawn], None]] = field(default_factory=dict)
    # record name -> the references of its inputs (training's two series), drawn in its form
    refs: Mapping[str, Mapping[str, tuple[str, str]]] = field(default_factory=dict)
    ready: bool = True  # the pair can be used (the page checked it once): else no compute
    matchings: tuple[str, ...] = ()  # the page's matchings, for a section run once per each
    # record name -> the page's own widgets drawn first in its form (the Barrier page's
    # matchings, layers and step budget): () -> their values, handed to `cfg` with the
    # record's; "matchings" among them overrides `matchings`
    fields: Mapping[str, Callable[[], dict]] = field(default_factory=dict)
    # record name -> the page's widgets drawn above the section's form, outside it, so they
    # apply at once and the form can follow them (the sweep's method decides which numbers
    # it offers): () -> their values, which the form then leaves out; handed to `cfg`
    before: Mapping[str, Callable[[], dict]] = field(default_factory=dict)
    # record name -> the key its widgets start with (default PREFIX_NAME): the URL a page
    # had before its sections keeps working (the Barrier page's b_points)
    keys: Mapping[str, str] = field(default_factory=dict)


def widgets(record: Measurement, key: str, hidden: tuple[str, ...] = (),
            defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The record's parameters as widgets, inside the caller's form: the essential ones in
    columns, the others under one "More options" expander; `defaults` (the section's small
    ones) over the record's."""
    defaults = defaults or {}
    shown = [p for p in record.parameters() if p.name not in hidden]
    first = [p for p in shown if p.essential]
    more = [p for p in shown if not p.essential]

    def draw(params: list, where: Any) -> dict[str, Any]:
        cols = where.columns(COLUMNS)
        return {p.name: show.param_input(cols[i % COLUMNS], p, f"{key}_{p.name}",
                                         defaults.get(p.name))
                for i, p in enumerate(params)}

    values = draw(first, st)
    if more:
        with st.expander("More options", icon=":material/tune:"):
            values |= draw(more, st)
    return values


def form(record: Measurement, key: str, refs: Mapping[str, tuple[str, str]] | None = None,
         fields: Callable[[], dict] | None = None, lead: Mapping[str, Any] | None = None,
         ) -> tuple[bool, dict[str, Any], dict[str, str]]:
    """The section's form: the page's own fields, its inputs' references (`refs`: argument
    -> (label, default)), the record's parameters (`widgets`; those in `lead`, drawn above
    the form, left out and their values taken) and a Run button. Returns
    whether Run was pressed, the values (the page's fields among them) and the references."""
    sec = record.section
    with st.form(f"{key}_form"):
        own = fields() if fields is not None else {}
        given: dict[str, str] = {}
        if refs:
            cols = st.columns(len(refs))
            given = {arg: cols[i].text_input(label, default, key=f"{key}_{arg}",
                                             bind="query-params")
                     for i, (arg, (label, default)) in enumerate(refs.items())}
        lead = dict(lead or {})  # drawn above the form (Hooks.before): not again in it
        hidden = (*(sec.hidden if sec else ()), *lead)
        values = own | widgets(record, key, hidden, sec.defaults if sec else None) | lead
        submitted = st.form_submit_button("Run", type="primary", icon=":material/play_arrow:",
                                          key=f"{key}_run")
    return submitted, values, given


def figures(record: Measurement, result: dict, style: Style) -> tuple[dict, dict]:
    """The record's tables and figures of a result, in the page's style: its section's
    figures where it declares them, else its one `plot`."""
    sec = record.section
    if "runs" in result:  # one run per matching: the record's table of each, one after another
        tables = {record.name: [{"matching": app_figures.nice_label(r["match"]), **row}
                                for r in result["runs"] for row in record.rows(r)]
                  } if record.rows else {}
        figs = {}
    else:
        tables, figs = measurement_files(record.name, result, style)
    if sec is not None and sec.figures is not None:
        figs = sec.figures(result, style)
    return tables, figs


def checked(result: dict, record: Measurement | None = None, values: Mapping | None = None
            ) -> None:
    """The function check of what the section measured (the worst of its matchings), and
    what was left off for a pair read block by block. A record that makes a model of one
    (teleport: `function_check`, its logits relative to the original's) shows that check;
    a one-model record that made none shows no pair's check (it matched nothing)."""
    for what, why in (result.get("off") or {}).items():
        st.info(f"**{what}** is off for this pair: {why}.", icon=":material/memory:")
    show.blocks_badge(result.get("block_checks"))  # a model stacked from blocks (passthrough)
    own = result.get("function_check")
    if isinstance(own, dict) and own.get("relative") is not None:
        show.function_badge(own["relative"], own["tolerance"], relative=True,
                            compared=own.get("what", "the moved model vs. the original"))
        return
    if record is not None and not matched(record, values or {}):
        return
    checks = result.get("checks") or ([result] if "max_output_diff" in result else [])
    diffs = [c["max_output_diff"] for c in checks if c.get("max_output_diff") is not None]
    if diffs:
        from rotviz.match.pipeline import FUNCTION_TOLERANCE

        show.function_badge(max(diffs), checks[0].get("tolerance") or FUNCTION_TOLERANCE,
                            "matched source (every option)" if len(checks) > 1
                            else "matched source")


def results(record: Measurement, key: str, cfg: dict, result: dict, style: Style,
            extend: Callable[[Measurement, dict, dict, Style], tuple[dict, dict, dict]] | None,
            values: dict, page: str) -> None:
    """A computed section: the record's figure, caption, the page's additions, its table
    (folded) and its export."""
    sec = record.section
    tables, figs = figures(record, result, style)
    places = st.tabs(list(sec.tabs)) if sec is not None and sec.tabs else []
    for i, (name, fig) in enumerate(figs.items()):
        with places[i] if i < len(places) else contextlib.nullcontext():
            show.chart(fig, f"{key}_{name}")
    if sec is not None and sec.caption is not None:
        st.caption(sec.caption(result))
    if record.markdown is not None:
        st.markdown(record.markdown(result))
    checked(result, record, values)
    more: dict = {}
    shown = tables  # the record's tables, folded; what the page adds shows itself
    if extend is not None:
        more, extra_figs, extra_tables = extend(record, values, result, style)
        figs, tables = {**figs, **extra_figs}, {**tables, **extra_tables}
    for rows in shown.values():
        if rows:
            with st.expander("Table", icon=":material/table:"):
                show.table(rows)
    show.export(record.name, {"page": page, **cfg}, {record.name: result, **more} if more
                else result, tables, figs)


def compute(record: Measurement, key: str, values: dict, refs: list[str],
            specs: tuple[str | None, ...], style: Style, hooks: Hooks) -> tuple[dict, dict]:
    """The section's result through the app's cache, in one progress box: one run, or one
    per matching combined (`Section.combine`). While more matchings are still to compute,
    the first figure of those done so far is drawn (a long run shows its first curves)."""
    sec = record.section
    cancel = run.stopper() if record.progress else None
    doing = sec.doing(values) if sec.doing is not None else record.label
    join = sec.combine or combined
    got: list[dict] = []
    with show.progress(sec.busy or record.label, len(specs), stop=key) as step:
        live, note = st.empty(), st.empty()
        try:
            for i, sp in enumerate(specs):
                cfg = hooks.cfg(record, values, refs, sp)
                fresh = not runtime.is_cached(record.name, cfg)
                step(doing if sp is None else f"{app_figures.nice_label(sp)}: {doing}")
                got.append(runtime.compute(record.name, cfg, step.detail, cancel))
                if fresh and i < len(specs) - 1 and sec.figures is not None:
                    first = next(iter(sec.figures(join(got), style).values()))
                    with live:
                        show.chart(first, f"{key}_live_{i}")
                    note.caption(f"{len(got)} of {len(specs)} matching options so far; the "
                                 "others are being computed.")
        finally:  # the whole figure follows (or the box says what failed)
            live.empty()
            note.empty()
    if sec.per_matching:
        return {**cfg, "specs": list(specs)}, join(got)
    return cfg, got[0]


def draw(record: Measurement, s: Setup, page: str, prefix: str, hooks: Hooks) -> Drawn:
    """One record's section: header, intro, form, and on Run its results (each section in
    its own guard: one failing says why and leaves the others working)."""
    sec = record.section
    key = hooks.keys.get(record.name, f"{prefix}_{record.name}")
    if sec.title:
        st.header(sec.title, anchor=record.name)
    if sec.intro:
        st.markdown(sec.intro)
    before = hooks.before.get(record.name)
    submitted, values, refs = form(record, key, hooks.refs.get(record.name),
                                   hooks.fields.get(record.name),
                                   before() if before is not None else None)
    specs = tuple(values.pop("matchings", hooks.matchings)) if sec.per_matching else (None,)
    log = bool(sec.log) and st.toggle(sec.log, False, key=f"{key}_log", bind="query-params")
    style = s.style(log=log)
    drawn = Drawn(values, style)
    if not hooks.ready:
        return drawn
    if s.presenter and not sec.on_open and not run.ran_before(key):
        return drawn  # presenting hides the forms: no Run to ask for
    wanted = (run.should_run(key, submitted, s) if sec.on_open
              else run.section_wanted(key, submitted))
    if not wanted:
        if sec.on_open:  # a larger pair, or a stopped run: it waits for Run
            st.info("Press **Run** to compute it.")
        return drawn
    if not specs:
        st.warning("Pick at least one matching option.")
        return drawn
    out: dict[str, Any] = {}

    def body() -> None:
        cfg, result = compute(record, key, values, list(refs.values()), specs, style, hooks)
        results(record, key, cfg, result, style, hooks.extend.get(record.name), values, page)
        out.update(cfg=cfg, result=result)

    run.guard(body)
    return Drawn(values, style, out.get("cfg"), out.get("result"))


def compose(page: str, s: Setup, prefix: str, hooks: Hooks) -> dict[str, Drawn]:
    """Every record that declares a section on `page`, in order, each followed by the
    page's own view after it (`Hooks.after`)."""
    drawn = {}
    for record in sections(page):
        drawn[record.name] = d = draw(record, s, page, prefix, hooks)
        after = hooks.after.get(record.name)
        if after is not None:
            after(d)
    return drawn

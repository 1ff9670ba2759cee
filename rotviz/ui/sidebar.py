"""The app's sidebar (model pair, data, seed, device, memory budget, display, presenter
mode), bound to the URL, and the `Setup` it hands every page: rotviz/ui/main.py draws it, then runs
the page picked in its `st.navigation`. A page reads it with `setup()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

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
from rotviz.limits import TIME_LIMIT
from rotviz.plots.figure_style import Style
from rotviz.ui import runtime

PAIR_NAMES = {"default": "two seeds", "finetuned": "two fine-tunes",
              "lineage": "fine-tunes of two seeds", "gpt2": "GPT-2 pair",
              "nlp-mlm": "RoBERTa MLMs", "nlp-cls": "RoBERTa topic classifiers",
              "nlp-tok": "RoBERTa code taggers"}
PRESENTER_FONT = 22
FONT = 14


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
    match_time: float = 0.0  # seconds weight matching's alternation may take (0: no limit)

    @property
    def font(self) -> int:
        return PRESENTER_FONT if self.presenter else FONT

    def style(self, log: bool = False, accuracy_range: tuple[float, float] | None = None
              ) -> Style:
        """How this page's figures are drawn (a record's `plot` takes it): the presenter's
        font size, the sidebar's fixed accuracy scale, a log scale where the page offers one,
        and one accuracy range for panels that are compared."""
        return Style(font_size=self.font, log=log, fixed_accuracy=self.acc_fixed,
                     accuracy_range=accuracy_range)

    def base(self) -> dict[str, Any]:
        """The part of every run's configuration that the sidebar decides."""
        base = {"anchor": self.anchor, "source": self.source, "data": self.data,
                "seed": self.seed, "n_eval": self.n_eval, "device": self.device}
        if self.max_memory:  # only a budget the user set: results keep their keys otherwise
            base["max_memory"] = self.max_memory
        if self.match_time:  # likewise: only a time budget the user set
            base["match_time"] = self.match_time
        return base

    @property
    def sized(self) -> tuple[bool, int | None, int | None]:
        """(read block by block, what the pair needs in memory, the budget), in bytes."""
        return runtime._sized(self.anchor, self.source, self.max_memory)


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


def sidebar(before_torch: Callable[[], None] | None = None) -> Setup:
    """Draw the sidebar and return the setup. Every widget is mirrored in the URL.
    `before_torch()` runs before the device picker, the first widget that needs torch
    (rotviz/ui/main.py passes the wait for the launcher's start-up thread, rotviz/ui/boot.py): the
    widgets above it are drawn, and shown, while torch loads."""
    sb = st.sidebar
    roots = tuple(str(r) for r in app_roots.model_roots())
    choices = model_choices(roots)
    try:
        pair = runtime.default_pair(roots)
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
    match_time = float(sb.number_input(
        "Weight matching time budget (s, 0 = no limit)", 0.0, TIME_LIMIT.hi, 0.0, step=10.0,
        key="match_s", bind="query-params",
        help="Weight matching alternates rounds until they stop paying. With a budget, it "
             "stops at the end of the round that crosses it and keeps the closest state it "
             "reached, as `--time-limit` does on the command line; the Match page shows "
             "what each round earned."))
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
                  error, bool(acc_fixed), int(budget * 1e9), match_time)
    st.session_state["_setup"] = setup
    return setup


def presenting() -> bool:
    """Presenter mode, known before the sidebar's toggle is drawn (from its state or the URL)."""
    if "present" in st.session_state:
        return bool(st.session_state["present"])
    return st.query_params.get("present", "").lower() in ("true", "1", "yes")


def setup() -> Setup:
    """The setup the sidebar drew in this run (rotviz/ui/main.py draws it before the page)."""
    runtime._SIZED_SHOWN.set(False)  # a page calls this first: its run shows the at-size note once
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



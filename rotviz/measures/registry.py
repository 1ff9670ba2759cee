"""Every measurement rotviz makes of a matched pair, as one record each.

A measurement takes endpoints (rotviz.match.endpoints: the anchor, the source and the matched
source, held or streamed) and a `Context` (the split, the device, torchrun's group, a
progress callback), and returns a result with `to_dict()`. Its record declares the rest:
name, label and help, its parameters with their bounds, how its result is said in one line
and drawn, its table for exports, and whether and how it runs at size. The CLI sub-command
and its options, the app's computations and widgets, the exports and `rotviz.measure` are
all generated from `measurements()`, so a new measurement is one module calling `register`.

A measurement of more than one pair (barriers over training, spawn instability, many models
aligned at once) declares its `inputs` (`Inputs`: series of checkpoints, a spawn folder, N
models): the same generated CLI, app computation, exports and `rotviz.measure`, with those
inputs in place of the endpoints.

Record modules import torch, the engine and plotly inside their functions, so that listing
the records (for `rotviz --help`, or the app's first paint) stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rotviz.errors import RotvizError
from rotviz.params import Param, check_needs, read_params
from rotviz.plots.figure_style import Style
from rotviz.records import Records
from rotviz.types import Progress

if TYPE_CHECKING:
    from rotviz.data.split import Split
    from rotviz.dist import Group


@dataclass(frozen=True)
class Context:
    """What a measurement is evaluated on, besides the endpoints."""

    split: Split | None  # None for a measurement of the weights alone
    device: Any  # a torch.device
    group: Group | None = None  # torchrun's processes (None: one process)
    progress: Progress | None = None
    out: Path | None = None  # at size: the empty folder a measurement that writes a model uses
    cancel: Callable[[], bool] | None = None  # True: a training measurement stops (app's Stop)
    # how a further model a parameter names (a merge's --base) is loaded, through the host's
    # confined reading (the app's roots); None: rotviz.sources.loading.load_model, as the CLI reads
    load: Callable[[str], Any] | None = None
    # a pair of different depths brought to one by the record's `depths` before matching:
    # what its hook returned for the record's report (rotviz.analysis.depths.OneDepth);
    # None for a pair of one depth
    depths: Any = None
    # seconds weight matching's alternation may take, in every matching the record makes
    # (rotviz.match.options.MATCH_PARAMS: the same --time-limit as a pair's); None: no limit
    time_limit: float | None = None

    def matching(self, spec: Any) -> Any:
        """The MatchOptions of `spec` (a SPEC string, MatchOptions or None) with this
        context's time limit where it alternates: the one place where a record that makes
        its own matchings (series, spawns, N models, a ladder's rungs) gets the limit."""
        from rotviz.match.endpoints import as_options
        from rotviz.match.options import with_time_limit

        return with_time_limit(as_options(spec), self.time_limit)


Runner = Callable[[Any, Context, dict], Any]  # (endpoints, context, parameter values) -> result


@dataclass(frozen=True)
class Inputs:
    """What a measurement takes when it is not one matched pair (a record's `inputs`): two
    series of checkpoints, a spawn folder, N models (`least`: the last argument takes one or
    more references, and `read` refuses fewer than `least`). The CLI takes `args` as its
    positional arguments and `--match SPEC` once per matching (once in all with `one_spec`);
    `read(refs, specs, confined)` reads and checks
    them (every file through `confined`) into the value the record's `run` takes in place of
    endpoints, which names its `first_pair()` of model folders (the one whose reading of the
    data gives the split, and whose size says whether it fits in memory)."""

    args: tuple[tuple[str, str], ...]  # (name, help) of each positional argument
    read: Callable[..., Any]  # (refs, specs, confined) -> the record's input value
    # empty: the record reads no matching at all (conserved: the weights of one series): the
    # CLI offers no --match, the app's pages pass it none, and `read` refuses one
    default_specs: tuple[str, ...] = ("none", "seed")
    # N models at once (rotviz many): the last argument takes one or more references, and
    # `refs` holds them all, in order; `read` refuses fewer than `least` of them (0: every
    # argument takes exactly one)
    least: int = 0
    one_spec: bool = False  # one --match SPEC for all (not one measurement per matching)
    # what one --match is, in the CLI's help (the ladder: "a rung of the ladder, once per
    # rung"); empty: a matching each pair is measured with, once per matching
    spec_help: str = ""
    # (the read inputs, values, names given) -> refuse, in one line, an option the inputs
    # leave without effect (the ladder's --steps with no learned rung); before any model loads
    check: Callable[[Any, dict, set[str]], None] | None = None


@dataclass(frozen=True)
class OutputFile:
    """A further file a measurement writes when its option is given (`Measurement.files`),
    with the folders it needs beside it: `merge --mergekit-config FILE` writes a mergekit
    configuration and, next to it, the matched source it names. The CLI adds the option,
    checks the file and its folders as outputs before any model is loaded, and writes them
    with the command's other outputs (temporary siblings, renamed when all succeed)."""

    flag: str  # the CLI option, e.g. --mergekit-config
    help: str
    folders: Callable[[Path], tuple[Path, ...]] = lambda path: ()  # written beside the file
    check: Callable[[dict], None] | None = None  # (values) -> refuse early, one line
    # the names the file may end in (".yml", ".yaml"; case ignored), checked with the other
    # outputs: a YAML file named mk.txt would not be found by what reads it. Empty: any name
    suffixes: tuple[str, ...] = ()
    # (endpoints, result, values, file, folders, final) -> None: write the file and folders
    # (temporary paths) where `final` is (the file, its folders) as they will be named; the
    # endpoints are held, or streamed at size (a record that writes a model only)
    write: Callable[..., None] | None = None

    def check_name(self, path: str) -> None:
        """Refuse, in one line, a file name that does not end in one of `suffixes`."""
        if self.suffixes and not str(path).lower().endswith(self.suffixes):
            raise RotvizError(f"{self.flag} {path}: name the file "
                              f"{' or '.join(self.suffixes)}")


@dataclass(frozen=True)
class Section:
    """Where a record appears on one of the app's topic pages, and how (`Measurement.section`):
    the page's generic section renderer (rotviz/ui/section.py) draws its header and intro, a
    form of the record's parameters (the essential ones, `Param.essential`, at first sight,
    the rest under one "More options" expander), runs it through the app's cache, and shows
    its figure (`Measurement.plot` in the page's Style), its caption, its table and its
    exports. So a measurement reaches a topic page by declaring this; no page wires it."""

    page: str  # the topic page: barrier, landscape, match, merge, spectra, training
    order: int = 100  # its place on the page, first to last
    title: str = ""  # the section's header; empty: none (the page's title heads it)
    intro: str = ""  # Markdown under the header: what the section shows and why
    # the section's own defaults where they differ from the CLI's (small, for a quick first Run)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    hidden: tuple[str, ...] = ()  # parameters the page sets itself (not drawn in the form)
    # (result dict) -> the line under the figure, in words (the numbers a reader looks for)
    caption: Callable[[dict], str] | None = None
    # (values) -> what the progress box says while it computes; None: the record's label
    doing: Callable[[dict], str] | None = None
    busy: str = ""  # the progress box's label ("Interpolating"); empty: the record's label
    # the label of a toggle for `Style.log` (a log colour scale); empty: no toggle
    log: str = ""
    # its figures in tabs, one label each in the figures' order (the plane from above and in
    # 3D); empty: one under another
    tabs: tuple[str, ...] = ()
    # True: compute on open for a small pair (as the Barrier page does); False: on Run only
    on_open: bool = False
    # measured once per matching the page picks, the results then one (`combine`, which the
    # figures and table draw: the fusion table's column per matching; default `runs`: the
    # results in order, each a line of the figure); False: once
    per_matching: bool = False
    combine: Callable[[list[dict]], dict] | None = None
    # (result dict, Style) -> the section's figures by name, where it shows more than the
    # record's one `plot` (the fusion table's F1 beside its accuracy); None: the plot
    figures: Callable[[dict, Style], dict[str, Any]] | None = None

def runs(results: list[dict]) -> dict:
    """Several runs of one record, one per matching, as one result (a section's default
    `combine`): the runs in order, and each matching's function check."""
    return {"runs": list(results),
            "checks": [{"spec": r.get("match"), "max_output_diff": r.get("max_output_diff"),
                        "tolerance": r.get("tolerance")}
                       for r in results if r.get("match") != "none"]}


def matched(record: Measurement, values: dict) -> bool:
    """Whether a run of `record` with these values measures the matched pair (so a page's
    matching applies): a pair record always, a one-model record when its values use the
    second model (a slice around B', say)."""
    return record.pair or (record.source is not None and record.source(values) is not None)


@dataclass(frozen=True)
class Measurement:
    """One measurement and everything the CLI, the app, the exports and the API need."""

    name: str  # CLI sub-command, app computation, export file stem, API name
    label: str  # plain words for the app and legends
    help: str  # one line for `rotviz --help`
    run: Runner  # on endpoints held in memory
    params: tuple[Param, ...] | Callable[[], tuple[Param, ...]] = ()
    summary: Callable[[Any, str], str] | None = None  # (result, how) -> the CLI's one line
    # (result dict, the host's Style: font size, log scale, shared ranges) -> a plotly figure
    plot: Callable[[dict, Style], Any] | None = None
    # result dict -> a plotly figure with frames (its play button animates it in the app);
    # exported as HTML, GIF or MP4 (rotviz.animation, the CLI's --animation FILE)
    animate: Callable[[dict], Any] | None = None
    # parameter values the animation needs that the result holds only when asked (the
    # barrier's answers on fixed inputs, `examples`): the CLI uses them with --animation
    # where they are not given, and the app's pages ask for them
    animate_params: dict = field(default_factory=dict)
    rows: Callable[[dict], list[dict]] | None = None  # result dict -> a table (CSV export)
    at_size: Runner | None = None  # on endpoints at size; None: cannot run at size
    refusal: str = ""  # why it cannot run at size, when at_size is None
    data: bool = True  # evaluates on a split (--data)
    pair: bool = True  # measures a matched pair; False: one model (anchor = source = it)
    # A one-model record (pair=False) that may take a second model (`--source MODEL`, matched
    # onto the model with `--match SPEC`): (values) -> the option among them that needs it
    # (a phrase, "--around matched"), or None when the one model suffices. None: never.
    source: Callable[[dict], str | None] | None = None
    match_default: str = "seed"
    writes_model: bool = False  # --out DIR: the result's `state` written as a model
    check: Callable[[dict, set[str]], None] | None = None  # (values, given names) -> refuse
    # (MatchOptions, or None for 'none') -> why this record cannot measure a pair matched so
    # (one line), or None: checked before any model is loaded (rounds needs the residual map)
    match_check: Callable[[Any], str | None] | None = None
    needs_match: bool = False  # at size it needs a matched source (not 'none')
    at_size_check: Callable[[dict], None] | None = None  # refuse values at size, early
    # (anchor, source, values) -> refuse in one line what only the loaded pair tells (a
    # passthrough's slices beyond a model's depth): in memory, before the pair is matched
    pair_check: Callable[[Any, Any, dict], None] | None = None
    inputs: Inputs | None = None  # None: a matched pair (or one model, pair=False)
    # runs on a source whose FFN is narrower than the anchor's (rotviz.match.widths): it
    # reads only the anchor and the matched source (anchor's width), never the source as is
    narrower: bool = False
    # takes two models of one family and width but different depths: (anchor, source,
    # values, evaluation split or None, device) -> (anchor, source, what was done), a pair
    # of one depth (rotviz.analysis.depths) the host then matches, the last item reaching the
    # record as `Context.depths`; None: such a pair is refused in one line
    depths: Callable[..., tuple[Any, Any, Any]] | None = None
    # parameters whose value names a further model (a merge's base): guarded as an input
    # (no output may overwrite it) and read through `Context.load`
    models: tuple[str, ...] = ()
    files: tuple[OutputFile, ...] = ()  # further files written when their option is given
    progress: bool = False  # the CLI prints a progress line (a long measurement)
    # result dict -> Markdown the app shows beside the figure (the ladder's table); None: none
    markdown: Callable[[dict], str] | None = None
    # the options that use the second model of a one-model record (`source`), for the
    # refusal of a --source given without them
    source_use: str = ""
    # what --max-memory does for this record, in the CLI's help
    at_size_help: str = "matched at size and measured block by block"
    at_size_how: str = " (at size: each point built block by block)"  # summary tail
    more: Callable[[], str] | None = None  # text appended to `help` when asked (its methods)
    order: int = 1000  # place in menus and help (built-ins 10-990; plug-ins after)
    section: Section | None = None  # its section on one of the app's topic pages; None: none

    def parameters(self) -> tuple[Param, ...]:
        return self.params() if callable(self.params) else self.params

    def values(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every parameter's value, `given` checked over the defaults; then, on the names
        actually given, each parameter's declared condition (`Param.needs`) and the record's
        own cross-parameter check."""
        params = self.parameters()
        values = read_params(params, given, self.name)
        named = {k for k, v in given.items() if v is not None}
        check_needs(params, values, named)
        if self.check is not None:
            self.check(values, named)
        return values

    def describe(self) -> str:
        """The one-line help, with what the record adds at the time it is asked (the merge
        methods registered by then, for instance)."""
        return self.help + (self.more() if self.more is not None else "")

    def figure(self, result: Any, style: Style | None = None) -> Any:
        """The record's figure of `result` (its result object, or the dict `to_dict` gives),
        drawn in `style` (None: the default the CLI's --figure draws): the call for a
        notebook, where `plot` is the hook a record declares. None: the record draws none."""
        if self.plot is None:
            return None
        d = result.to_dict() if hasattr(result, "to_dict") else result
        return self.plot(d, style or Style())

    def why_not_at_size(self) -> str | None:
        """One line: why this measurement cannot run on a pair read block by block."""
        if self.at_size is not None:
            return None
        return self.refusal or f"{self.name} has no block-by-block implementation"


MEASUREMENTS: Records[Measurement] = Records("measurement")


def register(m: Measurement) -> Measurement:
    """Add a measurement (its name must be new); returns it."""
    return MEASUREMENTS.register(m)


def measurements() -> tuple[Measurement, ...]:
    """Every registered measurement, by `order`."""
    return MEASUREMENTS.all()


def sections(page: str) -> tuple[Measurement, ...]:
    """The records that declare a section on topic page `page`, in the section's order."""
    found = [m for m in measurements() if m.section is not None and m.section.page == page]
    return tuple(sorted(found, key=lambda m: m.section.order))


def refuse_heads(m: Measurement, ends: Any) -> None:
    """One line when `ends` pair one body under two heads (a pre-training checkpoint and a
    classifier) and `m` evaluates a loss, which runs one head on both: only the views of the
    weights (distances, spectra) compare such a pair."""
    # not `ends.info`: at size that would wait for the distance of a pair not matched
    heads = getattr(ends, "different_heads", None)
    if heads and m.data:
        able = ", ".join(r.name for r in measurements() if not r.data and r.pair)
        raise RotvizError(
            f"the models have different heads ({heads['anchor_head'] or 'no head'} vs "
            f"{heads['source_head'] or 'no head'}), and {m.name} evaluates a loss through one "
            f"head on both; use {able}, or match them with rotviz match")


def measurement(name: str) -> Measurement:
    """The measurement called `name`, or a one-line error."""
    found = MEASUREMENTS.get(name)
    if found is None:
        raise RotvizError(f"no measurement '{name}'; use one of "
                          f"{', '.join(m.name for m in measurements())}")
    return found

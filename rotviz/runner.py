"""The one runner of a record: the library's `measure`, the command line and the app all run a
measurement here, so that its values, its checks, the choice between memory and at size,
its endpoints, its context and its result are the same whichever host asks.

    from rotviz.runner import measure          # endpoints already matched (the library)
    curve = measure("barrier", ends, split, points=11)

A host that starts from references (the CLI, the app) describes the pair as a `Pair` and
what differs between hosts as a `Host` (how models are loaded, how data is read, how the
endpoints are matched, progress, cancel, where outputs go, and the words of a refusal) and
calls `run`; a record of series or of N models (`Measurement.inputs`) goes through
`run_inputs`. Every check of a record lives in `check`, and every run passes through
`run_on`: a record is refused the same way by every host.

Importing this module imports nothing heavy: each step imports what it needs when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rotviz.errors import RotvizError
from rotviz.measures import Context, Measurement, measurement, measurements, refuse_heads
from rotviz.types import Progress


@dataclass(frozen=True)
class Words:
    """How a host says that a pair runs at size, and what the user can do about a refusal
    (`over`: the pair's situation; `fix`: the way out), so that one check speaks each host's
    language: `--max-memory` on the command line, the sidebar's budget in the app."""

    over: str = "the pair is read block by block"
    fix: str = ""
    pick: str = "match it"  # how to give a matching, for a record that needs one at size

    def refuse(self, why: str) -> RotvizError:
        return RotvizError(f"{self.over}, and {why}" + (f"; {self.fix}" if self.fix else ""))


LIBRARY = Words()
CLI = Words("the pair is evaluated block by block (--max-memory)", "raise --max-memory",
            "give --match (e.g. seed)")


def check(m: Measurement, values: dict, options: Any, sized: bool,
          words: Words = LIBRARY, known: bool = True) -> None:
    """Every check a record makes of a pair before anything is loaded, the same for every
    host: the matching it cannot measure (`match_check`), and at size its refusal (no
    at-size implementation), the values it refuses at size (`at_size_check`) and the
    matching it needs there (`needs_match`). `options` is the pair's MatchOptions (None:
    no matching); `known` False where the endpoints do not say how they were matched."""
    if known and m.match_check is not None:
        why = m.match_check(options)
        if why:
            raise RotvizError(why)
    if not sized:
        return
    why = m.why_not_at_size()
    if why:
        raise words.refuse(why)
    if m.at_size_check is not None:
        m.at_size_check(values)
    if known and m.needs_match and options is None:
        raise words.refuse(f"{m.name} needs a matched source for its second direction at "
                           f"size: {words.pick}")


def refuse_narrower(m: Measurement) -> None:
    """One line for a record that reads the source as it is, on a source whose FFN is
    narrower than the anchor's (embedded into the anchor's width): the records that can."""
    from rotviz.match.widths import refuse_narrower as refuse

    able = ", ".join(r.name for r in measurements() if r.narrower)
    refuse(f"{m.name} also reads the source as it is, in its own width", f"use {able}")


def run_on(m: Measurement, ends: Any, ctx: Context, values: dict,
           words: Words = LIBRARY) -> Any:
    """Run record `m` on endpoints (held in memory, or at size: its at-size implementation)
    with checked `values`: the record's checks on the endpoints' matching, a narrower
    source, one body under two heads, then the record. Every host's run ends here."""
    from rotviz.match.selection import match_options

    spec = getattr(ends, "match", None)
    check(m, values, match_options(spec) if spec is not None else None,
          bool(getattr(ends, "at_size", False)), words, spec is not None)
    return _run_checked(m, ends, ctx, values)


def _run_checked(m: Measurement, ends: Any, ctx: Context, values: dict) -> Any:
    """`run_on` once the record's checks have passed (a host checks them before loading
    anything: on torchrun's other processes the endpoints do not know their matching)."""
    report = getattr(ends, "report", None)
    if getattr(report, "widths", None) and not m.narrower:  # a narrower source, embedded
        refuse_narrower(m)
    refuse_heads(m, ends)
    if m.data and ctx.split is None:
        raise RotvizError(f"{m.name} evaluates the models: give it data (a split)")
    if getattr(ends, "at_size", False):
        return m.at_size(ends, ctx, values)  # type: ignore[misc]  # checked: it has one
    return m.run(ends, ctx, values)


def measure(name: str, ends: Any, split: Any = None, device: Any = "cpu",
            progress: Progress | None = None, **params: Any) -> Any:
    """measure(name, endpoints, split, device="cpu", **params) -> the record's result

    Run the registered measurement `name` on endpoints (held in memory, or at size: then
    its at-size implementation, or a one-line refusal), its parameters checked against
    their bounds; those not given keep their defaults. A record that takes other inputs
    (training, spawn, many, ladder: `Measurement.inputs`) takes their value, or their
    references as a list with `match=[SPEC, ...]` (default its own)."""
    from rotviz.devices import resolve_device

    m = measurement(name)
    if m.data and split is None:
        raise RotvizError(f"{name} evaluates the models: give it a split (rotviz.evaluation."
                          "split_for)")
    if m.inputs is not None:
        m.values({k: v for k, v in params.items() if k != "match"})  # before any reading
        if isinstance(ends, (list, tuple)):  # references, not yet read
            from rotviz.confine import ANYWHERE

            ends = m.inputs.read(tuple(map(str, ends)), params.pop("match", None), ANYWHERE)
        return run_inputs(m, ends, params, lambda first: split, device, progress)
    values = m.values(params)
    ctx = Context(split if m.data else None, resolve_device(device), progress=progress)
    return run_on(m, ends, ctx, values)


def given(m: Measurement, params: dict, moved: bool = False) -> dict:
    """The parameters a host was given, as `Measurement.values` takes them: None is not
    given; with `moved` (a page's widgets, which always hold a value), only the values moved
    off their default count as given."""
    if not moved:
        return {k: v for k, v in params.items() if v is not None}
    defaults = {p.name: p.default for p in m.parameters()}
    return {k: v for k, v in params.items()
            if v is not None and (k not in defaults or v != defaults[k])}


def run_inputs(m: Measurement, inputs: Any, params: dict,
               split_of: Callable[[Any], Any], device: Any,
               progress: Progress | None = None, cancel: Callable[[], bool] | None = None,
               load: Callable[[str], Any] | None = None, sized: bool = False,
               words: Words = LIBRARY, time_limit: float | None = None) -> Any:
    """Run a record of series or of N models (`Measurement.inputs`) on its read `inputs`:
    values and the inputs' check (before any model loads), the record's refusal at size,
    the split as `split_of(the first pair's first model folder)` reads it, then the
    record. `time_limit`: seconds weight matching's alternation may take in each matching
    the record makes (Context.matching), checked here before any model loads."""
    from rotviz.devices import resolve_device

    assert m.inputs is not None
    named = set(given(m, params))
    values = m.values(params)
    if time_limit is not None:
        from rotviz.match.options import TIME_LIMIT_PARAM

        time_limit = float(TIME_LIMIT_PARAM.check(time_limit))
    if m.inputs.check is not None:
        m.inputs.check(inputs, values, named)
    if sized:
        raise words.refuse(f"{m.name} is refused at size: {m.why_not_at_size()}")
    split = split_of(inputs.first_pair()[0]) if m.data else None  # weights only: no split
    ctx = Context(split, resolve_device(device), progress=progress, cancel=cancel, load=load,
                  time_limit=time_limit)
    return m.run(inputs, ctx, values)


@dataclass(frozen=True)
class Pair:
    """The pair a host asks a record to measure, by reference: two models (a one-model
    record's model twice, `second` False), the matching SPEC and the layers to match, and
    whether it runs at size (the host decides: --max-memory, the app's budget)."""

    anchor: str
    source: str
    spec: str | None = "none"
    layers: str | None = None
    second: bool = True  # a one-model record (pair=False) given a second model
    sized: bool = False
    # seconds weight matching's alternation may take (rotviz.match.options.MATCH_PARAMS;
    # None: no limit)
    time_limit: float | None = None

    def options(self, n_layers: int | None = None) -> Any:
        """The MatchOptions this pair is matched with (None: no matching), the layers read
        against the model's `n_layers` (None: not yet known, so every layer)."""
        from rotviz.match.options import limited, parse_layers
        from rotviz.match.selection import match_options

        layers = None if n_layers is None else parse_layers(self.layers, n_layers)
        return limited(match_options(self.spec, layers), self.time_limit)


def _load_model(ref: str) -> Any:
    from rotviz.sources.loading import load_model

    return load_model(ref)


@dataclass(frozen=True)
class Host:
    """What differs between the hosts that run a record from references. `load` gives a
    model held in memory; `split(model)` the data as that model (or, at size, its skeleton)
    reads it, None where none is given; `match(anchor, source, options, split)` the held
    endpoints (default rotviz.match.endpoints.match_endpoints: the app passes its cached
    matching); `further(ref)` a further model a parameter names (a merge's base); `at_size_ref`
    what such a reference becomes at size (the app: the folder under its roots);
    `processes(device)` the process group (torchrun) while the record runs; `using(a, b)`
    held while the record runs on the models (the app's locks; not while matching);
    `write(ends, result, ctx)` the outputs, on the main process, endpoints still open;
    `out()` the folder a record that writes a model writes into at size (the CLI's --out,
    as a temporary sibling); `words` how a refusal is said."""

    device: Any
    load: Callable[[str], Any] = _load_model
    split: Callable[[Any], Any] = lambda model: None
    match: Callable[[Any, Any, Any, Any], Any] | None = None
    confined: Any = None
    further: Callable[[str], Any] | None = None
    at_size_ref: Callable[[str], str] | None = None
    processes: Callable[[Any], AbstractContextManager[Any]] | None = None
    using: Callable[..., AbstractContextManager[Any]] = lambda *refs: nullcontext()
    progress: Progress | None = None
    cancel: Callable[[], bool] | None = None
    write: Callable[[Any, Any, Context], None] | None = None
    out: Callable[[], AbstractContextManager[Path | None]] = lambda: nullcontext(None)
    words: Words = LIBRARY


def run(m: Measurement, pair: Pair, params: dict, host: Host) -> Any:
    """Run record `m` on `pair` for `host`: values (checked), the record's checks before
    any model loads, then in memory or at size, the endpoints, the context, the record
    (`run_on`) and the host's outputs. Returns the result; None on a torchrun process other
    than the main one (the main one writes and reports)."""
    values = m.values(params)
    check(m, values, pair.options(), pair.sized, host.words)
    if pair.sized:
        return _at_size(m, pair, values, host)
    return _in_memory(m, pair, values, host)


@contextmanager
def _group(host: Host) -> Iterator[Any]:
    """The host's process group while a record runs (one process, the main, by default)."""
    if host.processes is None:
        from rotviz.dist import SINGLE

        yield SINGLE
    else:
        with host.processes(host.device) as group:
            yield group


def _context(m: Measurement, split: Any, host: Host, group: Any, load: Any = None,
             out: Path | None = None, depths: Any = None,
             time_limit: float | None = None) -> Context:
    return Context(split if m.data else None, host.device,
                   group if host.processes is not None else None,
                   host.progress if group.main else None, out, host.cancel, load, depths,
                   time_limit)


def one_depth(m: Measurement, anchor: Any, source: Any, values: dict,
              split: Callable[[], Any], device: Any) -> tuple[Any, Any, Any]:
    """A pair of different depths brought to one by the record's `depths` hook (the merge),
    given the evaluation split (`split()`, read only then), or refused in one line by a
    record without one; a pair of one depth as it is (None)."""
    from rotviz.analysis.depths import depth_refusal, differs_in_depth

    if not (m.pair and differs_in_depth(anchor, source)):
        return anchor, source, None
    if m.depths is None:
        able = ", ".join(r.name for r in measurements() if r.depths is not None)
        raise RotvizError(depth_refusal(anchor, source, f"{m.name} measures a pair of one "
                                        f"depth; {able} takes such a pair"))
    return m.depths(anchor, source, values, split(), device)


def _in_memory(m: Measurement, pair: Pair, values: dict, host: Host) -> Any:
    """The pair held in memory: loaded, checked (a narrower source; one body under two
    heads for a record that evaluates a loss), its further models read (a bad one refused
    before any matching), matched by the host, measured."""
    from rotviz.match.endpoints import match_endpoints
    from rotviz.match.pipeline import view_of
    from rotviz.match.widths import check_pair

    anchor = host.load(pair.anchor)
    source = host.load(pair.source) if m.pair or pair.second else anchor
    read: list[Any] = []  # the split, read once: by a pair of different depths' hook first

    def split_of(model: Any = anchor) -> Any:
        if not read:
            read.append(host.split(model))
        return read[0]

    anchor, source, depths = one_depth(m, anchor, source, values, split_of, host.device)
    if check_pair(anchor, source, heads=not m.data) and not m.narrower:  # narrower: embedded
        refuse_narrower(m)
    if m.pair_check is not None:
        m.pair_check(anchor, source, values)
    further = {values[n]: (host.further or _load_model)(values[n])
               for n in m.models if values.get(n)}
    split = split_of()
    options = pair.options(view_of(anchor).dims.n_layers)
    with _group(host) as group:
        if host.match is not None:  # outside `using`: the host's matching holds its own
            ends = host.match(anchor, source, options, split)
        else:
            ends = match_endpoints(anchor, source, options, host.device, data=split)
        ctx = _context(m, split, host, group, further.__getitem__ if further else None,
                       depths=depths, time_limit=pair.time_limit)
        with host.using(pair.anchor, pair.source):
            result = _run_checked(m, ends, ctx, values)
        if result is None or not group.main:
            return None
        if host.write is not None:
            host.write(ends, result, ctx)
    return result


def _at_size(m: Measurement, pair: Pair, values: dict, host: Host) -> Any:
    """The pair at size: both folders opened (headers only), checked, the source matched
    into a temporary folder, then the record's at-size implementation, with the host's
    outputs written while the endpoints are open (a record that writes a model writes it
    into `host.out()`, on the main process only)."""
    from rotviz.analysis.depths import depth_refusal, differs_in_depth
    from rotviz.atsize.blocks import open_streamed
    from rotviz.atsize.endpoints import streamed_endpoints
    from rotviz.atsize.points import sized_loaded
    from rotviz.confine import ANYWHERE
    from rotviz.match.widths import differs_only_in_ffn
    from rotviz.match.widths import refuse_narrower as refuse
    from rotviz.sources.pairs import check_compatible

    if host.at_size_ref is not None:  # further models, read at size by the record itself
        values = {**values, **{n: host.at_size_ref(values[n]) for n in m.models
                               if values.get(n)}}
    confined = host.confined or ANYWHERE
    anchor = open_streamed(pair.anchor, confined)
    source = open_streamed(pair.source, confined) if m.pair or pair.second else anchor
    if differs_only_in_ffn(anchor, source):
        refuse("it is embedded into the anchor's width in memory only, not at size",
               host.words.fix or "hold the pair in memory")
    if differs_in_depth(anchor, source):  # type: ignore[arg-type]  # duck-typed: meta state
        raise RotvizError(depth_refusal(
            anchor, source,  # type: ignore[arg-type]
            "a pair of different depths is brought to one depth in memory only; raise "
            "--max-memory"))
    check_compatible(anchor, source)  # type: ignore[arg-type]  # duck-typed: meta state
    options = pair.options(source.dims.n_layers)
    split = host.split(sized_loaded(anchor))
    with _group(host) as group, streamed_endpoints(anchor, source, options, host.device,
                                                   group) as ends:
        if m.writes_model and not group.main:  # the main process writes the model
            return None
        with host.out() as out:
            ctx = _context(m, split, host, group, out=out, time_limit=pair.time_limit)
            result = _run_checked(m, ends, ctx, values)
            if result is not None and group.main and host.write is not None:
                host.write(ends, result, ctx)
    return result if group.main else None


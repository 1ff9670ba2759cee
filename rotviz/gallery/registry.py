"""The paper-figure gallery, one record per figure.

A gallery entry names a figure of a paper rotviz reproduces on a pair (the zoo's default
pair unless told otherwise): its title and caption, the registered measurement
(rotviz.measures) it is made of, and its runs, each a matching SPEC and the measurement's
options. Its table is the measurement record's own `rows` of every run, each row led by
the run's matching (and the options that differ between runs); its figure is drawn from
that table alone (`draw`), so that the CSV written beside a figure reproduces it. The
`rotviz figures` command, the app's Gallery page and the report are all generated from
`entries()`: a new figure is one `register` call.

Each run is exactly one `rotviz MEASUREMENT ANCHOR SOURCE --match SPEC ...` command line
(`Entry.commands`), which is what a reader runs to get that run's numbers alone.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rotviz.errors import RotvizError
from rotviz.records import Records


@dataclass(frozen=True)
class Run:
    """One measurement of the pair: matched with `match`, measured with `params` (the
    record's parameters; those not given keep their defaults)."""

    match: str
    params: Mapping[str, Any] = field(default_factory=dict)


def each(matches: Sequence[str], **params: Any) -> tuple[Run, ...]:
    """One run per matching SPEC, all with the same parameters."""
    return tuple(Run(m, dict(params)) for m in matches)


@dataclass(frozen=True)
class Pair:
    """What a gallery is made on: the anchor, the source and the data they are read with."""

    anchor: str
    source: str
    data: str


@dataclass(frozen=True)
class Entry:
    """One figure of the gallery and everything the CLI, the app and the report need."""

    name: str  # file stem and `--only` name (a Python identifier)
    title: str  # the figure's title, as the paper's figure is named
    caption: str  # what it shows and how to read it (a paragraph)
    paper: str  # which paper, which figure
    measurement: str  # the registered measurement each run is (rotviz.measures)
    runs: tuple[Run, ...]
    draw: Callable[[list[dict]], Any]  # the table (the CSV's rows) -> a plotly figure
    columns: tuple[str, ...] = ()  # the runs' parameters that lead each row, beside `match`
    order: int = 1000  # place in the gallery (built-ins 10-990; others after)

    def record(self):
        from rotviz.measures import measurement

        return measurement(self.measurement)

    def table(self, results: Sequence[Mapping]) -> list[dict]:
        """The rows of every run's result (the record's `rows`), each led by its matching
        and the parameters named in `columns`: what NAME.csv holds."""
        rows_of = self.record().rows
        if rows_of is None:
            raise RotvizError(f"gallery entry {self.name}: measurement {self.measurement} "
                              "has no table (rows)")
        out = []
        for run, result in zip(self.runs, results, strict=True):
            lead = {"match": run.match, **{c: run.params[c] for c in self.columns}}
            out += [{**lead, **row} for row in rows_of(result)]
        return out

    def figure(self, rows: list[dict]) -> Any:
        """The figure, drawn from the table alone, titled as the entry is."""
        fig = self.draw(rows)
        fig.update_layout(title_text=self.title)
        return fig

    def commands(self, pair: Pair) -> list[str]:
        """One rotviz command line per run, each writing its result as JSON (`--json`)."""
        m = self.record()
        flags = {p.name: p.flag for p in m.parameters()}
        data = f" --data {pair.data}" if m.data else ""
        out = []
        for i, run in enumerate(self.runs):
            opts = "".join(f" {flags[k]} {_text(v)}" for k, v in run.params.items())
            out.append(f"rotviz {m.name} {pair.anchor} {pair.source}{data} --match "
                       f"{run.match}{opts} --json {self.name}-{i + 1}.json")
        return out


def _text(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


GALLERY: Records[Entry] = Records("gallery entry")


def register(entry: Entry) -> Entry:
    """Add a gallery entry (its name must be new); returns it."""
    return GALLERY.register(entry)


def entries() -> tuple[Entry, ...]:
    """Every registered entry, the built-ins first (rotviz.gallery.paper, registered when
    the package is imported)."""
    return GALLERY.all()


def entry(name: str) -> Entry:
    """The entry called `name`, or a one-line error naming them all."""
    found = {e.name: e for e in entries()}.get(name)
    if found is None:
        raise RotvizError(f"no gallery figure '{name}'; use one of "
                          f"{', '.join(e.name for e in entries())}")
    return found


def select(only: str | None) -> tuple[Entry, ...]:
    """The entries a comma list names, in the gallery's order (None: all); a list that
    names none, or an unknown name, is a one-line error."""
    if only is None:
        return entries()
    names = [n.strip() for n in only.split(",") if n.strip()]
    if not names:
        raise RotvizError("--only names no figure; give one or more names, comma-separated, "
                          f"of {', '.join(e.name for e in entries())}")
    for n in names:
        entry(n)  # one line for an unknown name
    return tuple(e for e in entries() if e.name in names)


def read_table(text: str) -> list[dict]:
    """A table as `rotviz.app.export.rows_to_csv` wrote it, back to rows: numbers as
    numbers, empty cells as None, other cells as text."""
    return [{k: _cell(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(text))]


def _cell(text: str | None) -> Any:
    if text is None or text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text

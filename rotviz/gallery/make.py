"""Making the gallery: every run of every entry measured with the registered measurement
(`rotviz.measure`) on endpoints matched once per matching SPEC and shared by every entry,
then each entry's table, its figure drawn from that table, and the files a folder holds.

    from rotviz.gallery import Pair, make, select
    made = make(select("fig5_barriers"), Pair("zoo:vit-digits-s3", "zoo:vit-digits-s6", "digits"))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rotviz.gallery.registry import Entry, Pair, read_table


@dataclass
class Made:
    """One entry made: each run's result (as plain data), the table, its CSV text and the
    figure drawn from that CSV."""

    entry: Entry
    results: list[dict]
    rows: list[dict]
    csv: str
    figure: Any
    seconds: float

    def to_dict(self, pair: Pair) -> dict:
        """NAME.json: the entry, the pair, and every run with its command and result."""
        from rotviz.app.export import jsonable

        e = self.entry
        return jsonable({
            "figure": e.name, "title": e.title, "paper": e.paper, "caption": e.caption,
            "measurement": e.measurement, "anchor": pair.anchor, "source": pair.source,
            "data": pair.data, "runs": [{"match": r.match, "params": dict(r.params),
                                         "command": c, "result": res}
                                        for r, c, res in zip(e.runs, e.commands(pair),
                                                             self.results, strict=True)]})


def drawn(entry: Entry, results: Sequence[dict]) -> tuple[list[dict], str, Any]:
    """(rows, CSV text, figure) of an entry's results: the figure is drawn from the CSV as
    written, so reading NAME.csv back draws it again exactly."""
    from rotviz.app.export import rows_to_csv

    rows = entry.table(results)
    text = rows_to_csv(rows)
    return rows, text, entry.figure(read_table(text))


def make(selected: Sequence[Entry], pair: Pair, device: Any = "cpu",
         say: Callable[[str], None] | None = None) -> list[Made]:
    """Every entry of `selected` made on `pair` (the test split of its data); `say` hears a
    line once the inputs are read, then one per run (the measurement's own summary). The
    pair is matched once per SPEC, and the endpoints shared by every entry."""
    from rotviz.data.reading import split_for
    from rotviz.devices import pair_params, resolve_device, threads_for
    from rotviz.match.endpoints import match_endpoints
    from rotviz.runner import measure
    from rotviz.sources.loading import load_model

    device = resolve_device(device)
    anchor, source = load_model(pair.anchor), load_model(pair.source)
    split = split_for(anchor, pair.data, "test")  # every input read and checked: now say so
    if say is not None:
        say(f"making {len(selected)} figure(s) on {pair.anchor} / {pair.source}, {pair.data} "
            f"{split.split} split ({split.n} examples), {device}")
    # a small pair's many small operations lose more than they gain on a second thread
    # (a Fisher merge of the default pair on a busy 2-core machine: 1.7 s on one, 65 s on two)
    threads = threads_for(pair_params(anchor.state, source.state), device)
    ends: dict[str, Any] = {}
    out = []
    with threads:
        total = sum(len(e.runs) for e in selected)
        k = 0
        for e in selected:
            t0 = time.perf_counter()
            record = e.record()
            results = []
            for run in e.runs:
                k += 1
                if run.match not in ends:
                    ends[run.match] = match_endpoints(anchor, source, run.match, device,
                                                      data=split)
                r = measure(e.measurement, ends[run.match], split, device, **run.params)
                results.append(r.to_dict())
                if say is not None:
                    line = record.summary(r, "") if record.summary else e.measurement
                    say(f"[{k}/{total}] {e.name}, --match {run.match}: {line}")
            rows, text, fig = drawn(e, results)
            out.append(Made(e, results, rows, text, fig, time.perf_counter() - t0))
    return out


def write(folder: Path, made: Sequence[Made], pair: Pair, pngs: Sequence[bytes] | None,
          command: Callable[[Entry], str]) -> None:
    """The gallery's files into `folder` (a new, empty temporary folder: rotviz.outputs
    renames it into place): per entry NAME.html, NAME.png (where `pngs` are given), NAME.csv,
    NAME.json and NAME.command.txt (`command(entry)`: the line that remakes it, then each
    run's), and report.html."""
    from rotviz.gallery.report import commands_text, report_html
    from rotviz.outputs import write_json_file
    from rotviz.plots.images import html

    for i, m in enumerate(made):
        name = m.entry.name
        (folder / f"{name}.html").write_text(html(m.figure), encoding="utf-8")
        if pngs is not None:
            (folder / f"{name}.png").write_bytes(pngs[i])
        (folder / f"{name}.csv").write_text(m.csv, encoding="utf-8")
        # through the one JSON writer: stamped, and strict (no NaN or Infinity)
        write_json_file(folder / f"{name}.json", m.to_dict(pair), "figures")
        (folder / f"{name}.command.txt").write_text(commands_text(m.entry, pair, command),
                                                    encoding="utf-8")
    (folder / "report.html").write_text(report_html(made, pair, command), encoding="utf-8")

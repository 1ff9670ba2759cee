"""report.html: every figure of a gallery in one self-contained page for a reading group.

plotly.js is inlined once (the copy inside the installed plotly package), each figure is a
`div` that calls it, and each comes with its caption, the commands that regenerate it and
its table. Nothing is fetched: the page opens offline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from rotviz.gallery.registry import Entry, Pair

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.45; }
section { border-top: 1px solid #ccc; margin-top: 2.5em; padding-top: 1em; }
pre { background: #f4f4f4; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
table { border-collapse: collapse; font-size: 0.8em; }
td, th { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { background: #f0f0f0; }
.paper { color: #555; font-style: italic; }
"""


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return escape("" if v is None else str(v))


def table_html(rows: Sequence[dict]) -> str:
    """The rows as an HTML table, columns in first-seen order."""
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = "\n".join("<tr>" + "".join(f"<td>{_cell(r.get(c))}</td>" for c in cols) + "</tr>"
                     for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>"


def report_html(made: Sequence[Any], pair: Pair, command: Callable[[Entry], str]) -> str:
    """One page: a title, the pair, a list of the figures, then each made figure
    (rotviz.gallery.make.Made) with its caption, its commands and its table."""
    from plotly.offline import get_plotlyjs

    from rotviz.version import __version__

    items = "".join(f'<li><a href="#{m.entry.name}">{escape(m.entry.title)}</a></li>'
                    for m in made)
    parts = []
    for m in made:
        e = m.entry
        div = m.figure.to_html(include_plotlyjs=False, full_html=False, div_id=f"fig-{e.name}")
        parts.append(
            f'<section id="{e.name}"><h2>{escape(e.title)}</h2>'
            f'<p class="paper">{escape(e.paper)}</p>\n{div}\n<p>{escape(e.caption)}</p>'
            f"<h3>Regenerate it</h3><pre>{escape(commands_text(e, pair, command))}</pre>"
            f"<details><summary>Data: {len(m.rows)} rows ({escape(e.name)}.csv)</summary>"
            f"{table_html(m.rows)}</details></section>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>rotviz: paper figures</title>"
        f"<style>{STYLE}</style>\n<script>{get_plotlyjs()}</script>\n</head><body>"
        f"<h1>Paper figures, reproduced with rotviz</h1>"
        f"<p>Anchor <code>{escape(pair.anchor)}</code>, source <code>{escape(pair.source)}"
        f"</code>, data <code>{escape(pair.data)}</code> (test split); rotviz {__version__}. "
        "Each figure lies beside its data (CSV, JSON) and the commands that make it; this page "
        "opens offline.</p>"
        f"<ol>{items}</ol>\n" + "\n".join(parts) + "\n</body></html>\n")


def commands_text(entry: Entry, pair: Pair, command: Callable[[Entry], str]) -> str:
    """NAME.command.txt: the command that remakes the figure with its data, then one
    measurement command per run, each of which gives that run's numbers alone."""
    runs = "\n".join(entry.commands(pair))
    return (f"# {entry.title} ({entry.paper})\n# the figure, its data and this file:\n"
            f"{command(entry)}\n# each run's numbers alone, one measurement per line:\n"
            f"{runs}\n")

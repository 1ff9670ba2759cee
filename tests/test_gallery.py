"""The paper-figure gallery (rotviz.gallery, `rotviz figures`): the cheapest figure made in
process on the zoo's default pair writes its figure, data, commands and a report; its CSV
redraws the written figure exactly; its numbers equal a plain computation; refusals are one
line, exit 2, before any work."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

import pytest
from conftest import refused

from rotviz.plots import images

A, B = "zoo:vit-digits-s3", "zoo:vit-digits-s6"
NAME = "fig4_distances"  # data-free: five cheap matchings, no evaluation


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, str]:
    """`rotviz figures --out DIR --only fig4_distances` in process (a PNG where a browser is)."""
    from rotviz.cli import main

    out = tmp_path_factory.mktemp("gallery") / "figs"
    png = images.why_not() is None
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["figures", "--out", str(out), "--only", NAME]
                    + ([] if png else ["--no-png"])) == 0
    return out, buf.getvalue()


def _plotted(html: str) -> list[list]:
    """The trace data of every Plotly.newPlot call in a page, as the page holds them."""
    dec = json.JSONDecoder()
    out, at = [], 0
    while (at := html.find("Plotly.newPlot(", at)) >= 0:
        at += len("Plotly.newPlot(")
        _, at = dec.raw_decode(html, html.index('"', at))  # the div's id
        data, at = dec.raw_decode(html, html.index("[", at))
        out.append(data)
    return out


def test_figures_writes_each_figure_its_data_commands_and_a_report(made):
    out, printed = made
    png = images.why_not() is None
    want = {f"{NAME}.{s}" for s in ("html", "csv", "json", "command.txt")} | \
        ({f"{NAME}.png"} if png else set()) | {"report.html", "rotviz-output.json"}
    assert {p.name for p in out.iterdir()} == want
    # a progress line per run (the measurement's own summary), then what was written
    runs = [ln for ln in printed.splitlines() if ln.startswith("[")]
    assert [ln.split(": ", 1)[0] for ln in runs] == [
        f"[{i}/5] {NAME}, --match {m}" for i, m in
        enumerate(("none", "ffn", "attn", "ffn,attn", "seed"), 1)]
    assert printed.rstrip().endswith(f"report.html to {out}")
    if png:
        assert (out / f"{NAME}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the numbers: unmatched, the distance is the plain norm of the weights' difference; every
    # matching lowers it, and the seed paper's matching most
    import torch

    from rotviz.gallery import read_table
    from rotviz.sources.loading import load_model

    a, b = load_model(A).state, load_model(B).state
    plain = float(torch.sqrt(sum(((a[k].double() - b[k].double()) ** 2).sum()
                                 for k in a if k in b and a[k].is_floating_point())))
    rows = read_table((out / f"{NAME}.csv").read_text())
    total = {r["match"]: r["after"] for r in rows if r["by"] == "total"}
    assert list(total) == ["none", "ffn", "attn", "ffn,attn", "seed"]
    assert total["none"] == pytest.approx(plain, rel=1e-9)
    assert all(r["before"] == pytest.approx(plain, rel=1e-9) for r in rows if r["by"] == "total")
    assert total["seed"] == min(total.values()) < total["ffn"] < total["none"]
    # per layer the squares add up to the total (the rows are the record's own)
    for m, t in total.items():
        layer = [r["after"] for r in rows if r["match"] == m and r["by"] == "layer"]
        assert sum(x * x for x in layer) == pytest.approx(t * t, rel=1e-9)
    # the JSON holds every run's command and result; the commands file remakes it
    body = json.loads((out / f"{NAME}.json").read_text())
    assert body["rotviz"]["command"] == "figures" and body["anchor"] == A
    assert [r["result"]["distance_after"] for r in body["runs"]] == list(total.values())
    cmd = (out / f"{NAME}.command.txt").read_text().splitlines()
    assert f"rotviz figures --out figures-{NAME} --only {NAME} --anchor {A} --source {B} " \
           "--data digits" in cmd[2]
    assert f"rotviz distances {A} {B} --match ffn,attn --json {NAME}-4.json" in cmd
    # one self-contained report: plotly.js inlined once, the figure, its caption, commands, table
    from plotly.offline import get_plotlyjs

    from rotviz.gallery import entry

    report = (out / "report.html").read_text()
    assert report.count(get_plotlyjs()[:300]) == 1 and "<script src=" not in report
    e = entry(NAME)
    for text in (e.title, escape(e.caption), f"rotviz distances {A} {B} --match seed", "<table>"):
        assert text in report
    assert len(_plotted(report)) == 1


def test_the_csv_redraws_the_written_figure(made):
    import plotly.io as pio

    from rotviz.gallery import entry, read_table

    out, _ = made
    e = entry(NAME)
    rebuilt = e.figure(read_table((out / f"{NAME}.csv").read_text()))
    (written,) = _plotted((out / f"{NAME}.html").read_text())
    assert json.loads(pio.to_json(rebuilt))["data"] == written
    assert written[0]["y"] == ["no matching", "FFN permutation", "attention rotation",
                               "FFN permutation + attention rotation",
                               "FFN + attention + rescale (seed paper)"]
    totals = [r["after"] for r in read_table((out / f"{NAME}.csv").read_text())
              if r["by"] == "total"]
    assert written[0]["x"] == totals


def test_refusals_are_one_line_before_any_work(capfd, ws):
    refused(["figures", "--out", "full", "--only", NAME], capfd, ws, "--out 'full'",
            "already holds files")
    refused(["figures", "--out", "new", "--only", "fig4_distances,nope"], capfd, ws,
            "no gallery figure 'nope'", "fig5_barriers")
    refused(["figures", "--out", "new", "--only", ","], capfd, ws, "--only names no figure")

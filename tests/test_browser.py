"""The app in a real browser: Debian's chromium driven by playwright (no browser download).

Starts `streamlit run app.py` on a free localhost port, opens every page, presses Run on the
Barrier page, waits for the chart and saves a screenshot. Skipped where the `playwright`
package or a `chromium` binary is missing (CI installs both: apt `chromium`, pip
`playwright`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlparse

import pytest

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH")

from bench.screenshots import (  # noqa: E402
    CHROMIUM_ARGS,
    IDLE,
    PAGES,
    drawn,
    free_port,
    start_server,
    still_page,
    wait_healthy,
)


@contextlib.contextmanager
def serving(root):
    """A fresh app server on a free port: the zoo's default pair when the zoo ships, else two
    tiny random ViTs saved under `root`."""
    from rotviz.app import roots as app_roots
    from rotviz.random_models import save_random

    # one torch thread, as the suite's workers run: the server shares the 2 cores with them
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        app_roots.default_pair(app_roots.default_roots())
    except Exception:
        for seed in (0, 1):
            if not (root / f"vit-s{seed}").exists():
                save_random("vit", root / f"vit-s{seed}", seed=seed, layers=2, d=32, heads=4,
                            ffn=64, image=8, patch=2, channels=1, labels=10)
        env[app_roots.ENV_ROOTS] = str(root)
    port = free_port()
    proc = start_server(port, env)
    try:
        wait_healthy(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


NAV = ["Models", "Match", "Barrier", "Spectra", "Merge", "Landscape", "Function", "Training",
       "Learn",
       "Measure", "Gallery"]


# Test images per evaluation: enough for every chart to draw (the numbers are checked by
# tests/test_app.py on 100).
N = 32
# The smallest runs of the sections that compute on Run: the browser test checks that each
# draws, tests/test_app.py checks their numbers.
SMALL = {
    "landscape": "&l_slice_grid=5&l_bend_steps=5&l_bend_points=5&l_layerwise_points=3"
                 "&l_hessian_iterations=5&l_hessian_examples=32&l_hessian_top=1",
    "training": "&t_training_points=3&t_spawn_points=3",
    # the fusion table with its widest method label and a method that reads statistics: the
    # other methods' numbers are tests/test_app.py's and the library's
    "merge": "&" + urlencode({"g_methods": ["simple average", "RegMean"]}, doseq=True),
}


def press_first_run(page) -> None:
    """Press the page's first Run and wait for its results to draw. The other sections'
    Runs are pressed, and their numbers checked, by tests/test_app.py (AppTest:
    test_landscape_page_computes_each_section_on_run, test_training_page_runs_both_charts_on_
    the_zoo_series); pressing them here too cost about 40 s of the suite for charts of kinds
    the other pages already draw in Chromium."""
    drawn(page)
    page.locator("[data-testid='stFormSubmitButton'] button").first.click()
    page.wait_for_timeout(300)
    drawn(page)


def tables_fit(page, name: str) -> None:
    """Every table on the page fits its width (no column cut off on the right), the ones
    folded in expanders included: the shut ones are opened first (the export's is left
    shut; one already open, such as a status box still expanded on a busy machine, is left
    open: a click would fold its table away)."""
    shut = "[data-testid='stExpander'] details:not([open]) > summary"
    for summary in page.locator(shut).element_handles():  # handles: opening one shrinks the set
        if not any(w in summary.inner_text() for w in ("Export", "folder")):
            summary.click()
    n = page.locator("[data-testid='stDataFrame']").count()
    if not n:
        return
    try:
        page.wait_for_function(
            "n => [...document.querySelectorAll('[data-testid=stDataFrame] .dvn-scroller')]"
            ".filter(s => s.clientWidth > 0).length === n", arg=n, timeout=180_000)
    except playwright.TimeoutError:
        raise AssertionError(f"{name}: not every one of its {n} tables was drawn") from None
    widths = page.evaluate(
        "() => [...document.querySelectorAll('[data-testid=stDataFrame] .dvn-scroller')]"
        ".map(s => [s.scrollWidth, s.clientWidth])")
    assert all(sw <= cw + 1 for sw, cw in widths), (name, widths)


def nav_titles(page) -> list[str]:
    links = page.locator("[data-testid='stSidebarNav'] a").all_inner_texts()
    return [t.split()[-1] for t in links]  # icon name, then the title


def test_every_page_then_a_users_classifier_pair_and_csv(tmp_path, monkeypatch):
    """One fresh server (each costs seconds of CPU) for: its first request, a page URL with a
    query string (first_request_is_a_page_url); every page on the default pair, which the
    zoo offers whatever the roots; the ladder and the gallery; the Barrier page's Run; then,
    acceptance, a user's sequence-classification pair and a CSV under the model root
    (users_classifier_pair)."""
    from rotviz.app import roots as app_roots

    root = users_classifier_folder(tmp_path / "user")
    monkeypatch.setenv(app_roots.ENV_ROOTS, str(root))
    with serving(tmp_path) as server, playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = still_page(browser, viewport={"width": 1280, "height": 1600})
        first_request_is_a_page_url(server, page)
        # the sidebar's labels, in the order shown, as `rotviz barrier ANCHOR SOURCE` reads
        anchor = page.get_by_text("Anchor (model 1, stays fixed)")
        source = page.get_by_text("Source (model 2, gets matched)")
        assert anchor.count() == source.count() == 1
        assert anchor.bounding_box()["y"] < source.bounding_box()["y"]
        for name in PAGES:
            page.goto(f"{server}/{'' if name == 'models' else name}?n={N}{SMALL.get(name, '')}")
            if name in ("landscape", "function", "training"):  # compute only on Run
                press_first_run(page)
            # the page's own results, not only an idle script: right after a navigation the
            # app may still read "not running" before this page's run has begun (busy CPUs)
            page.wait_for_selector(".js-plotly-plot, [data-testid='stMetric'], "
                                   "[data-testid='stException']", timeout=180_000)
            page.wait_for_selector(IDLE, timeout=180_000)
            page.wait_for_timeout(300)
            drawn(page)
            assert page.locator("[data-testid='stException']").count() == 0, name
            assert page.locator("h1").first.inner_text().strip()
            assert page.locator(".js-plotly-plot, [data-testid='stMetric']").count() > 0, name
            if name == "barrier":  # a small pair: computed on open, and the page says so
                assert page.get_by_text("Computed on open", exact=True).count() == 1
                assert page.get_by_text("Interpolating: computed on open: done in").count() == 1
                barrier_run(page, tmp_path)  # then its Run, on this visit (tables checked)
            else:
                tables_fit(page, name)
        gallery(page, server)
        ladder(page, server)
        users_classifier_pair(page, server, root)
        browser.close()


def barrier_run(page, tmp_path: Path) -> None:
    """The Barrier page's Run, pressed on the loop's visit (its default options, which the
    Models page's warm-up computed): it says that it ran, and its charts, banner, accuracy
    axis and tables agree; then a screenshot. It was a second visit of the page (7 points),
    whose load and drawing cost about 16 s of CPU, most of it Chromium's, for these checks."""
    page.locator("[data-testid='stFormSubmitButton'] button").first.click()
    page.wait_for_timeout(300)
    drawn(page)
    # Run shows that it ran: the box (and a toast) say so, with its time and what it
    # computed
    assert page.locator("[data-testid='stExpander'] summary").filter(
        has_text="Interpolating: Run: done in").count() == 1
    charts = page.locator(".js-plotly-plot")
    assert charts.count() >= 2
    title = charts.first.locator(".gtitle").text_content() or ""
    # the default options include no matching: the title does not say "matched source"
    assert title == "Loss along the straight path from anchor to source, with and without " \
                    "matching"
    assert charts.first.locator(".scatterlayer .trace").count() >= 5
    # the banner states what each matching did, with the legend's barriers
    legend = page.evaluate("() => document.querySelector('.js-plotly-plot').data"
                           ".filter(t => t.showlegend !== false).map(t => t.name)")
    banner = page.locator("[data-testid='stAlert']").filter(
        has_text="Barrier without matching").inner_text()
    for entry in legend:
        label, barrier = entry.rsplit(" (barrier ", 1)
        if label == "no matching":
            assert f"Barrier without matching: {barrier[:-1]}." in banner, banner
        else:
            assert f"{label}: " in banner and (f"lowered it to {barrier[:-1]}" in banner
                                               or f"raised it to {barrier[:-1]}" in banner
                                               or f"kept it at {barrier[:-1]}" in banner)
    # the accuracy axis follows the curves (0-1 only when asked for)
    from rotviz.plots.style import acc_range

    acc = page.evaluate("() => { const p = document.querySelectorAll('.js-plotly-plot')[1];"
                        " return [p.layout.yaxis.range,"
                        " p.data.flatMap(t => Array.from(t.y))]; }")
    assert acc[0] == pytest.approx(acc_range(acc[1]), abs=1e-9)
    tables_fit(page, "barrier")
    shot = tmp_path / "barrier.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def gallery(page, server: str) -> None:
    """The Gallery computes on Run; with one cheap figure asked for in the URL (data-free
    distances), Run draws it with its title, axis titles, a legend and the Okabe-Ito colours,
    and the commands that make it again."""
    from rotviz.gallery import entry
    from rotviz.plots.style import OKABE_ITO

    e = entry("fig4_distances")
    page.goto(f"{server}/gallery?n={N}&" + urlencode({"g_names": e.title}))
    drawn(page)
    assert page.locator(".js-plotly-plot").count() == 0  # nothing before Run
    page.locator("[data-testid='stFormSubmitButton'] button").first.click()
    page.wait_for_selector(".js-plotly-plot", timeout=180_000)
    drawn(page)
    fig = page.evaluate("() => { const p = document.querySelector('.js-plotly-plot');"
                        " return [p.layout.title.text, p.layout.xaxis.title.text,"
                        " p.layout.yaxis.title.text, p.layout.showlegend,"
                        " p.data.map(t => t.marker.color)]; }")
    assert fig[0] == e.title and "distance" in fig[1] and fig[2] and fig[3] is True, fig
    assert set(fig[4]) <= set(OKABE_ITO), fig[4]
    assert page.get_by_text("rotviz distances", exact=False).count() >= 1


def ladder(page, server: str) -> None:
    """The symmetry ladder on the Measure page (rungs none and seed asked for in the URL, the
    whole test split): Run draws it; the align-to-self rung reads 0.0000 for barrier and
    distance, and every rung's barrier and distance equal `rotviz ladder`'s for the same
    options (1e-6)."""
    import json
    from pathlib import Path

    from rotviz.app import roots as app_roots
    from rotviz.plots.style import OKABE_ITO, nice_label

    try:
        app_roots.default_pair(app_roots.default_roots())
    except Exception:  # the server runs on two random ViTs: their ladder is not the zoo's
        return
    from rotviz.measures import measurement

    specs = ["none", "seed"]  # the URL holds what the widgets show: labels
    page.goto(f"{server}/measure?x_ladder_points=21&" + urlencode(
        {"x_name": measurement("ladder").label,
         "x_ladder_specs": [nice_label(sp) for sp in specs]}, doseq=True))
    drawn(page)
    page.locator("[data-testid='stFormSubmitButton'] button").first.click()
    page.wait_for_selector(".js-plotly-plot", timeout=180_000)
    drawn(page)
    assert page.locator("[data-testid='stException']").count() == 0
    fig = page.evaluate("() => { const p = document.querySelector('.js-plotly-plot');"
                        " return [p.layout.title.text, p.layout.xaxis.title.text,"
                        " p.layout.yaxis.title.text, p.layout.showlegend,"
                        " p.data.filter(t => t.type === 'bar').map(t => [t.name,"
                        " Array.from(t.x), Array.from(t.text), t.marker.color])]; }")
    title, x_title, y_title, legend, bars = fig
    assert title.startswith("The symmetry ladder") and "barrier" in x_title and y_title, fig
    assert legend is True and {b[3] for b in bars} <= {*OKABE_ITO, "#000000"}, bars
    barrier, distance = (next(b for b in bars if b[0] == n) for n in
                         ("loss barrier", "distance to the anchor"))
    own = [b for b in bars if b[3] == "#000000"]  # align-to-self, one bar per panel
    assert [b[2][0] for b in own[:2]] == ["0.0000", "0.0000"], own
    # each rung is `rotviz barrier --match SPEC` on 21 points (tests/measures/test_ladder.py), whose
    # results on this pair are pinned (tests/data/pinned.json, test_pinned)
    pins = json.loads((Path(__file__).parent / "data" / "pinned.json").read_text())
    cli = [pins[f"barrier {sp}"] for sp in specs]
    assert barrier[1] == pytest.approx([c["barrier"] for c in cli], abs=1e-6)
    assert distance[1] == pytest.approx([c["distance_after"] for c in cli], abs=1e-6)


def first_request_is_a_page_url(base: str, page) -> None:
    """A fresh server whose very first request is /barrier with a query string: the visitor
    gets the real app (rotviz/ui/main.py's sidebar and navigation, the pages by title) on the
    Barrier page, with the URL and every query parameter kept, and the page computes with them
    (7 points on the path)."""
    specs = ["no matching", "FFN + attention + rescale (seed paper)"]  # as the URL has them
    page.goto(f"{base}/barrier?n={N}&b_points=7&" + urlencode({"b_specs": specs}, doseq=True))
    drawn(page)
    page.wait_for_timeout(500)
    drawn(page)
    assert nav_titles(page) == NAV
    assert page.locator("h1").first.inner_text().strip() == \
        "Loss barriers between the two models"
    assert page.get_by_text("Anchor (model 1, stays fixed)").count() == 1
    url = urlparse(page.url)
    assert url.path == "/barrier", page.url
    want = {"n": [str(N)], "b_points": ["7"], "b_specs": specs}
    assert parse_qs(url.query) == want, page.url
    assert page.locator("[data-testid='stException']").count() == 0
    lengths = page.evaluate("() => document.querySelector('.js-plotly-plot').data"
                            ".filter(t => t.showlegend !== false).map(t => t.y.length)")
    assert lengths == [7, 7], lengths


def users_classifier_folder(root: Path) -> Path:
    """A user's model root: two RoBERTa sequence classifiers (seeds 0 and 1) with their
    WordPiece tokenizer, and a CSV of labelled reviews."""
    import csv

    import torch
    from test_tasks import _config, _head_class, _rows
    from test_tokens import _wordpiece

    tok = _wordpiece("<s>", "</s>")
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = _head_class("roberta", "seq-cls")(_config("roberta", len(tok), "seq-cls"))
        model.eval().save_pretrained(root / f"cls-{seed}")
        tok.save_pretrained(root / f"cls-{seed}")
    with open(root / "reviews.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["text", "label"])
        w.writeheader()
        w.writerows({"text": r["text"], "label": r["label"]} for r in _rows(120))
    return root


def users_classifier_pair(page, base: str, root: Path) -> None:
    """Acceptance: a user's sequence-classification pair and a CSV under a model root. The
    Barrier and Merge pages draw curves and bars, with F1 shown."""
    q = urlencode({"anchor_path": str(root / "cls-0"), "source_path": str(root / "cls-1"),
                   "data_path": f"csv:{root / 'reviews.csv'}", "b_points": "5",
                   "g_specs": ["none", "seed"], "g_methods": ["simple average", "RegMean"]},
                  doseq=True)
    page.goto(f"{base}/barrier?{q}")
    drawn(page)
    page.wait_for_timeout(500)
    drawn(page)
    assert page.locator("[data-testid='stException']").count() == 0
    assert page.locator("[data-testid='stAlert']").filter(has_text="error").count() == 0
    charts = page.locator(".js-plotly-plot")
    assert "Loss along the straight path" in (charts.first.locator(".gtitle")
                                              .text_content() or "")
    assert page.get_by_text("macro-F1", exact=False).count() >= 2  # one per curve
    page.goto(f"{base}/merge?{q}")
    drawn(page)
    page.wait_for_timeout(500)
    drawn(page)
    assert page.locator("[data-testid='stException']").count() == 0
    titles = [c.locator(".gtitle").text_content() or ""
              for c in page.locator(".js-plotly-plot").all()]
    assert "Merged model macro-F1 per fusion method" in titles, titles
    f1 = page.locator(".js-plotly-plot").nth(titles.index(
        "Merged model macro-F1 per fusion method"))
    assert f1.locator(".barlayer .trace").count() == 2  # none and seed

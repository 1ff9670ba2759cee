"""Open the app in a real browser, screenshot every page and time what a user waits for.

Not part of CI: it needs Debian's `chromium` (apt) and the `playwright` Python package
(`pip install playwright`, which downloads no browser). It starts
`rotviz serve` (streamlit, headless) on a free localhost port, then:

- times the first paint of the Models page: from `streamlit run` to its results, in a browser
  already open (as a user's is; the launch is timed apart), with models loading. On the
  default pair the first results are the test numbers the zoo cards recorded for the same
  split (rotviz/ui/views/models.py), then the page's own evaluation and functional check replace
  them: both times are listed;
- opens the Barrier page and times until its first curves are drawn and until all of them
  are (its default matching options x 21 points on the default pair), then presses Run again
  (the cached rerun) and once more on 17 points (uncached);
- screenshots every page (plus the Match page with the residual stream, and presenter mode)
  into --out;
- writes the timings to bench/RESULTS.md (section "app"), unless --no-results, with the
  load average before and after each run: the whole sequence runs `--runs` times (default
  2), each on a fresh server, with the screenshots taken in the last.

    .venv/bin/python bench/screenshots.py --out /tmp/rotviz-shots
    .venv/bin/python bench/screenshots.py --first-paint --runs 5   # the Models page only
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = ("models", "match", "barrier", "spectra", "merge", "landscape", "function", "training",
         "learn",
         "measure")
IDLE = "[data-testid='stApp'][data-test-script-state='notRunning']"
# The Models page's own cards (its "test accuracy"), which replace the zoo cards' recorded
# numbers ("test accuracy (recorded)") that it draws first on the default pair
OWN_CARDS = ("() => [...document.querySelectorAll(\"[data-testid='stMetricLabel']\")]"
             ".some(e => e.innerText.trim() === 'test accuracy')")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage"]
# Every CSS animation and transition stopped, in each document a page opens: while a page
# computes, Streamlit's running indicator and spinners animate, and Chromium without a GPU
# paints them at its full frame rate the whole time (a page's visit took 15 to 40% more
# Chromium CPU seconds with them: the Function page 12.2 -> 10.4 s, Spectra 8.1 -> 4.8 s).
# What is checked and shot is the settled page, which they do not change.
STILL = ("document.addEventListener('DOMContentLoaded', () => {"
         " const s = document.createElement('style');"
         " s.textContent = '*, *::before, *::after { animation: none !important;"
         " transition: none !important; }';"
         " document.head.appendChild(s); });")


def still_page(browser, **options):
    """A new page of `browser` (playwright) whose documents never animate (STILL)."""
    page = browser.new_page(**options)
    page.add_init_script(STILL)
    return page


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, env: dict[str, str]) -> subprocess.Popen:
    """`rotviz serve` on localhost (it runs `streamlit run app.py` headless)."""
    cmd = [sys.executable, "-m", "rotviz", "serve", "--port", str(port), "--address", "127.0.0.1"]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                return time.perf_counter() - t0
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("the app did not answer its health check in time")


def drawn(page, timeout_ms: int = 180_000) -> None:
    """Wait until the script has finished and every plotly chart has drawn."""
    page.wait_for_selector(IDLE, timeout=timeout_ms)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot')]"
        ".every(p => p.querySelector('.main-svg'))",
        timeout=timeout_ms,
    )


def settle(page, timeout_ms: int = 180_000) -> None:
    """`drawn`, then a little more for reruns right after connecting and plotly transitions."""
    drawn(page, timeout_ms)
    page.wait_for_timeout(300)
    drawn(page, timeout_ms)
    page.wait_for_timeout(500)


def shoot(page, path: Path, width: int) -> None:
    """A screenshot of the whole page: Streamlit scrolls inside its main section, so grow the
    viewport to the content's height first."""
    h = page.evaluate(
        "() => Math.max(...[...document.querySelectorAll('[data-testid=stMain], "
        "[data-testid=stSidebarContent]')].map(e => e.scrollHeight))"
    )
    page.set_viewport_size({"width": width, "height": int(min(max(h + 40, 900), 9000))})
    settle(page)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size({"width": width, "height": 1000})


def click_and_wait(page, locator) -> float:
    """Press a button and return the seconds until the rerun has finished and drawn."""
    t0 = time.perf_counter()
    locator.click()
    try:
        page.wait_for_selector("[data-test-script-state='running']", timeout=3000)
    except Exception:  # a fast rerun may finish before we look
        pass
    drawn(page)
    return time.perf_counter() - t0


def measure(args, out: Path, shots: bool) -> dict[str, float]:
    """One run on a fresh server: the timings of what a user waits for, and (with `shots`)
    the screenshots of every page."""
    from playwright.sync_api import sync_playwright

    from rotviz.app.specs import DEFAULT_SPECS

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    env = dict(os.environ)
    if args.roots:
        env["ROTVIZ_MODEL_ROOTS"] = args.roots
    port = free_port()
    timings: dict[str, float] = {}
    options = f"{len(DEFAULT_SPECS)} options"
    with sync_playwright() as p:
        # The browser is open before the clock starts, as a user's is: the time runs from
        # `streamlit run` to the Models page's first results (its launch is listed apart).
        t0 = time.perf_counter()
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = still_page(browser, viewport={"width": args.width, "height": 1000})
        timings["browser launch (not counted below)"] = time.perf_counter() - t0
        t_start = time.perf_counter()
        proc = start_server(port, env)
        try:
            timings["server answers"] = wait_healthy(port, proc)
            base = f"http://127.0.0.1:{port}"
            q = f"?{args.query}" if args.query else ""
            page.goto(f"{base}/{q}")
            page.wait_for_selector("[data-testid='stMetric']", timeout=120_000)
            timings["first paint with results (Models page)"] = time.perf_counter() - t_start
            page.wait_for_function(OWN_CARDS, timeout=120_000)
            timings["Models page: its own evaluation and check drawn"] = (
                time.perf_counter() - t_start)
            settle(page)
            if shots:
                shoot(page, out / "models.png", args.width)
            if args.first_paint:
                return timings

            t0 = time.perf_counter()
            page.goto(f"{base}/barrier{q}")
            page.wait_for_selector("[data-testid='stFormSubmitButton'] button", timeout=120_000)
            page.wait_for_function(  # the first curves, drawn while the others compute
                "() => document.querySelector('.js-plotly-plot .main-svg')", timeout=180_000)
            timings["Barrier: first visit, first curves drawn"] = time.perf_counter() - t0
            page.wait_for_timeout(300)
            drawn(page)  # the default pair computes on first visit
            timings[f"Barrier: first visit, {options} x 21 points computed"] = (
                time.perf_counter() - t0)
            settle(page)
            run = page.locator("[data-testid='stFormSubmitButton'] button").first
            timings["Barrier: Run again (cached rerun)"] = click_and_wait(page, run)
            settle(page)
            if shots:
                shoot(page, out / "barrier.png", args.width)

            # A fresh configuration (17 points: not cached yet), so Run really computes.
            thumb = page.locator("[data-testid='stSlider'] input[type='range']").first
            thumb.focus()
            page.keyboard.press("ArrowLeft")
            page.keyboard.press("ArrowLeft")
            assert thumb.get_attribute("aria-valuetext") == "17", "the points slider did not move"
            timings[f"Barrier: Run, {options} x 17 points, uncached"] = click_and_wait(page, run)

            for name in PAGES:
                if name in ("models", "barrier"):
                    continue
                t0 = time.perf_counter()
                page.goto(f"{base}/{name}{q}")
                settle(page)
                if name in ("landscape", "function", "training"):  # computed on Run: press each
                    runs = page.locator("[data-testid='stFormSubmitButton'] button")
                    for i in range(runs.count()):
                        runs.nth(i).click()
                        page.wait_for_timeout(300)
                        settle(page)
                timings[f"{name.capitalize()} page"] = time.perf_counter() - t0
                if shots:
                    shoot(page, out / f"{name}.png", args.width)
            if shots:
                sep = "&" if q else "?"
                # the Match page with the residual stream: alternation history and eigen-angles
                page.goto(f"{base}/match{q}{sep}m_residual=true&m_barrier=false")
                settle(page)
                shoot(page, out / "match-residual.png", args.width)
                page.goto(f"{base}/barrier{q}{sep}present=true")
                settle(page)
                shoot(page, out / "presenter.png", args.width)
                page.goto(f"{base}/match{q}{sep}anchor_path=/etc")
                settle(page)
                shoot(page, out / "outside-roots.png", args.width)
        finally:
            browser.close()
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
    return timings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/rotviz-shots", help="folder for the PNGs")
    ap.add_argument("--roots", default=None, help="ROTVIZ_MODEL_ROOTS for the server")
    ap.add_argument("--query", default="", help="extra query string for every page, e.g. n=100")
    ap.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    ap.add_argument("--runs", type=int, default=2,
                    help="runs, each on a fresh server (screenshots in the last); default 2")
    ap.add_argument("--width", type=int, default=1440)
    ap.add_argument("--first-paint", action="store_true",
                    help="time the Models page's first paint only (section app-first-paint)")
    args = ap.parse_args(argv)

    if (shutil.which("chromium") or shutil.which("chromium-browser")) is None:
        print("screenshots: no chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, float]] = []
    loads: list[tuple[float, float]] = []
    for k in range(max(args.runs, 1)):
        before = os.getloadavg()[0]
        runs.append(measure(args, out, shots=k == max(args.runs, 1) - 1))
        loads.append((before, os.getloadavg()[0]))
        print(f"run {k + 1}: load average {before:.2f} at the start, {loads[-1][1]:.2f} at "
              "the end")
        for name, sec in runs[-1].items():
            print(f"  {name}: {sec:.2f} s")
    print(f"screenshots in {out}")
    if not args.no_results:
        sys.path.insert(0, str(REPO))
        from bench.results import machine, write_section

        heads = " | ".join(f"run {k + 1}" for k in range(len(runs)))
        rows = "\n".join(f"| {name} | " + " | ".join(f"{r.get(name, float('nan')):.2f}"
                                                      for r in runs) + " |"
                         for name in runs[0])
        load_row = "| load average (1 min) at start → end | " + " | ".join(
            f"{a:.2f} → {b:.2f}" for a, b in loads) + " |"
        body = (f"Machine: {machine('cpu')}\n\nReal browser (Debian chromium via playwright), "
                f"default pair{', ' + args.query if args.query else ''}; "
                f"`bench/screenshots.py --runs {len(runs)}"
                f"{' --first-paint' if args.first_paint else ''}`, each run on a fresh server. The "
                "machine is shared: the load average says how busy it was. Each time runs "
                "until the script is idle and every chart is drawn, so it includes the browser's "
                "rendering (the server-side share is in app-server-cpu); the Barrier page draws "
                "its curves as they come in, so the first ones show before the rest are "
                "computed. The Models page's first results are the zoo cards' recorded test "
                "numbers for the same split; its own evaluation and check replace them (the "
                "next row). Targets: Models page first paint <= 5 s (issue 29), Barrier first "
                "visit <= 10 s, cached rerun <= 1 s."
                f"\n\n| step | {heads} |\n|---|" + "---|" * len(runs) + "\n"
                + load_row + "\n" + rows)
        write_section("app-first-paint" if args.first_paint else "app", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

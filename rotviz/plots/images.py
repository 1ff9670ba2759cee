"""Figures as static images (PNG, SVG, PDF), one or many at a time: for papers, slides and
the frames of animations.

plotly's renderer, kaleido, draws a figure in a headless Chrome or Chromium. rotviz drives the
one already installed (`.ci/setup` installs Debian's `chromium`; `BROWSER_PATH` names another)
and never downloads one: kaleido's `get_chrome` is never called. Nor does the page it draws in
fetch anything: its plotly.js is the copy inside the installed plotly package, and MathJax
(which kaleido would fetch from a CDN) is off, since no rotviz figure uses LaTeX.

Starting the browser costs 1 to 3 s, drawing a figure in it about 0.1 s, so `render` draws
every figure of one call in one browser.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Sequence
from typing import Any

from rotviz.errors import RotvizError

FORMATS = ("png", "svg", "pdf")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def browser() -> str | None:
    """The Chrome or Chromium kaleido drives: `BROWSER_PATH` when set, else the first of
    BROWSERS on the PATH; None when there is none."""
    given = os.environ.get("BROWSER_PATH")
    if given:
        return given if os.path.isfile(given) and os.access(given, os.X_OK) else None
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def why_not() -> str | None:
    """Why static images cannot be made here (one line), or None when they can."""
    import importlib.util

    # found, not imported: pages ask this on every paint, and importing kaleido costs time
    if importlib.util.find_spec("kaleido") is None:
        return "static images need kaleido (pip install 'rotviz[figures]')"
    if browser() is None:
        return ("static images need a Chrome or Chromium (on Debian: apt-get install chromium;"
                " or set BROWSER_PATH)")
    return None


def available() -> tuple[str, ...]:
    """The static formats this machine can write: FORMATS, or () (see `why_not`)."""
    return () if why_not() else FORMATS


def format_of(path: str | os.PathLike, flag: str = "--figure") -> str:
    """The figure format a file name asks for by its suffix (html or one of FORMATS), or a
    one-line error."""
    suffix = os.fspath(path).rsplit(".", 1)[-1].lower() if "." in os.fspath(path) else ""
    if suffix in ("html", *FORMATS):
        return suffix
    raise RotvizError(f"{flag} {os.fspath(path)}: name the file .html, .png, .svg or .pdf")


def check_format(fmt: str, flag: str = "--figure") -> None:
    """Refuse, in one line and before any work, a static format this machine cannot write."""
    if fmt == "html":
        return
    if fmt not in FORMATS:
        raise RotvizError(f"{flag}: no image format '{fmt}'; use html, {', '.join(FORMATS)}")
    why = why_not()
    if why:
        raise RotvizError(f"{flag}: {why}, or name the file .html")


def render(figures: Sequence[Any], fmt: str = "png", width: int | None = None,
           height: int | None = None, scale: float = 1.0) -> list[bytes]:
    """The bytes of each plotly figure as a `fmt` image (PNG, SVG or PDF), drawn in order in
    one browser. `width` and `height` in CSS pixels (default: each figure's own layout size,
    else 700 x 500); `scale` multiplies a PNG's pixels (2: for slides)."""
    return draw([(fig, fmt) for fig in figures], width, height, scale)


def draw(jobs: Sequence[tuple[Any, str]], width: int | None = None,
         height: int | None = None, scale: float = 1.0) -> list[bytes]:
    """`render` for figures each in its own format: (figure, fmt) pairs, all drawn in one
    browser."""
    for _, fmt in jobs:
        check_format(fmt, "render")
        if fmt == "html":
            raise RotvizError("render draws images; write HTML with rotviz.plots.images.html")
    if not jobs:
        return []
    size: dict[str, Any] = {"scale": scale}
    if width:
        size["width"] = int(width)
    if height:
        size["height"] = int(height)

    async def run() -> list[bytes]:
        import kaleido

        out = []
        async with kaleido.Kaleido(n=1, mathjax=False, path=browser()) as k:
            for fig, fmt in jobs:
                out.append(await k.calc_fig(fig, opts={"format": fmt, **size}))
        return out

    for attempt in range(UNREADY_TRIES):
        try:
            return _run(run())
        except Exception as e:  # noqa: BLE001 - only kaleido's start-up race is retried
            if UNREADY not in str(e) or attempt == UNREADY_TRIES - 1:
                raise
    raise AssertionError("unreachable")


# kaleido (1.x) may evaluate its drawing function in the blank page its tab opened with, not
# in the page it navigated to, when the browser starts slowly on a loaded machine: then the
# page's script "is not defined" (seen once in a suite run of 4240 tests, never alone). The
# drawing is retried in a fresh browser; any other error is raised at once.
UNREADY = "kaleido_scopes is not defined"
UNREADY_TRIES = 3


def _run(coro) -> Any:
    """Run a coroutine to its end from synchronous code, also where an event loop already
    runs in this thread (a notebook, a server): then in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["out"] = asyncio.run(coro)
        except BaseException as e:  # re-raised in the caller's thread
            box["err"] = e

    t = threading.Thread(target=target, name="rotviz-images")
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]
    return box["out"]


def html(figure: Any) -> str:
    """A self-contained HTML page of a figure (plotly.js inlined: opens offline)."""
    return figure.to_html(include_plotlyjs=True, full_html=True)


def write(path: str | os.PathLike, figure: Any, fmt: str) -> None:
    """`figure` as `fmt` (html or one of FORMATS) to the new file `path` (a temporary sibling:
    rotviz.outputs renames it into place)."""
    if fmt == "html":
        with open(path, "x", encoding="utf-8") as f:
            f.write(html(figure))
        return
    data = render([figure], fmt)[0]
    with open(path, "xb") as f:
        f.write(data)

"""Getting the first page ready while the server starts (this file is not a page).

The launcher (app.py) calls `start` from its lifespan, before the server answers its first
request. A daemon thread then imports what the first script run imports (the app's helpers,
then torch, the Models page's modules and plotly) and computes the Models page's two cards
for the pair the app opens on into the app's result cache (`runtime.opening_cards`).

The first paint needs no torch on a machine without a GPU: the first run waits for the
helpers' imports (`ready_frame`, in rotviz/ui/main.py: they load no torch), draws the navigation
and the sidebar (its device picker asks torch only where a GPU may be present:
rotviz.devices.surely_cpu_only), and the Models page shows the zoo cards' recorded numbers.
Meanwhile the thread holds back its torch import (HOLD_S at most), which would otherwise take
half of the one Python interpreter while the server sends the browser the app and runs that
first script. Once the page has drawn what needs no torch, it waits for the thread's imports
(`ready`, which also lets the thread go). So two threads never import the same modules at
once. The page then finds the cards cached, or waits for the one under
way (a result cache computes each key once).

A failure leaves nothing behind: an import that fails is not kept in sys.modules, a card that
fails is not cached, and the page then computes as it would have and says what went wrong.
Process state (one thread per server process) lives here, in rotviz.ui: the library below
keeps none.
This module imports nothing heavy itself: the launcher imports it before the server starts.
"""

from __future__ import annotations

import threading
import time

# Held from `start` until the thread has imported the app's helpers (`ready_frame` waits), and
# until all its imports are over, done or failed (`ready` waits).
_FRAME = threading.Lock()
_IMPORTING = threading.Lock()
_STARTED = threading.Event()  # one start-up per process
# Set when the first run needs torch (`ready`), having drawn what needs none. Until then, for
# at most HOLD_S, the thread waits before importing torch: `import torch` is 2-3 s of pure
# Python, and beside it the server serves the browser the app's files and runs the first
# script at half speed (the GIL), which put the first paint about 1 s later.
_GO = threading.Event()
HOLD_S = 3.0
# Then it waits, for at most QUIET_CAP_S more, until the server has answered every HTTP
# request and heard none for QUIET_S: the browser is still fetching and running the code of
# the elements it has just been sent (Streamlit's frontend loads each kind's code on first use,
# in waves: the sidebar's widgets, then the metrics), and the import beside it put the
# Models page's metrics about 1 s later (measured: first metric 4.0-5.1 s after `streamlit
# run` with a 0.25 s window, 3.3-4.3 s with 0.6 s). The launcher's middleware (`Requests`)
# counts the requests.
QUIET_S, QUIET_CAP_S = 0.6, 2.5
_REQUESTS = {"open": 0, "last": 0.0}
_REQUESTS_LOCK = threading.Lock()


class Requests:
    """ASGI middleware (app.py) that counts the server's HTTP requests under way and when the
    last one ended, for `_quiet` (the websocket is not counted: it stays open)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        with _REQUESTS_LOCK:
            _REQUESTS["open"] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            with _REQUESTS_LOCK:
                _REQUESTS["open"] -= 1
                _REQUESTS["last"] = time.monotonic()


def _quiet() -> None:
    """Wait until no HTTP request is under way and none ended in the last QUIET_S (at most
    QUIET_CAP_S)."""
    end = time.monotonic() + QUIET_CAP_S
    while time.monotonic() < end:
        with _REQUESTS_LOCK:
            idle = _REQUESTS["open"] == 0 and time.monotonic() - _REQUESTS["last"] >= QUIET_S
        if idle:
            return
        time.sleep(0.02)


def start() -> threading.Thread | None:
    """Start the start-up thread (once per process); None when it ran already."""
    if _STARTED.is_set():
        return None
    _STARTED.set()
    _FRAME.acquire()
    _IMPORTING.acquire()
    thread = threading.Thread(target=_work, name="rotviz-start-up", daemon=True)
    try:
        thread.start()
    except BaseException:
        _FRAME.release()
        _IMPORTING.release()
        raise
    return thread


def _work() -> None:
    try:
        try:
            # the first run's own imports (rotviz/ui/main.py's helpers), in its order
            from rotviz.ui import run, runtime, show, sidebar  # noqa: F401
        finally:
            _FRAME.release()
        _GO.wait(HOLD_S)
        _quiet()
        _import_first_run()
    except Exception:  # noqa: BLE001 - the first run imports again and reports what fails
        return
    finally:
        _IMPORTING.release()
    try:
        runtime.opening_cards()
    except Exception:  # noqa: BLE001 - the Models page computes them again and reports it
        pass


def _import_first_run() -> None:
    """What rotviz/ui/main.py, the sidebar and the Models page import beyond the app's helpers
    (rotviz/ui/sidebar.py, runtime.py, run.py, show.py):
    torch (through the device picker), the page's engine names and plotly's figures."""
    import plotly.graph_objects  # noqa: F401

    from rotviz.app import (
        figures,
        summaries,  # noqa: F401
    )
    from rotviz.devices import pick_device  # noqa: F401
    from rotviz.match.pipeline import FUNCTION_TOLERANCE  # noqa: F401

    figures.preload()


def ready_frame() -> None:
    """Wait until the start-up thread has imported the app's helpers (at once when none runs)."""
    with _FRAME:
        pass


def ready() -> None:
    """Wait until the start-up thread's imports are over (at once when none runs), letting
    it start them now if it is holding them back."""
    _GO.set()
    with _IMPORTING:
        pass

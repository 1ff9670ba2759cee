"""rotviz app: the interactive explorer (`rotviz serve`, or `streamlit run app.py` in a checkout).

This file is the launcher. `rotviz serve` runs `streamlit run` on this file, which finds the
`app = st.App(...)` below and serves it with uvicorn; the script each visitor runs is main.py
beside it (the page config, the sidebar, the navigation over views/). The repository's app.py
serves the same App from a checkout, importing `MAIN`, `lifespan` and `MIDDLEWARE` from here.

Why a launcher: the first script run used to import torch (about 2.4 s of pure Python on a
CPU machine) and evaluate the pair only once the browser had connected. The lifespan below
runs as the server starts, before its first request: it starts a background thread
(rotviz/ui/boot.py) that imports what the first run imports and computes the Models page's
two cards for the pair the app opens on, while the server finishes starting and the browser
loads the page. The first run waits for those imports (never importing the same modules
at once) and finds the cards in the app's result cache, or waits for the one under way.
"""

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import streamlit as st
from starlette.middleware import Middleware

from rotviz.devices import calm_before_torch
from rotviz.ui import boot

# OpenMP threads (torch's CPU pool) sleep instead of spinning while they wait
# (rotviz.devices.CALM says why). Read when torch loads, which nothing has done yet here.
calm_before_torch()

# The script each visitor runs, by absolute path: streamlit resolves a relative one against
# the folder of the file it runs, which differs between this launcher and the checkout's.
MAIN = Path(__file__).resolve().parent / "main.py"


@contextlib.asynccontextmanager
async def lifespan(_app: st.App) -> AsyncIterator[None]:
    """Start getting the first page ready, and let the server go on starting at once."""
    boot.start()
    yield


# The middleware counts the server's HTTP requests: the start-up thread imports torch once the
# browser has what the first paint needs (rotviz/ui/boot.py).
MIDDLEWARE = [Middleware(boot.Requests)]

# Streamlit finds the App by reading this file (the literal `app = st.App(...)`).
app = st.App(str(MAIN), lifespan=lifespan, middleware=MIDDLEWARE)

"""rotviz app: the interactive explorer (`streamlit run app.py`, or `rotviz serve`).

This file is the launcher. `streamlit run app.py` finds the `app = st.App(...)` below and
serves it with uvicorn; the script each visitor runs is app_main.py (the page config, the
sidebar, the navigation over app_pages/).

Why a launcher: the first script run used to import torch (about 2.4 s of pure Python on a
CPU machine) and evaluate the pair only once the browser had connected. The lifespan below
runs as the server starts, before its first request: it starts a background thread
(app_pages/boot.py) that imports what the first run imports and computes the Models page's
two cards for the pair the app opens on, while the server finishes starting and the browser
loads the page. The first run waits for those imports (never importing the same modules
at once) and finds the cards in the app's result cache, or waits for the one under way.
"""

import contextlib
from collections.abc import AsyncIterator

import streamlit as st
from starlette.middleware import Middleware

from app_pages import boot
from rotviz.devices import calm_before_torch

# OpenMP threads (torch's CPU pool) sleep instead of spinning while they wait
# (rotviz.devices.CALM says why). Read when torch loads, which nothing has done yet here.
calm_before_torch()


@contextlib.asynccontextmanager
async def lifespan(_app: st.App) -> AsyncIterator[None]:
    """Start getting the first page ready, and let the server go on starting at once."""
    boot.start()
    yield


# The middleware counts the server's HTTP requests: the start-up thread imports torch once the
# browser has what the first paint needs (app_pages/boot.py).
app = st.App("app_main.py", lifespan=lifespan, middleware=[Middleware(boot.Requests)])

"""rotviz app: the script each visitor runs (app.py beside it, the launcher, serves it).

This script draws the shared frame (page config, sidebar, presenter styling) and runs
the page picked in `st.navigation`, the only page list. The pages live in views/ beside this
file (not pages/, a name Streamlit would list as pages by itself: a folder of that name beside
this script makes a fresh server's first run, and every AppTest run, an old-style multipage app
over that folder, without this frame); the helpers they share (sidebar.py, runtime.py, run.py,
show.py, section.py) are not pages. The computations are rotviz.app's (no Streamlit).
"""

from pathlib import Path

from rotviz.devices import calm_before_torch

# OpenMP threads (torch's CPU pool) sleep instead of spinning while they wait
# (rotviz.devices.CALM says why). Read when torch loads. The launcher (app.py) sets it before
# anything loads torch; here for a run of this script alone (streamlit's AppTest).
calm_before_torch()

import streamlit as st  # noqa: E402

from rotviz.ui import boot  # noqa: E402

# The launcher's start-up thread may be importing the module below: wait for it, so that two
# threads never import the same module at once (rotviz/ui/boot.py). The sidebar waits for the
# rest of its imports (torch) before its device picker (`before_torch`).
boot.ready_frame()

from rotviz.ui import sidebar  # noqa: E402

st.set_page_config(page_title="rotviz", page_icon=":material/360:", layout="wide",
                   initial_sidebar_state="expanded")

# Absolute paths: in App mode streamlit resolves a relative page path against the launcher's
# folder, which differs between the checkout's app.py and rotviz/ui/app.py.
PAGE_DIR = Path(__file__).resolve().parent / "views"

PAGES = [
    st.Page(PAGE_DIR / "models.py", title="Models", icon=":material/view_in_ar:", default=True),
    st.Page(PAGE_DIR / "match.py", title="Match", icon=":material/join_inner:"),
    st.Page(PAGE_DIR / "barrier.py", title="Barrier", icon=":material/show_chart:"),
    st.Page(PAGE_DIR / "spectra.py", title="Spectra", icon=":material/equalizer:"),
    st.Page(PAGE_DIR / "merge.py", title="Merge", icon=":material/merge:"),
    st.Page(PAGE_DIR / "landscape.py", title="Landscape", icon=":material/landscape:"),
    st.Page(PAGE_DIR / "function.py", title="Function", icon=":material/compare_arrows:"),
    st.Page(PAGE_DIR / "training.py", title="Training", icon=":material/timeline:"),
    st.Page(PAGE_DIR / "learn.py", title="Learn", icon=":material/school:"),
    st.Page(PAGE_DIR / "measure.py", title="Measure", icon=":material/science:"),
    st.Page(PAGE_DIR / "gallery.py", title="Gallery", icon=":material/photo_library:"),
]

page = st.navigation(PAGES, position="top" if sidebar.presenting() else "sidebar")
setup = sidebar.sidebar(before_torch=boot.ready)
sidebar.presenter_style(setup.presenter)
if page.title != "Models":  # the Models page draws the zoo cards' numbers first (models.py)
    boot.ready()
page.run()

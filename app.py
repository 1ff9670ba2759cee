"""rotviz app: the interactive explorer (`streamlit run app.py`).

This entrypoint draws the shared frame (page config, sidebar, presenter styling) and runs
the page picked in the navigation. The pages live in pages/; pages/common.py holds the
helpers they share and is not a page. The computations are rotviz.app's (no Streamlit).
"""

import os

# OpenMP threads (torch's CPU pool) sleep instead of spinning while they wait: on a machine
# whose cores are shared, spinning threads take the CPU from the one doing the work (5x
# slower runs measured on 2 cores). The same threads split the same work, so every number
# is unchanged. Read when torch loads, which no script run has done yet at this point.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import streamlit as st  # noqa: E402

from pages import common  # noqa: E402

st.set_page_config(page_title="rotviz", page_icon=":material/360:", layout="wide",
                   initial_sidebar_state="expanded")

PAGES = [
    st.Page("pages/models.py", title="Models", icon=":material/view_in_ar:", default=True),
    st.Page("pages/match.py", title="Match", icon=":material/join_inner:"),
    st.Page("pages/barrier.py", title="Barrier", icon=":material/show_chart:"),
    st.Page("pages/spectra.py", title="Spectra", icon=":material/equalizer:"),
    st.Page("pages/merge.py", title="Merge", icon=":material/merge:"),
    st.Page("pages/learn.py", title="Learn", icon=":material/school:"),
]

# Navigation first: a run interrupted before st.navigation would make Streamlit fall back to
# listing the pages/ folder. Calling it also ends that layout for good (common.through_app).
page = st.navigation(PAGES, position="top" if common.presenting() else "sidebar")
common.return_to_page()
setup = common.sidebar()
common.presenter_style(setup.presenter)
with common.frame():
    page.run()

"""rotviz app: the interactive explorer (`streamlit run app.py`).

This entrypoint draws the shared frame (page config, sidebar, presenter styling) and runs
the page picked in the navigation. The pages live in pages/; pages/common.py holds the
helpers they share and is not a page.
"""

import streamlit as st

from pages import common

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
# listing the pages/ folder.
page = st.navigation(PAGES, position="top" if common.presenting() else "sidebar")
setup = common.sidebar()
common.presenter_style(setup.presenter)
page.run()

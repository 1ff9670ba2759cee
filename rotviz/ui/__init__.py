"""The Streamlit app: the only part of rotviz that imports streamlit.

`rotviz serve` (rotviz.cli.serve) runs `streamlit run` on app.py here, the launcher; main.py is
the script each visitor runs (page config, sidebar, navigation), views/ holds the pages it lists
and boot.py, sidebar.py, runtime.py, run.py, show.py and section.py are the helpers they share.
What the pages compute is rotviz.app's (no Streamlit). The repository's own app.py is a checkout
launcher for `streamlit run app.py` that serves the same app.

This __init__ imports nothing (no streamlit), so that rotviz.cli can read rotviz.ui.options
without loading streamlit.
"""

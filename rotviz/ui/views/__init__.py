"""The app's pages, one script each, listed by rotviz/ui/main.py's `st.navigation`.

A package (this file) so that the wheel ships them; streamlit runs each as a script. Not named
pages/: streamlit would take a pages/ folder beside main.py for an old-style multipage app
(tests/test_boundary.py says more).
"""

"""The app's pages, one script each, listed by rotviz/ui/main.py's `st.navigation`.

A package (this file) so that the wheel ships them; streamlit runs each as a script.
"""

"""rotviz app entrypoint (placeholder until the app issue lands)."""

import streamlit as st

import rotviz

st.set_page_config(page_title="rotviz", layout="wide")
st.title(f"rotviz {rotviz.__version__}")
st.write("Parameter-space symmetries of transformers. The explorer is under construction.")

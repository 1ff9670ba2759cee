"""rotviz app from a source checkout: `streamlit run app.py` (the README's launch command).

The app lives in the package (rotviz/ui/; `rotviz serve` runs rotviz/ui/app.py). This file
exists so that a checkout's `streamlit run app.py` keeps working, and picks up the checkout's
.streamlit/config.toml: streamlit finds the App by reading the file it runs for the literal
`app = st.App(...)`, so the assignment is repeated here over rotviz.ui.app's parts.
"""

import streamlit as st

from rotviz.ui.app import MAIN, MIDDLEWARE, lifespan

app = st.App(str(MAIN), lifespan=lifespan, middleware=MIDDLEWARE)

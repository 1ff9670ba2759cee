"""The app's streamlit settings, one dict (no streamlit import: rotviz.cli reads it).

`rotviz serve` passes them as command-line flags (`flags`), since a run from a wheel has no
.streamlit/config.toml in its working folder. The checkout's .streamlit/config.toml holds the
same settings for `streamlit run app.py` (tests/test_boundary.py checks they agree).
"""

from __future__ import annotations

OPTIONS: dict[str, dict[str, object]] = {
    "server": {
        "headless": True,
        "fileWatcherType": "none",  # the watcher trips over torch's lazy modules
    },
    # No full garbage collection after every script run: with torch and transformers loaded
    # each took about 0.4 s of CPU on a 2-core machine, a delay on every click. The models
    # live in streamlit's resource cache either way, and Python's own collector still runs.
    "runner": {"postScriptGC": False},
    "browser": {"gatherUsageStats": False},
    # Okabe-Ito blue: the palette of every rotviz figure, safe for colour-blind readers.
    "theme": {"primaryColor": "#0072B2"},
    "client": {"toolbarMode": "viewer"},  # no "Deploy" button
}


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def flags(options: dict[str, dict[str, object]] = OPTIONS) -> list[str]:
    """The settings as streamlit command-line flags: `--section.key value`, in order."""
    out: list[str] = []
    for section, values in options.items():
        for key, value in values.items():
            out += [f"--{section}.{key}", _text(value)]
    return out

"""Types every layer shares."""

from __future__ import annotations

from collections.abc import Callable

# progress(done, total, message): how rotviz reports long work (it never prints); the CLI
# draws bars from it, the app a status box with a Stop button.
Progress = Callable[[int, int, str], None]

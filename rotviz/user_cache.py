"""The per-user cache folder: where rotviz writes what it builds on demand (the zoo models
that do not ship in the package), never into the installed package itself, which may be
read-only (a system or shared site-packages).

`ROTVIZ_CACHE` names the folder; otherwise it is the platform's cache directory, as other
tools use it (the same places as `platformdirs.user_cache_dir("rotviz")`):
- Linux and other Unix: `$XDG_CACHE_HOME/rotviz`, else `~/.cache/rotviz`;
- macOS: `~/Library/Caches/rotviz`;
- Windows: `%LOCALAPPDATA%\\rotviz\\Cache`.

A leaf: it imports nothing of rotviz, so the zoo's registry can use it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

ENV = "ROTVIZ_CACHE"


def cache_dir(env: Mapping[str, str] | None = None, platform: str | None = None) -> Path:
    """The folder, absolute (a relative `ROTVIZ_CACHE` is taken from the working folder);
    not created here: the writer that needs it creates it."""
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    given = env.get(ENV, "").strip()
    if given:
        return Path(given).expanduser().absolute()
    home = Path(env.get("HOME") or Path.home())
    if platform == "win32":
        local = env.get("LOCALAPPDATA", "").strip()
        return (Path(local) if local else home / "AppData" / "Local") / "rotviz" / "Cache"
    if platform == "darwin":
        return home / "Library" / "Caches" / "rotviz"
    xdg = env.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".cache"
    return base / "rotviz"

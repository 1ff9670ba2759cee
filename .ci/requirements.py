"""Print the requirements `.ci/setup` installs, one per line, read from pyproject.toml.

pyproject.toml is the one source of rotviz's dependencies: its `dependencies` and the extras
named on the command line (default `dev`, which pulls in every other extra), with extras that
name rotviz itself (`rotviz[figures,datasets]`) expanded. `.ci/setup` hashes this output to
key its cached environment, so only a change to what is installed rebuilds it.

    python3 .ci/requirements.py [EXTRA ...]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    sys.exit("setup: reading pyproject.toml needs Python 3.11 or later (tomllib); "
             "set PYTHON to a newer python3")

SELF = re.compile(r"^rotviz\[(?P<extras>[^\]]+)\]$")


def requirements(project: dict, extras: list[str]) -> list[str]:
    """The project's dependencies and those of `extras`, self-references expanded, in order."""
    optional = project.get("optional-dependencies", {})
    out = list(project.get("dependencies", []))
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        if extra not in optional:
            sys.exit(f"setup: pyproject.toml has no extra '{extra}' (it has "
                     f"{', '.join(optional)})")
        seen.add(extra)
        for req in optional[extra]:
            m = SELF.match(req.replace(" ", ""))
            if m:
                todo += m["extras"].split(",")
            elif req not in out:
                out.append(req)
    return out


def main(argv: list[str]) -> None:
    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    print("\n".join(requirements(project, argv or ["dev"])))


if __name__ == "__main__":
    main(sys.argv[1:])

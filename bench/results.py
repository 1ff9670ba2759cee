"""Shared helper for bench scripts: each script owns one section of bench/RESULTS.md."""

from __future__ import annotations

import os
import platform
import re
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = (
    "# rotviz benchmarks\n\n"
    "Each section is rewritten by the script named in it; the sections marked _by hand_\n"
    "at the end hold numbers measured with the commands they name, which no script\n"
    "rewrites. Timings are wall-clock seconds.\n"
)


def machine(device: str = "cpu") -> str:
    """One line naming the machine and device the numbers come from."""
    import torch

    cpu = platform.processor() or platform.machine()
    line = (
        f"{platform.system()} {cpu}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}"
    )
    if device.startswith("cuda") and torch.cuda.is_available():
        line += f", GPU {torch.cuda.get_device_name(0)}"
    return line


def default_pair_on_test():
    """(anchor, source, test split): the zoo's default pair, loaded, and the digits test split
    the benchmarks on it evaluate; `anchor.ref` and `source.ref` name the models."""
    from rotviz import zoo_registry as zoo
    from rotviz.data.split import load_split
    from rotviz.sources.loading import load_model

    a_ref, b_ref = zoo.default_pair()
    return load_model(a_ref), load_model(b_ref), load_split("digits", "test")


def write_section(name: str, body: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section `name` of RESULTS.md with `body` (markdown)."""
    text = path.read_text() if path.exists() else HEADER
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    block = (
        f"<!-- {name}:start -->\n## {name}\n\n_updated {stamp}_\n\n"
        f"{body.strip()}\n<!-- {name}:end -->"
    )
    pattern = re.compile(
        rf"<!-- {re.escape(name)}:start -->.*?<!-- {re.escape(name)}:end -->", re.S
    )
    text = (
        pattern.sub(lambda _: block, text)
        if pattern.search(text)
        else text.rstrip() + "\n\n" + block + "\n"
    )
    path.write_text(text)


def remove_section(name: str, path: Path = RESULTS) -> bool:
    """Drop the section `name` of RESULTS.md (one a script no longer writes, whose numbers
    another section now holds), and the blank line it leaves; False where there is none."""
    text = path.read_text()
    found = re.search(
        rf"<!-- {re.escape(name)}:start -->.*?<!-- {re.escape(name)}:end -->\n?", text, re.S
    )
    if found is None:
        return False
    before, after = text[: found.start()], text[found.end() :]
    if before.endswith("\n\n") and after.startswith("\n"):
        after = after[1:]
    path.write_text(before + after)
    return True

"""Benchmark rebuilding the zoo: wall time of `rotviz zoo build`, and whether it reproduces.

    python bench/zoo_build.py [--names default] [--parallel] [--results bench/RESULTS.md]

Writes section `zoo build` of bench/RESULTS.md (`zoo build: spawn series` for the spawn
series alone). Targets on 2 CPU cores: the default pair (two vit-digits seeds) <= 3 minutes;
the spawn series (`--names vit-digits-spawn`: a parent run and 8 children, 18 models) <= 5
minutes. Models are built into a temporary folder with a fresh `python -m rotviz zoo build`
(imports included), one after the other, or with `--parallel` one process per model at once
(training uses one thread each, so two fit on two cores). Each rebuilt card is compared with
the shipped card.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import RESULTS, machine, write_section  # noqa: E402
from rotviz import zoo_registry as zoo  # noqa: E402


def expand(names: list[str]) -> list[str]:
    out: list[str] = []
    for n in names:
        if n in {e.name for e in zoo.SPAWNS}:  # a spawn series: built as one
            out.append(n)
        elif n == "all":
            out += [e.name for e in zoo.entries()]
        elif n in zoo.PAIRS:
            out += list(zoo.PAIRS[n])
        else:
            out.append(zoo.entry(n).name)
    return list(dict.fromkeys(out))


def spawn_rows(name: str, new: dict) -> list[str]:
    """One row for a rebuilt spawn series: its models' test metrics against the shipped
    card's (the largest difference over every model)."""
    try:
        old = zoo.read_card(zoo.collection_path(name))
    except Exception:  # noqa: BLE001 - not built: nothing to compare with
        old = None
    if old is None:
        same = "no shipped card"
    else:
        d = max(abs(new["test"][m][k] - old["test"][m][k]) for m in new["test"]
                for k in ("loss", "acc"))
        same = f"yes (max diff {d:.1e})" if d <= 1e-4 else f"NO (max diff {d:.1e})"
    last = new["test"][f"spawn-{new['steps']}/a"]
    return [f"| {name} ({len(new['test'])} models) | {new['steps']} parent steps + children | "
            f"{new['train_seconds']:.1f} | {last['loss']:.4f} | {last['acc']:.4f} | {same} |"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--names", nargs="+", default=["default"],
                   help="zoo names, pairs (default, finetuned, gpt2, all) or a spawn "
                        "series (vit-digits-spawn)")
    p.add_argument("--parallel", action="store_true", help="one process per model, at once")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args()
    names = expand(args.names)
    py = sys.executable
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        if args.parallel:
            procs = [subprocess.Popen([py, "-m", "rotviz", "zoo", "build", n, "--out", tmp],
                                      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True) for n in names]
            for pr in procs:
                _, err = pr.communicate()
                if pr.returncode:
                    raise SystemExit(err)
        else:
            proc = subprocess.run([py, "-m", "rotviz", "zoo", "build", *names, "--out", tmp],
                                  cwd=ROOT, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(proc.stderr)
        total = time.perf_counter() - start
        use = resource.getrusage(resource.RUSAGE_CHILDREN)  # the builds' own CPU time
        cpu = use.ru_utime + use.ru_stime
        loads.append(os.getloadavg()[0])
        rows = []
        for n in names:
            new = json.loads((Path(tmp) / n / "card.json").read_text())
            if "spawn_steps" in new:
                rows += spawn_rows(n, new)
                continue
            old = zoo.read_card(n) if zoo.is_built(n) else None
            if old is None:
                same = "no shipped card"
            else:
                d = max(abs(new["test"][k] - old["test"][k]) for k in ("loss", "acc"))
                same = f"yes (max diff {d:.1e})" if d <= 1e-4 else f"NO (max diff {d:.1e})"
            t = new["test"]
            rows.append(f"| {n} | {new['steps']} | {new['train_seconds']:.1f} | {t['loss']:.4f} | "
                        f"{t['acc']:.4f} | {same} |")
    mode = "in parallel, one process per model" if args.parallel else "one after the other"
    lines = [
        f"Machine: {machine('cpu')}; load average {min(loads):.1f} to {max(loads):.1f} while "
        "measured (shared VM: higher loads mean pessimistic numbers).",
        "",
        f"Built {', '.join(names)} {mode}: **{total:.1f} s** wall in all ({cpu:.1f} s of CPU "
        "time in the build processes), fresh processes, imports included. Targets: the "
        "default pair <= 180 s, the spawn series (vit-digits-spawn) <= 300 s, on 2 CPU cores.",
        "",
        "| model | steps | train s | test loss | test acc | reproduces shipped card (1e-4) |",
        "|---|---|---|---|---|---|",
        *rows,
    ]
    spawns = {e.name for e in zoo.SPAWNS}
    section = "zoo build: spawn series" if set(names) <= spawns else "zoo build"
    write_section(section, "\n".join(lines), args.results)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

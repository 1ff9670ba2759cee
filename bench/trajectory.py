"""Benchmark `trajectory`: the zoo's run A (five checkpoints of the digits ViT) on a 21 x 21
surface of the digits test split, in process and as the command; run B with it (two planes).

    python bench/trajectory.py [--repeat 3] [--device cpu] [--results bench/RESULTS.md]

Writes section `trajectory` of bench/RESULTS.md. Target: `rotviz trajectory
zoo:vit-digits-run-a --data digits` with a 21 x 21 surface, at most 60 s on this CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import RESULTS, machine, write_section  # noqa: E402

RUN_A, RUN_B = "zoo:vit-digits-run-a", "zoo:vit-digits-run-b"


def timed(fn, repeat: int) -> tuple[float, float, dict]:
    """(median s, min s, the last result's dict) of `repeat` calls of `fn`."""
    times, out = [], {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn().to_dict()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), out


def command_seconds(device: str) -> float:
    """The whole command, a fresh `python -m rotviz` (imports, loading, the surface, JSON)."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rotviz", "trajectory", RUN_A, "--data", "digits",
                        "--grid", "21", "--device", device, "--json", f"{tmp}/t.json"],
                       check=True, cwd=ROOT, capture_output=True)
        return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args()

    from rotviz import measure
    from rotviz.data.split import load_split

    load = os.getloadavg()[0]
    split = load_split("digits", "test")
    rows = []
    for label, refs, params, repeat in (
            ("run A, 21 x 21", [RUN_A], {}, args.repeat),
            ("run A, 21 x 21, --norm filter", [RUN_A], {"norm": "filter"}, 1),
            ("run A with run B, --match seed (two planes), 21 x 21", [RUN_A, RUN_B],
             {"match": ["seed"]}, 1)):
        med, low, d = timed(lambda r=refs, k=params: measure(
            "trajectory", r, split, args.device, grid=21, **k), repeat)
        ev = ", ".join(f"{p['name']} {100 * p['explained_variance'][0]:.1f}% + "
                       f"{100 * p['explained_variance'][1]:.1f}%" for p in d["planes"])
        rows.append((label, repeat, med, low, ev))
        print(rows[-1], flush=True)
        load = max(load, os.getloadavg()[0])
    cmd = command_seconds(args.device)
    load = max(load, os.getloadavg()[0])
    lines = [
        f"Machine: {machine(args.device)}; device {args.device}; load average up to {load:.1f} "
        "while measured (above 1, other work shared the cores: the times are pessimistic).",
        "",
        "Target: `rotviz trajectory zoo:vit-digits-run-a --data digits` with a 21 x 21 surface, "
        f"<= 60 s on this CPU. The command, end to end (a fresh process): **{cmd:.1f} s**.",
        "",
        f"In process (`rotviz.measure`, {split.n} test samples: loading the checkpoints, the "
        "SVD, the surface and each checkpoint's own and projected loss):",
        "",
        "| inputs | runs | median s | min s | explained variance (PC1 + PC2) |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {w} | {n} | {med:.2f} | {lo:.2f} | {e} |" for w, n, med, lo, e in rows]
    write_section("trajectory", "\n".join(lines), args.results)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Threads under contention: how torch's CPU thread count and OpenMP's wait policy behave when
another process holds a core (section `threads` of bench/RESULTS.md).

Each configuration runs in a fresh child process (OpenMP reads its environment once, at
start), side by side in one run, alternating, best of `--repeats`:

- threads 1 or all usable cores (`torch.set_num_threads`);
- OpenMP's wait at the end of each parallel region: as torch ships it (the threads spin,
  waiting for the others), a short spin (`GOMP_SPINCOUNT=10000`), or none
  (`OMP_WAIT_POLICY=PASSIVE`: they sleep);
- alone, or beside `--busy` busy processes (one pure-Python loop each, the stand-in for
  another app session or another job).

Two workloads: a small linear layer (batch 64, 256 -> 256, the size of the default pair's
layers; per call) and the default pair's 11-point barrier curve on the digits test split.

    python bench/threads.py [--repeats 3] [--busy 1] [--no-curve]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results import machine, write_section  # noqa: E402

CHILD = r"""
import json, sys, time
import torch
threads, curve = int(sys.argv[1]), sys.argv[2] == "1"
torch.set_num_threads(threads)
out = {}
x, lin = torch.randn(64, 256), torch.nn.Linear(256, 256)
with torch.no_grad():
    for _ in range(50):
        lin(x)
    n, t = 0, time.perf_counter()
    while n < 200 or time.perf_counter() - t < 1.0:
        lin(x)
        n += 1
out["linear_ms"] = (time.perf_counter() - t) / n * 1e3
if curve:
    from rotviz import match_endpoints, measure
    from bench.results import default_pair_on_test
    a, b, split = default_pair_on_test()
    ends = match_endpoints(a, b, "seed")
    t = time.perf_counter()
    measure("barrier", ends, split, points=11)
    out["curve_s"] = time.perf_counter() - t
print("RESULT", json.dumps(out))
"""

BUSY = "while True: pass"


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# OpenMP's wait at the end of a parallel region (torch's CPU backend is GNU libgomp): spin as
# shipped (300,000 spins, about a millisecond, before sleeping), a short spin, or sleep at once
WAITS = {"spin (default)": {}, "short spin": {"GOMP_SPINCOUNT": "10000"},
         "passive": {"OMP_WAIT_POLICY": "PASSIVE"}}


def run_child(threads: int, wait: str, curve: bool) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(WAITS[wait])
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", CHILD, str(threads), "1" if curve else "0"],
                         env=env, capture_output=True, text=True, cwd=root, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(res.stderr[-2000:])
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--busy", type=int, default=1, help="busy processes beside (default 1)")
    ap.add_argument("--no-curve", action="store_true", help="the linear layer only")
    ap.add_argument("--results", type=Path, default=None)
    args = ap.parse_args()
    cores = usable_cores()
    configs = [(t, w) for t in sorted({1, cores}) for w in WAITS]
    load0 = os.getloadavg()[0]
    best: dict[tuple, dict] = {}
    for busy in (0, args.busy):
        procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
        try:
            time.sleep(0.5 if busy else 0)
            for _ in range(args.repeats):
                for t, p in configs:  # alternating: drifts of the machine hit every config
                    got = run_child(t, p, not args.no_curve)
                    key = (busy, t, p)
                    best[key] = {k: min(v, best.get(key, {}).get(k, float("inf")))
                                 for k, v in got.items()}
                    print(key, got, flush=True)
        finally:
            for q in procs:
                q.kill()
                q.wait()
    load1 = os.getloadavg()[0]
    rows = ["| busy processes beside | torch threads | OpenMP wait | small linear (ms a call) "
            "| default-pair curve, 11 points (s) |", "|---|---|---|---|---|"]
    for (busy, t, p), got in sorted(best.items()):
        curve = f"{got['curve_s']:.2f}" if "curve_s" in got else "-"
        rows.append(f"| {busy} | {t} | {p} | "
                    f"{got['linear_ms']:.3f} | {curve} |")
    body = (
        f"Run as `python bench/threads.py --repeats {args.repeats} --busy {args.busy}`. "
        f"Machine: {machine()}; {cores} usable cores; 1-minute load average {load0:.2f} at "
        f"the start, {load1:.2f} at the end (the busy processes are the bench's own; any "
        "other load is the machine's).\n\nEach configuration in a fresh process, alternating, "
        f"best of {args.repeats}. Small linear layer: batch 64, 256 -> 256. Curve: the default "
        "pair matched with seed, 11 points on the digits test split (397 images).\n\n"
        + "\n".join(rows) + "\n"
    )
    write_section("threads", body, **({"path": args.results} if args.results else {}))
    print(body)


if __name__ == "__main__":
    main()

"""Benchmark: the symmetry ladder on the default pair, every rung and align-to-self.

    python bench/ladder.py [--threads 2] [--repeats 1] [--results bench/RESULTS.md]

Writes section `ladder` of bench/RESULTS.md. Target: the whole ladder (rotviz.measures.ladder:
eight rungs, none to learned, then align-to-self, 11 points each on the digits test split) in
<= 15 s on 2 CPU cores, the models already loaded (as the app holds them). Wall seconds and
the process's CPU seconds (all threads) in all, and per rung its matching's and its
evaluation's seconds; with --repeats N the fastest run is reported and every run listed. The
machine is shared: the load average says how busy it was.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rotviz.devices import calm_before_torch  # noqa: E402

calm_before_torch()  # as the command line and the app do

import torch  # noqa: E402

from bench.results import RESULTS, default_pair_on_test, machine, write_section  # noqa: E402
from rotviz.measures.ladder import LadderPair, ladder  # noqa: E402

TARGET = 15.0


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"


def run_once(pair: LadderPair, test) -> tuple[object, float, float]:
    """The ladder, its wall and CPU seconds (all threads)."""
    t0, c0 = time.perf_counter(), time.process_time()
    r = ladder(pair, test)
    return r, time.perf_counter() - t0, time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    anchor, source, test = default_pair_on_test()
    pair = LadderPair.of(anchor, source)
    load_s = time.perf_counter() - t0
    runs = []
    for _ in range(args.repeats):
        start = load()
        r, wall, cpu = run_once(pair, test)
        runs.append((wall, cpu, r, start, load()))
        print(f"ladder: {wall:.1f} s wall, {cpu:.1f} s CPU (load {start} -> {load()})",
              flush=True)
    wall, cpu, r, l0, l1 = min(runs, key=lambda x: x[0])
    met = "met" if wall <= TARGET else "MISSED"
    rows = [f"| {i} | {x['words']} | `{x['asked']}` | {x['match_seconds']:.2f} | "
            f"{x['seconds']:.2f} | {x['barrier']:.4f} | {x['distance']:.4f} | "
            f"{x['merged_acc']:.4f} | {x['max_output_diff'] or 0.0:.1e} |"
            for i, x in enumerate(r.rungs)]
    body = (
        f"Run as `python bench/ladder.py --threads {args.threads} --repeats {args.repeats}`. "
        f"Machine: {machine()}; 1-minute load average {l0} at the start, {l1} at the end "
        "(a shared machine: loads above the core count mean pessimistic wall times; CPU "
        "seconds are steadier).\n\n"
        f"Default pair ({anchor.ref} anchor, {source.ref} source) on the digits test split "
        f"({test.n} images), {r.points} points per path, learned matching {r.learn_steps} "
        f"steps at most; the models load in {load_s:.1f} s (not counted). Target: the "
        f"ladder in <= {TARGET:.0f} s: **{wall:.1f} s wall, {cpu:.1f} s CPU, {met}**"
        + ("" if len(runs) == 1 else
           f" (fastest of {', '.join(f'{w:.1f}' for w, *_ in runs)} s)") + ".\n\n"
        "Shared across rungs: one evaluator (the split on the device once), an evaluation "
        "cache keyed by the parameters' bytes (every path's anchor end, and align-to-self's "
        "whole path and merge, are look-ups), learned matching starting from the activation "
        "rung's match and training on a thread of its own while the calling thread matches "
        "the other rungs, and the evaluations, one task per parameter set, run by whichever "
        "thread is free (a worker, the calling thread once its matching is done, the learned "
        "thread once it has learned), at most one per torch thread, matching and learning "
        "first. A small pair matches and evaluates on one torch thread per thread "
        "(rotviz.devices.SMALL_PAIR), whatever --threads says. Matching s: each rung's own "
        "(the learned rung's on its thread, overlapping the others); evaluation s: the "
        "rung's path and merge, its tasks' seconds summed (on whichever threads).\n\n"
        "| # | rung | `--match` | matching s | evaluation s | barrier | distance | merged acc "
        "| max logit diff |\n|---|---|---|---|---|---|---|---|---|\n"
        + "\n".join(rows) + "\n")
    write_section("ladder", body, args.results)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

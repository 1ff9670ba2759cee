"""Benchmark: data-free and learned matching on the default pair, barrier and time.

    python bench/learned.py [--threads 2] [--seeds 0,1,2,3] [--results bench/RESULTS.md]

Writes section `learned` of bench/RESULTS.md. Target: learned matching on the default
pair finishes in <= 60 s on 2 CPU cores and leaves a barrier <= 0.1 (test split, 21 points).
Each row times `match_models` (weight matching, then learned matching where named) and then
evaluates the path; the seed rows show how much the learned result depends on its seed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.results import RESULTS, default_pair_on_test, machine, write_section  # noqa: E402
from rotviz.analysis.landscape import interpolate  # noqa: E402
from rotviz.match.options import LearnOptions  # noqa: E402
from rotviz.match.pipeline import match_models  # noqa: E402
from rotviz.match.selection import match_options  # noqa: E402


def row(anchor, source, test, spec: str, seed: int = 0) -> str:
    from dataclasses import replace

    options = match_options(spec)
    if options.learned:
        options = replace(options, learn=LearnOptions(seed=seed))
    t0 = time.perf_counter()
    m = match_models(anchor, source, options, data="digits")
    seconds = time.perf_counter() - t0
    c = interpolate(anchor, source, test, None, 21, source_state=m.state)
    learned = m.report.learned
    how = (f"{learned['steps']} steps ({learned['stopped']}), val barrier "
           f"{learned['val_barrier_start']:.3f} -> {learned['val_barrier']:.3f}") if learned else ""
    return (f"| {spec} | {seed if learned else ''} | {seconds:.1f} | {c.barrier:.3f} | "
            f"{c.mid_acc:.3f} | {m.report.max_output_diff:.1e} | {how} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seeds", default="0,1,2,3", help="learned-matching seeds to run")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    anchor, source, test = default_pair_on_test()
    a_ref, b_ref = anchor.ref, source.ref
    rows = [row(anchor, source, test, "seed"), row(anchor, source, test, "weight")]
    for seed in (int(s) for s in args.seeds.split(",") if s.strip()):
        rows.append(row(anchor, source, test, "learned", seed))
        print(rows[-1], flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    body = "\n".join([
        f"Run as `python bench/learned.py --threads {args.threads}`. Machine: {machine()}; "
        f"load average {load:.2f} at the end.",
        "",
        f"Default pair ({a_ref}, {b_ref}), test split (397 images), 21-point path; seconds = "
        "`match_models` (weight matching, then learned matching on the train split with early "
        "stopping on val). Targets: learned <= 60 s, barrier <= 0.1.",
        "",
        "| SPEC | learn seed | seconds | barrier | accuracy at 0.5 | max logit diff | learned |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ])
    write_section("learned", body, args.results)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

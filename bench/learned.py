"""Benchmark: data-free and learned matching on the default pair, barrier and time.

    python bench/learned.py [--threads 2] [--seeds 0,1,2,3] [--variants rotations,...]
                            [--results bench/RESULTS.md]

Writes section `learned` of bench/RESULTS.md. Target: learned matching (the seeded default,
`--match learned`: activation matching, then 80 steps) on the default pair leaves a test
barrier <= 0.02 (21 points) and finishes in <= 15 s on 2 CPU cores, its start included. Each
row times `match_models` (the start, then learned matching where named; wall and process CPU
seconds) and then evaluates the path on the test split. The seed rows show how much the result
depends on the learn seed; `--variants` adds rows for the alternatives the defaults were
chosen against (VARIANTS), over the same seeds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rotviz.devices import calm_before_torch  # noqa: E402

calm_before_torch()  # as the command line and the app do: under load, spinning OpenMP
# threads made 80 steps at 2 threads cost 138 CPU s instead of 9

import torch  # noqa: E402

from bench.results import RESULTS, default_pair_on_test, machine, write_section  # noqa: E402
from rotviz.match.endpoints import from_matched  # noqa: E402
from rotviz.match.options import LearnOptions  # noqa: E402
from rotviz.match.pipeline import match_models  # noqa: E402
from rotviz.match.selection import match_options  # noqa: E402
from rotviz.measures.barrier import curve_on  # noqa: E402

# name: (what differs from the default, LearnOptions fields[, the matching SPEC])
VARIANTS: dict[str, tuple] = {
    "weight": ("from weight matching (`weight,learned`), the defaults otherwise", {},
               "weight,learned"),
    "paper": ("the defaults before: from weight matching (`weight,learned`), 300 steps at "
              "learning rate 0.02, no warm-up", {"steps": 300, "lr": 0.02, "warmup": 0},
              "weight,learned"),
    "short": ("60 steps", {"steps": 60}),
    "rotations": ("Q-K and V-O maps rotations, not invertible", {"invertible": False}),
    "best": ("keep the maps of the best validation barrier (every 20 steps, patience 8)",
             {"keep": "best", "eval_every": 20}),
    "wide": ("lambda ~ U(0.2, 0.8)", {"lam": (0.2, 0.8)}),
    "slow": ("learning rate 0.01", {"lr": 0.01}),
    "long": ("learning rate 0.01, 450 steps", {"lr": 0.01, "steps": 450}),
    "before": ("the defaults before issue 30: from weight matching, 300 steps at learning "
               "rate 0.01, U(0.2, 0.8), rotations, the best of checks every 20 steps "
               "(patience 8); the residual map is now the Cayley map",
               {"steps": 300, "lr": 0.01, "lam": (0.2, 0.8), "invertible": False,
                "keep": "best", "eval_every": 20, "warmup": 0}, "weight,learned"),
}


def run(anchor, source, test, spec: str, learn: LearnOptions | None = None) -> dict:
    options = match_options(spec)
    if learn is not None:
        options = replace(options, learn=learn)
    t0, c0 = time.perf_counter(), time.process_time()
    m = match_models(anchor, source, options, data="digits")
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    c = curve_on(from_matched(anchor, source, m, m.report.options), test, 21)
    return {"seconds": seconds, "cpu": cpu, "barrier": c.barrier, "mid_acc": c.mid_acc,
            "diff": m.report.max_output_diff, "learned": m.report.learned}


def row(name: str, seed: int | str, r: dict) -> str:
    learned = r["learned"]
    how = (f"{learned['steps']} steps ({learned['stopped']}, kept step {learned['best_step']}), "
           f"val barrier {learned['val_barrier_start']:.3f} -> {learned['val_barrier']:.3f}"
           ) if learned else ""
    return (f"| {name} | {seed} | {r['seconds']:.1f} | {r['cpu']:.1f} | {r['barrier']:.4f} | "
            f"{r['mid_acc']:.3f} | {r['diff']:.1e} | {how} |")


def summary(name: str, runs: list[dict]) -> str:
    b = [r["barrier"] for r in runs]
    s = [r["seconds"] for r in runs]
    c = [r["cpu"] for r in runs]
    spread = statistics.stdev(b) if len(b) > 1 else 0.0
    return (f"| {name} | {len(b)} | {statistics.mean(b):.4f} +- {spread:.4f} | "
            f"{min(b):.4f} - {max(b):.4f} | {statistics.mean(s):.1f} | {statistics.mean(c):.1f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seeds", default="0,1,2,3", help="learned-matching seeds to run")
    p.add_argument("--variants", default="", help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    variants = [v for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}: use {', '.join(VARIANTS)}")
    anchor, source, test = default_pair_on_test()
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows = [row(spec, "", run(anchor, source, test, spec)) for spec in ("seed", "weight", "act")]
    groups: dict[str, list[dict]] = {}
    for name, fields, spec in [("learned", {}, "learned")] + [
            (v, VARIANTS[v][1], (VARIANTS[v] + ("learned",))[2]) for v in variants]:
        for seed in seeds:
            r = run(anchor, source, test, spec, LearnOptions(seed=seed, **fields))
            groups.setdefault(name, []).append(r)
            rows.append(row(name, seed, r))
            print(rows[-1], flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    flags = f" --seeds {args.seeds}" + (f" --variants {args.variants}" if variants else "")
    body = "\n".join([
        f"Run as `python bench/learned.py --threads {args.threads}{flags}`. Machine: "
        f"{machine()}; load average {load0:.2f} at the start, {load:.2f} at the end (other "
        "jobs share the CPU: CPU seconds are the steadier measure).",
        "",
        f"Default pair ({anchor.ref}, {source.ref}), test split (397 images), 21-point path; "
        "seconds and CPU seconds (process, all threads) = `match_models` (the start, then "
        "learned matching on the train split; `learned` starts from activation matching, "
        "`weight,learned` from weight matching). Targets: learned <= 15 s, barrier <= 0.02.",
        "",
        "| learned matching | seeds | test barrier, mean +- sd | min - max | mean seconds | "
        "mean CPU s |",
        "|---|---|---|---|---|---|",
        *[summary(n, g) for n, g in groups.items()],
        "",
        *[f"- `{v}`: {VARIANTS[v][0]}" for v in variants],
        "" if variants else "",
        "| SPEC | learn seed | seconds | CPU s | barrier | accuracy at 0.5 | max logit diff | "
        "learned |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    write_section("learned", body, args.results)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

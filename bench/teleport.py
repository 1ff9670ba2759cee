"""Benchmark `teleport`: the default pair's anchor (zoo:vit-digits-s3), digits, 50 steps,
the record's defaults otherwise (128 train examples, 10 trace probes, 30 Lanczos steps),
grad-max and sharp-max.

    python bench/teleport.py [--steps 50] [--threads 1] [--results bench/RESULTS.md]

Writes section `teleport` of bench/RESULTS.md. Target: 50 steps in at most 30 s on this CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import RESULTS, machine, write_section  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--objectives", default="grad-max,sharp-max")
    p.add_argument("--max-condition", type=float, default=30.0)
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from rotviz.data.split import load_split
    from rotviz.measures.teleport import teleport
    from rotviz.sources.plain_torch import load_for_eval

    model = load_for_eval("zoo:vit-digits-s3")
    train = load_split("digits", "train", 0).subset(128)
    test = load_split("digits", "test", 0)
    load, rows = os.getloadavg()[0], []
    for obj in args.objectives.split(","):
        t0 = time.perf_counter()  # one step: the fixed cost (before/after measures, check)
        teleport(model, train, test, obj, steps=1, max_condition=args.max_condition)
        one = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = teleport(model, train, test, obj, steps=args.steps,
                     max_condition=args.max_condition)
        sec = time.perf_counter() - t0
        load = max(load, os.getloadavg()[0])
        per = (sec - one) / max(r.steps - 1, 1)
        rows.append((obj, r.steps, sec, one, per, one + (args.steps - 1) * per, r.top_before,
                     r.top_after, r.grad_norm_before, r.grad_norm_after,
                     r.function_check["loss_relative"], r.max_condition))
        print(rows[-1], flush=True)
    lines = [
        f"Machine: {machine()}; device cpu; load average up to {load:.1f} while measured "
        "(above 1, other work shared the cores: the times are pessimistic).",
        "",
        f"Target: `teleport` on zoo:vit-digits-s3, digits, {args.steps} steps, at most 30 s. "
        "Defaults: 128 train examples, 10 trace probes, 30 Lanczos steps, --group all "
        f"(qk,vo: a GELU FFN has no scales), --max-condition {args.max_condition:g}; the loss "
        "checked on the "
        "whole test split (float64). The time includes the before/after measures (top "
        "eigenvalue, 10-probe trace, gradient norm at both ends); a path ends early when no "
        "step of any size improves the objective within the condition cap.",
        "",
        f"Each row: `--steps {args.steps}` asked; the steps the path took before it converged "
        "at the condition cap, its seconds; a one-step run's seconds (the fixed cost: the "
        "measures at both ends and the function check); the cost of one more step; and "
        f"the projected time of {args.steps} steps taken (fixed + {args.steps - 1} x step).",
        "",
        "| objective | steps taken | seconds | one step, s | per further step, s | "
        f"{args.steps} steps (projected), s | top eigenvalue | gradient norm | "
        "test loss change (relative) | largest condition number |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {o} | {n} | {s:.1f} | {one:.1f} | {per:.2f} | {proj:.1f} | {t0:.4g} -> "
              f"{t1:.4g} | {g0:.4g} -> {g1:.4g} | {lr:.1g} | {c:.3g} |"
              for o, n, s, one, per, proj, t0, t1, g0, g1, lr, c in rows]
    write_section("teleport", "\n".join(lines), args.results)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Benchmark: weight matching's joint steps against the plain rounds on the default pair.

Weight matching (`MatchOptions(heads=True, residual=True)`) with joint steps on the rotation
stream (the default since docs/solvers.md, "Joint steps on a rotation stream") and with
`plain_rounds=True` (the rounds as they were), and the seed paper's matching, each through
`match_models` on the default pair (zoo:vit-digits-s3 -> zoo:vit-digits-s6) in one process,
one torch thread: wall and process CPU seconds (after a warm-up matching), rounds per phase,
how each phase ended and its last gain, the canonical distance, and the barrier on the test
split (21 points). Writes section `joint` of bench/RESULTS.md.

    python bench/joint.py [--results PATH]
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
from rotviz.match.options import MatchOptions  # noqa: E402
from rotviz.match.pipeline import match_models  # noqa: E402
from rotviz.measures.barrier import interpolate  # noqa: E402

WEIGHT = MatchOptions(heads=True, residual=True)
RUNS = (("weight, joint steps (default)", WEIGHT),
        ("weight, plain rounds (`plain_rounds=True`)",
         MatchOptions(heads=True, residual=True, plain_rounds=True)),
        ("seed paper (`MatchOptions()`)", MatchOptions()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    anchor, source, test = default_pair_on_test()
    match_models(anchor, source, MatchOptions(heads=True, residual=True, rounds=2))  # warm-up
    rows = []
    for what, options in RUNS:
        load = os.getloadavg()[0]
        w0, c0 = time.perf_counter(), time.process_time()
        m = match_models(anchor, source, options)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        c = interpolate(anchor, source, test, options, 21)
        res = m.report.residual or {}
        ended = ", ".join(f"{e} ({g:.1e})" for e, g in
                          zip(res.get("phase_ended", []), res.get("last_gain", []), strict=True))
        steps = (f"{res['joint_steps']} + {res['plain_steps']}"
                 if res.get("joint_steps") is not None else "-")
        phases = " + ".join(str(r) for r in res["phase_rounds"]) if res else "-"
        canonical = f"{res['distance_canonical_after']:.3f}" if res else "-"
        rows.append(f"| {what} | {wall:.2f} | {cpu:.2f} | {phases} | {ended or '-'} | {steps} | "
                    f"{canonical} | {m.report.after.total:.3f} | {c.barrier:.3f} | "
                    f"{load:.1f} -> {os.getloadavg()[0]:.1f} |")
        print(rows[-1], flush=True)
    body = "\n".join([
        "Written by `bench/joint.py`: weight matching on the default pair "
        f"({anchor.ref} -> {source.ref}) with joint steps (default) and with the plain rounds, "
        "and the seed paper's matching; `match_models` (matching and the function check), one "
        "torch thread, one process, after a warm-up. Ended: per phase, `converged` or `rounds` "
        "(the cap of 50), with the last round's gain as a share of the starting squared "
        "distance. Steps: the continuous blocks' quasi-Newton + plain steps. Barrier: test "
        f"split, 21 points. Machine: {machine()}; the load column is the 1-minute load average "
        "(other jobs share the 2 cores: wall times are pessimistic, CPU seconds steadier).",
        "",
        "| matching | wall s | CPU s | rounds (per phase) | ended (last gain) | steps | "
        "canonical distance | parameter distance | barrier | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    write_section("joint", body, args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

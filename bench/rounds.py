"""Benchmark: what the alternation's rounds buy, on the default pair.

    python bench/rounds.py [--threads 2] [--caps 1,2,5,10,20,50,200] [--results PATH]

Weight matching (`MatchOptions(heads=True, residual=True)`, rotviz.match.alternating) alternates
the per-layer maps and the residual map until a round gains less than `tol` of the starting
objective, at most `rounds` rounds per phase. A round cap is the obvious way to make it
cheaper (bench/weight.py measures caps at large sizes), so this table shows what a cap costs
in quality where quality can be measured: for each cap, the rounds each phase ran, the
canonical and parameter distances, the interpolation barrier and midpoint accuracy (test
split, 21 points), the function check, and the time of `match_models`. The seed paper's
matching and no matching are the reference rows. Writes section `rounds` of
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.results import RESULTS, default_pair_on_test, machine, write_section  # noqa: E402
from rotviz.match.endpoints import match_endpoints  # noqa: E402
from rotviz.match.options import MatchOptions  # noqa: E402
from rotviz.measures.barrier import curve_on, interpolate  # noqa: E402

DEFAULT = MatchOptions(heads=True, residual=True)


def row(anchor, source, test, what: str, options: MatchOptions | None) -> str:
    if options is None:
        c = interpolate(anchor, source, test, None, 21)
        return (f"| {what} | - | - | {c.distance_before:.3f} | {c.barrier:.3f} | "
                f"{c.mid_acc:.3f} | - | - |")
    t0 = time.perf_counter()
    ends = match_endpoints(anchor, source, options)
    seconds = time.perf_counter() - t0
    c = curve_on(ends, test, 21)
    report = ends.report
    res = report.residual
    phases = " + ".join(str(r) for r in res["phase_rounds"]) if res else "-"
    canonical = f"{res['distance_canonical_after']:.3f}" if res else "-"
    return (f"| {what} | {phases} | {canonical} | {report.after.total:.3f} | {c.barrier:.3f} | "
            f"{c.mid_acc:.3f} | {report.max_output_diff:.1e} | {seconds:.1f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--caps", default="1,2,5,10,20,50,200",
                   help="round caps to measure (per phase); 50 is the library default")
    p.add_argument("--tols", default="1e-4,1e-5", help="tolerances to measure at the default cap")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    anchor, source, test = default_pair_on_test()
    a_ref, b_ref = anchor.ref, source.ref
    match_endpoints(anchor, source, DEFAULT)  # warm-up: solvers loaded outside the timings
    rows = [row(anchor, source, test, "none", None),
            row(anchor, source, test, "seed paper (`seed`)", MatchOptions())]
    for cap in (int(x) for x in args.caps.split(",") if x):
        what = f"weight, rounds <= {cap}" + (" (default)" if cap == DEFAULT.rounds else "")
        rows.append(row(anchor, source, test, what, MatchOptions(heads=True, residual=True,
                                                                rounds=cap)))
    for tol in (float(x) for x in args.tols.split(",") if x):
        rows.append(row(anchor, source, test, f"weight, tol {tol:g}",
                        MatchOptions(heads=True, residual=True, tol=tol)))
    body = "\n".join([
        f"Written by `bench/rounds.py`: weight matching (`{DEFAULT.label}`) on the default "
        f"pair ({a_ref} -> {b_ref}) under round caps (per phase: without head permutation, "
        f"then with it) and tolerances (default tol {DEFAULT.tol:g}); barrier and midpoint "
        "accuracy on the test split, 21 points. Canonical distance: between the canonical "
        "forms the alternation works on (norms folded); parameter distance: between the "
        "models as written. Seconds: `match_models` (matching and the function check). "
        f"Machine: {machine()}.",
        "",
        "| matching | rounds run (per phase) | canonical distance | parameter distance | "
        "barrier | midpoint accuracy | max output diff | seconds |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    print(body)
    write_section("rounds", body, args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: aligning the zoo's four digits ViT seeds onto their barycentre.

    python bench/many.py [--threads 2] [--rounds 10] [--specs seed,weight] [--results PATH]

Times `rotviz.match.many.align_many` (to="barycentre") on the four default-pair-sized
seeds (zoo.SEEDS) for each matching SPEC: the pass onto the anchor, then at most `--rounds`
rounds onto the mean (tol 1e-4), every alignment's function check included. Also reports the
mean pairwise distance before and after and the merged accuracy of all four (test split),
aligned and not. Target: at most 30 s for seed matching on this CPU (reported, not asserted).
Writes section `many` of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.results import RESULTS, machine, write_section  # noqa: E402
from rotviz import zoo_registry as zoo  # noqa: E402
from rotviz.data.reading import split_for  # noqa: E402
from rotviz.match.many import align_many  # noqa: E402
from rotviz.match.pipeline import match_models  # noqa: E402
from rotviz.measures.many import merged_curve  # noqa: E402
from rotviz.sources.loading import load_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--specs", default="seed,weight")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = [load_model(f"zoo:{n}") for n in zoo.SEEDS]
    test = split_for(models[0], "digits", "test")
    match_models(models[0], models[1])  # warm-up: solvers loaded outside the timings
    rows = []
    for spec in (s for s in args.specs.split(",") if s):
        t0 = time.perf_counter()
        a = align_many(models, spec, "barycentre", rounds=args.rounds)
        seconds = time.perf_counter() - t0
        c = merged_curve(models, a, test)
        rows.append(f"| {spec} | {seconds:.1f} | {a.rounds} ({a.ended}) | {a.spread[0]:.3f} | "
                    f"{a.spread[1]:.3f} | {a.spread[-1]:.3f} | {c.acc['unaligned'][-1]:.3f} | "
                    f"{c.acc['aligned'][-1]:.3f} | {a.max_output_diff:.1e} |")
        print(rows[-1], flush=True)
    body = "\n".join([
        f"Written by `bench/many.py`: the four digits ViT seeds ({', '.join(zoo.SEEDS)}) "
        f"aligned onto their barycentre (at most {args.rounds} rounds, tol 1e-4), per matching "
        "SPEC. Seconds: `align_many` (the anchor pass, the rounds and every function check; "
        "target <= 30 s for seed). Mean pairwise parameter distance as given, after the anchor "
        "pass and at the end; accuracy of the equal-weight mean of all four on the test split. "
        f"Machine: {machine()}.",
        "",
        "| matching | seconds | rounds | distance as given | onto the anchor | barycentre | "
        "merged acc, not aligned | merged acc, aligned | max output diff |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    print(body)
    write_section("many", body, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

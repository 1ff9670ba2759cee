"""Time layer-wise barriers of the default pair (target: at most 10 s on the 2-core CPU).

Each configuration runs on the digits test split: blocks and module kinds, with and without
the unmatched comparison, and says how many points it evaluated (each distinct point once:
rotviz.measures.layerwise.series). Matching (seed) is timed apart; it is shared with every
other measurement of the pair.

    .venv/bin/python bench/layerwise.py [--device cpu] [--points 11] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    ap.add_argument("--points", type=int, default=11, help="alphas on each path (default 11)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    args = ap.parse_args(argv)

    import torch

    from rotviz.data.split import load_split
    from rotviz.evaluation import Evaluator
    from rotviz.match.endpoints import match_endpoints
    from rotviz.measures.layerwise import layerwise_on
    from rotviz.sources.loading import load_model
    from rotviz.zoo_registry import default_pair

    if args.threads:
        torch.set_num_threads(args.threads)
    ra, rb = default_pair()
    a, b = load_model(ra), load_model(rb)
    split = load_split("digits", "test")
    t = time.perf_counter()
    ends = match_endpoints(a, b, "seed", args.device)
    print(f"matching (seed): {time.perf_counter() - t:.2f} s")
    ev = Evaluator(a, split, args.device)
    t = time.perf_counter()
    ev.evaluate(ev.params(a.state))
    print(f"one evaluation of {split.n} samples: {time.perf_counter() - t:.3f} s")
    calls = [0]
    evaluate = ev.evaluate

    def counted(params):
        calls[0] += 1
        return evaluate(params)

    ev.evaluate = counted  # type: ignore[method-assign]  # counts what layerwise_on asks
    for by in ("block", "kind"):
        for compare in (False, True):
            calls[0] = 0
            t = time.perf_counter()
            r = layerwise_on(ends, split, args.points, by, compare, args.device, evaluator=ev)
            print(f"by {by:5s} compare {'yes' if compare else 'no '}: "
                  f"{time.perf_counter() - t:6.2f} s  ({len(r.groups)} groups x {args.points} "
                  f"points, {calls[0]} evaluations; full barrier {r.full_barrier:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

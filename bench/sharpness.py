"""Time sharpness along the path (rotviz sharpness) on the default pair: the top Hessian
eigenvalue at `--points` alphas of the matched and the unmatched path, on the first
`--examples` digits test samples. Prints the time and the two curves.

    python bench/sharpness.py [--device cpu|cuda|auto] [--threads 1] [--points 5]
                              [--examples 256] [--match seed]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from rotviz.data.split import load_split  # noqa: E402
from rotviz.devices import resolve_device  # noqa: E402
from rotviz.match.endpoints import match_endpoints  # noqa: E402
from rotviz.measures.sharpness import sharpness_on  # noqa: E402
from rotviz.sources.loading import load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)  # a shared 2-core CPU: 2 spin-wait
    ap.add_argument("--points", type=int, default=5)
    ap.add_argument("--examples", type=int, default=256)
    ap.add_argument("--match", default="seed")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from rotviz.zoo_registry import default_pair

    a_ref, b_ref = default_pair()
    ends = match_endpoints(load_model(a_ref), load_model(b_ref), args.match)
    split = load_split("digits", "test")
    split = split.subset(min(args.examples, split.n))
    device = resolve_device(args.device)
    t = time.perf_counter()
    r = sharpness_on(ends, split, args.points, device)
    dt = time.perf_counter() - t
    print(f"sharpness of {a_ref} -> {b_ref} ({args.match}) at {args.points} alphas on "
          f"{split.n} digits test samples ({device}, {args.threads} threads): {dt:.2f} s, "
          f"{r.hvps} Hessian-vector products")
    for name, vals in (("matched", r.matched), ("unmatched", r.unmatched)):
        print(f"  {name:9s} " + " ".join(f"{v:9.4g}" for v in vals or []))


if __name__ == "__main__":
    main()

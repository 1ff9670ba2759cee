"""Time the top Hessian eigenvalue (rotviz hessian --top 1) of a default-pair model on its
whole digits test split; target <= 10 s on this 2-core CPU. Prints the timings (median of
`--repeat` runs) and the eigenvalue.

    python bench/hessian.py [--device cpu|cuda|auto] [--threads 1] [--repeat 3] [--top 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from rotviz.analysis.hessian import hessian  # noqa: E402
from rotviz.data import load_split  # noqa: E402
from rotviz.devices import resolve_device  # noqa: E402
from rotviz.models import load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)  # a shared 2-core CPU: 2 spin-wait
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--top", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from rotviz.zoo_registry import default_pair

    ref = default_pair()[0]
    model, split = load_model(ref), load_split("digits", "test")
    device = resolve_device(args.device)
    times, r = [], None
    for _ in range(args.repeat):
        t = time.perf_counter()
        r = hessian(model, None, split, device, top=args.top)
        times.append(time.perf_counter() - t)
    print(f"hessian top-{args.top} of {ref} on {split.n} digits test samples ({device}, "
          f"{args.threads} threads): median {statistics.median(times):.2f} s "
          f"(runs {', '.join(f'{t:.2f}' for t in times)}); eigenvalues {r.eigenvalues}, "
          f"{r.hvps} Hessian-vector products, {r.n_params} parameters")


if __name__ == "__main__":
    main()

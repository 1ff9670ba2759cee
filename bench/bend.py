"""Benchmark curve training (issue 27 item 3): the Bezier bend of the default pair.

    python bench/bend.py [--steps 300] [--threads 2] [--device cpu]

Prints the training time, the evaluation time and both barriers (target: training <= 60 s
on this 2-core CPU with the default 300 steps).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from rotviz.analysis.curves import bend_on  # noqa: E402
from rotviz.data import load_split  # noqa: E402
from rotviz.match.endpoints import match_endpoints  # noqa: E402
from rotviz.models import load_model  # noqa: E402
from rotviz.zoo_registry import default_pair  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--kind", default="bezier", choices=("bezier", "chain"))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    ra, rb = default_pair()
    ends = match_endpoints(load_model(ra), load_model(rb), "seed")
    split = load_split("digits", "test")
    t = time.perf_counter()
    r = bend_on(ends, split, a.kind, a.steps, device=a.device)
    total = time.perf_counter() - t
    print(f"bend {a.kind} on {r.device}, {a.threads} threads: {r.steps} steps trained in "
          f"{r.train_seconds:.1f} s (target <= 60 s), total {total:.1f} s; barrier "
          f"{r.barrier:.4f} vs straight line {r.line_barrier:.4f}; bend {r.off_plane:.2f} off "
          "the A/B/B' plane")


if __name__ == "__main__":
    main()

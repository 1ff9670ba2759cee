"""Time a 21 x 21 random-direction plane (filter normalised) around a default-pair model.

    python bench/slice.py [--device cpu|cuda|auto] [--threads 2] [--grid 21]

Target (issue 27): at most 20 s on this 2-core CPU. Prints the timing; writes nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from rotviz.analysis.slices import slice_at  # noqa: E402
from rotviz.data import load_split  # noqa: E402
from rotviz.models import load_model  # noqa: E402
from rotviz.zoo_registry import default_pair  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--grid", type=int, default=21)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(default_pair()[0])
    split = load_split("digits", "test")
    t = time.perf_counter()
    s = slice_at(model, split, dims=2, grid=args.grid, device=args.device)
    took = time.perf_counter() - t
    print(f"{args.grid}x{args.grid} random plane of {model.ref} on {s.device} "
          f"({split.n} samples, {args.threads} threads): {took:.2f} s "
          f"({1e3 * took / args.grid**2:.1f} ms a point); centre loss {s.centre_loss:.4f}")


if __name__ == "__main__":
    main()

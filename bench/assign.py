"""Benchmark: the FFN assignment at real widths, scipy's exact solver against the auction.

rotviz matches FFN units by a linear assignment on C = W_in1 W_in2^T + W_gate1 W_gate2^T +
W_out1^T W_out2 (rotviz.match.layer_solvers.ffn_cost). This builds that cost from two independent
random SwiGLU layers of a real shape (LLaMA-1B: d 2048, 8192 units; LLaMA-2-7B: d 4096,
11008 units; float32 weights, float64 cost) and solves it with `rotviz.groups.assign` (scipy,
exact) and `rotviz.groups.auction` (torch, epsilon scaling, on --device) at two gap targets.
For each: seconds, the objective against the exact one, and the auction's dual gap (its
proven bound on the distance from exact). Writes the `assign` section of bench/RESULTS.md.

    python bench/assign.py [--device cpu|cuda] [--shapes llama-1b,llama-7b] [--results PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.results import RESULTS, machine, write_section  # noqa: E402
from rotviz.groups import assign, auction  # noqa: E402

SHAPES = {"llama-1b": (2048, 8192), "llama-7b": (4096, 11008)}
GAPS = (1e-9, 1e-6)


def cost(d: int, m: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)

    def layer():
        return [torch.randn(m, d, generator=g) / d**0.5 for _ in range(3)]  # up, gate, down^T

    a, b = layer(), layer()
    return sum((x @ y.T).double() for x, y in zip(a, b, strict=True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/assign.py: error: no CUDA GPU is visible", file=sys.stderr)
        return 2
    rows = []
    for name in args.shapes.split(","):
        d, m = SHAPES[name]
        c = cost(d, m)
        t = time.perf_counter()
        exact = assign(c.numpy())
        t_exact = time.perf_counter() - t
        opt = float(c[exact, torch.arange(m)].sum())
        rows.append(f"| {name} ({m} units) | scipy (exact) | {t_exact:.2f} | {opt:.4f} | 0 "
                    "| - | - |")
        print(rows[-1], flush=True)
        dev = c.to(args.device)
        for gap in GAPS:
            if args.device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            r = auction(dev, gap=gap)
            if args.device == "cuda":
                torch.cuda.synchronize()
            took = time.perf_counter() - t
            rows.append(f"| {name} ({m} units) | auction, gap <= {gap:g} x spread | {took:.2f} | "
                        f"{r.objective:.4f} | {(opt - r.objective) / abs(opt):.1e} | "
                        f"{r.gap:.2e} | {r.rounds} |")
            print(rows[-1], flush=True)
    body = (
        f"Written by `bench/assign.py` on {args.device}: {machine(args.device)}. The FFN "
        "assignment cost of two independent random SwiGLU layers of each shape (float64), "
        "solved by scipy's exact `linear_sum_assignment` (`rotviz.groups.assign`, always on the "
        "CPU) and by `rotviz.groups.auction` (torch, epsilon scaling). Relative shortfall: "
        "(exact - auction objective) / exact. Dual gap: the auction's proven bound on its "
        "distance from the optimum (dual bound - objective).\n\n"
        "| shape | solver | seconds | objective | relative shortfall | dual gap "
        "| bidding rounds |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    write_section(f"assign-{args.device}", body, args.results)
    print(f"wrote the assign-{args.device} section of {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark the sparsifying merges (breadcrumbs, breadcrumbs_ties, della, della_linear) beside
TIES, on one LLaMA-1B-shaped tensor (an MLP projection, 8192 x 2048, bf16) of two models about
a base: rotviz's merge by slices of rows (`rotviz.merging.rows.whole`, one torch thread, as
at size) and mergekit 0.1.5's `merge_group` on the same tensors (its own threads).

    python bench/sparse.py [--rows 8192] [--cols 2048] [--repeat 1] [--results bench/RESULTS.md]

Writes section `sparse` of bench/RESULTS.md. The issue's target (a whole LLaMA-1B pair at
size within 1.5x of mergekit's time) is bench/merge_size.py's; this one tensor says where
each method's time goes per entry.
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

# rotviz method -> (its keywords, mergekit's parameters), densities as the papers use them
CASES = {
    "ties": ({"density": 0.2}, {"density": 0.2}),
    "breadcrumbs": ({"density": 0.9, "gamma": 0.01}, {"density": 0.9, "gamma": 0.01}),
    "breadcrumbs_ties": ({"density": 0.9, "gamma": 0.01}, {"density": 0.9, "gamma": 0.01}),
    "della": ({"density": 0.5, "epsilon": 0.1, "rescale": "l1"},
              {"density": 0.5, "epsilon": 0.1}),
    "della_linear": ({"density": 0.5, "epsilon": 0.1, "rescale": "l1"},
                     {"density": 0.5, "epsilon": 0.1}),
}


def ours(name: str, tensors, base, kw: dict):
    from rotviz.merging.breadcrumbs import breadcrumbs
    from rotviz.merging.della import della
    from rotviz.merging.ties import ties

    w = (0.5, 0.5)
    if name == "ties":
        return ties(tensors, base, w, **kw)
    if name.startswith("breadcrumbs"):
        return breadcrumbs(tensors, base, w, **kw,
                           consensus="sum" if name.endswith("ties") else None)
    return della(tensors, base, w, "mlp.up_proj.weight", **kw,
                 consensus="sum" if name == "della" else None)


def main() -> None:
    import torch

    from tests.merging.mergekit_reference import mergekit_merge

    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--cols", type=int, default=2048)
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    shape = (args.rows, args.cols)
    base = torch.randn(shape, generator=g).bfloat16()
    tensors = [(base.float() + 0.01 * torch.randn(shape, generator=g)).bfloat16()
               for _ in range(2)]
    rows, load = [], os.getloadavg()[0]
    for name, (kw, theirs_kw) in CASES.items():
        t0 = time.perf_counter()
        ours(name, tensors, base, kw)
        mine = time.perf_counter() - t0
        t0 = time.perf_counter()
        mergekit_merge(name, [t.float() for t in tensors], base.float(), (0.5, 0.5),
                       **theirs_kw)
        theirs = time.perf_counter() - t0
        load = max(load, os.getloadavg()[0])
        rows.append((name, mine, theirs))
        print(rows[-1], flush=True)
    lines = [
        f"Machine: {machine()}; device cpu; load average up to {load:.1f} while measured "
        "(the VM is shared by several engineers' test runs: pessimistic numbers, for the "
        "integrator to rerun on an idle machine).",
        "",
        f"One {args.rows} x {args.cols} bf16 tensor of two models about a base (random, task "
        "vectors 0.01 x N(0, 1)), weights 0.5 and 0.5. rotviz: by slices of rows in float64 "
        "on one thread (the whole-tensor cuts of TIES and Breadcrumbs in passes over the "
        "slices; DELLA's L1 norms in a first pass that draws the masks); mergekit: its "
        "`merge_group` in float32 on its threads.",
        "",
        "| method | rotviz s | mergekit s | ratio |",
        "|---|---|---|---|",
    ]
    lines += [f"| {n} | {a:.2f} | {b:.2f} | {a / b:.2f} |" for n, a, b in rows]
    write_section("sparse", "\n".join(lines), args.results)


if __name__ == "__main__":
    main()

"""Where weight matching's memory goes: peak resident memory per step, at a real width.

Builds the anchor and source of a bench/weight.py size (seeds 0 and 1; --layers keeps that
many layers of its width), reads their views, and runs `rotviz.match.engine.match` with
`MatchOptions(heads=True, residual=True, rounds=R)` (R rounds per phase: without head
permutation, then with it). A thread samples the process's resident memory every 2 ms and
keeps, for each step the progress callback names (canonical forms and the first objective
before the first step, each round's per-layer maps and residual map, the end), the highest
level reached above the level before the models were built: the two models plus everything
matching holds. Printed per step as GB and as a multiple of the two models' weight bytes.
No RESULTS.md section: copy the lines you need (bench/RESULTS.md, `weight memory`).

    python bench/weight_memory.py [--size qwen2-0.5b] [--layers N] [--rounds R] [--threads 2]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.match import _status, weight_bytes  # noqa: E402
from bench.weight import SIZES, build, warm_up  # noqa: E402
from rotviz.match.engine import match  # noqa: E402
from rotviz.match.options import MatchOptions  # noqa: E402
from rotviz.symmetry.view import read_view  # noqa: E402

GB = 1024**3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="qwen2-0.5b", choices=list(SIZES))
    p.add_argument("--layers", type=int, default=None, help="layers of that width (default all)")
    p.add_argument("--rounds", type=int, default=1, help="rounds per phase")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    warm_up("cpu")
    gc.collect()
    base = _status("VmRSS")
    anchor, source = build(args.size, 0, args.layers), build(args.size, 1, args.layers)
    weights = weight_bytes(anchor, source)
    va = read_view(anchor.spec, anchor.config, anchor.state)
    vs = read_view(source.spec, source.config, source.state)
    load0 = os.getloadavg()[0]
    print(f"{args.size}, {va.dims.n_layers} layers: two models {weights / GB:.3f} GB of weights",
          flush=True)
    label, per, stop = ["canonical forms, first objective"], {}, threading.Event()

    def sample() -> None:
        while not stop.wait(0.002):
            now = _status("VmRSS") - base
            per[label[0]] = max(per.get(label[0], 0), now)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()

    def progress(done: int, total: int, message: str) -> None:
        label[0] = message.split(",")[0]

    t0 = time.perf_counter()
    res = match(va, vs, MatchOptions(heads=True, residual=True, rounds=args.rounds), progress)
    seconds = time.perf_counter() - t0
    label[0] = "after (the result held)"
    time.sleep(0.05)
    stop.set()
    thread.join()
    peak = max(per.values())
    print(f"{seconds:.1f} s, rounds {res.report.residual['rounds']}, distance "
          f"{res.report.before.total:.2f} -> {res.report.after.total:.2f}; peak {peak / GB:.2f} GB"
          f" = {peak / weights:.2f}x weights; load {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    for step, value in per.items():
        print(f"  {step:45s} {value / GB:6.2f} GB = {value / weights:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

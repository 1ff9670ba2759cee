"""Time the symmetry tangents and the `flat` report on a default-pair model.

Prints: building every tangent piece by piece (`tangent_blocks`), gauge fixing two
directions against them (one QR per piece: `gauge_fixed_directions`), and the report with
up to --per-layer tangents per block and kind on --examples test examples (with and
without the curvature column).

    .venv/bin/python bench/flat.py [--device cpu] [--per-layer 4] [--examples 128] [--threads N]
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
    ap.add_argument("--per-layer", type=int, default=4, help="tangents per block and kind")
    ap.add_argument("--examples", type=int, default=128, help="test examples (default 128)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    args = ap.parse_args(argv)

    import torch

    from rotviz.analysis.directions import gauge_fixed_directions
    from rotviz.analysis.tangents import tangent_blocks
    from rotviz.data.reading import split_for
    from rotviz.measures.flat import flat
    from rotviz.sources.loading import load_model
    from rotviz.zoo_registry import default_pair

    if args.threads:
        torch.set_num_threads(args.threads)
    ref = default_pair()[0]
    model = load_model(ref)
    split = split_for(model, "digits", "test")
    split = split.subset(min(args.examples, split.n))

    t0 = time.perf_counter()
    blocks = tangent_blocks(model)
    k = sum(b.t.shape[0] for b in blocks)
    print(f"{ref}: {k} tangents in {len(blocks)} pieces in {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    gauge_fixed_directions(model, None, 2)
    print(f"two gauge-fixed random directions (tangents included): "
          f"{time.perf_counter() - t0:.2f} s")
    for curv in (False, True):
        r = flat(model, None, split, args.device, args.per_layer, curvature=curv)
        print(f"flat report, {len(r.rows)} tangents, curvature {'on' if curv else 'off'}, "
              f"{r.n} examples on {r.device}: {r.seconds:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

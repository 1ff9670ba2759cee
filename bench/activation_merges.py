"""Activation-based merges of the default pair beside the weight-based ones: the merged
model's accuracy after weight matching and after activation matching, with the simple
average, RegMean and CCA Merge (and ZipIt!, once registered).

    python bench/activation_merges.py [--specs weight act] [--threads 2] [--cca-regs 0.01 1 10]

The zoo's default pair (two digits ViTs trained from different seeds) on the digits test
split; statistics (RegMean's Gram matrices, CCA Merge's activations) come from 8 x 32
seeded examples of the train split, weight 0.5. Each cell is one `rotviz merge A B --match
SPEC --method METHOD` (rotviz.analysis.fusion.fusion_table computes them all, matching each
SPEC once). CCA Merge runs after the matching: it replaces the stream's and the FFN units'
alignment by its own linear maps and keeps the heads as matched.

Rows are the registered merge methods in `METHODS`; a method not (yet) registered is left
out, so ZipIt!'s row (helper `zipit`, merge method `zipit`) appears when its module lands. A
row that is not a plain merge method (a partial zip with per-model heads) goes in
`extra_rows`.

Writes section `activation_merges` of bench/RESULTS.md. Results, not timings: the seconds
are for scale only (the machine was shared with other jobs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import RESULTS, default_pair_on_test, machine, write_section  # noqa: E402

METHODS = ("simple", "regmean", "cca", "zipit")  # rows, where registered
LABELS = {"weight": "weight matching", "act": "activation matching",
          "weight,act": "activation matching", "none": "no matching"}


def extra_rows(anchor, source, test, specs: list[str]) -> list[tuple[str, list[str]]]:
    """Rows that are not one registered merge method per cell: (label, one cell per SPEC).
    None today; ZipIt!'s partial zips (--zip-layers k) belong here if they need their own
    evaluation."""
    return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--specs", nargs="+", default=["weight", "act"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cca-regs", type=float, nargs="+", default=[0.01, 1.0, 10.0],
                   help="CCA Merge's ridges, one row each (the first is the table's own)")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    import torch

    from rotviz.analysis.fusion import fusion_table
    from rotviz.merging import names

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    anchor, source, test = default_pair_on_test()
    train = test.sibling("train")
    methods = [m for m in METHODS if m in names()]
    regs = args.cca_regs
    t0 = time.perf_counter()
    t = fusion_table(anchor, source, test, train, methods=methods, specs=args.specs,
                     cca_reg=regs[0])
    more = [fusion_table(anchor, source, test, train, methods=["cca"], specs=args.specs,
                         cca_reg=r) for r in regs[1:]]
    seconds = time.perf_counter() - t0
    head = "| merge | " + " | ".join(f"after {LABELS.get(s, s)}" for s in t.specs) + " |"
    rows = [head, "|---|" + "---|" * len(t.specs)]
    for m in t.methods:
        label = f"cca (ridge {regs[0]:g})" if m == "cca" else m
        rows.append(f"| {label} | " + " | ".join(f"{t.acc[m][s]:.3f}" for s in t.specs) + " |")
    for r, x in zip(regs[1:], more, strict=True):
        rows.append(f"| cca (ridge {r:g}) | " + " | ".join(f"{x.acc['cca'][s]:.3f}"
                                                         for s in x.specs) + " |")
    for label, cells in extra_rows(anchor, source, test, t.specs):
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    ridges = ", ".join(f"{r:g}" for r in regs)
    timing = ", ".join(f"{k} {v:.1f} s" for k, v in t.timing.items())
    body = (f"Machine: {machine()} (shared with other jobs: seconds for scale only).\n\n"
            f"Run as `python bench/activation_merges.py --threads {args.threads}` (side by side "
            "with other helpers' jobs). Default "
            f"pair `{anchor.ref}` (accuracy {t.anchor_acc:.3f}) and `{source.ref}` "
            f"(accuracy {t.source_acc:.3f}) on the digits {t.split} split ({test.n} images); "
            f"statistics from {t.batches} x {t.batch_size} train examples, weight {t.weight}, "
            f"RegMean alpha {t.alpha}, CCA Merge at ridges (`--cca-reg`) {ridges} "
            "(default 0.01). Each cell is the merged model's "
            "accuracy; `cca` is CCA Merge after that matching (its own maps for the stream "
            "and the FFN units, the heads as matched). ZipIt! (helper `zipit`) adds its row "
            f"here.\n\n" + "\n".join(rows) + f"\n\n{seconds:.0f} s for the table ({timing}).\n")
    print(body)
    write_section("activation_merges", body, args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

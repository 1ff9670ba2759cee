"""The seed paper's Table 1, small: merge the zoo's NLP fine-tunes with every fusion method,
with and without matching first, scored by F1.

    python bench/table1.py [--pairs nlp-cls nlp-tok] [--specs none seed weight]

The zoo's `nlp-cls` pair (docstring topics, sequence classification, macro-F1) and `nlp-tok`
pair (code token types, token classification, entity micro-F1) are fine-tunes of two
differently seeded RoBERTa masked LMs on the two halves of their task's training split
(rotviz/zoo/nlp.py). Each table is `rotviz.analysis.fusion.fusion_table` on the pair's test
split, statistics for Fisher and RegMean from 8 x 32 training examples, weight 0.5, RegMean
alpha 0.9, as the app's Merge page computes it. The seed paper keeps each model's own
classifier head unmerged; rotviz merges every tensor, heads included, so these numbers are the
harder setting.

Writes section `table1` of bench/RESULTS.md. These are results, not timings: the seconds are
only for scale.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import RESULTS, machine, write_section  # noqa: E402

METRIC = {"seq-cls": "macro_f1", "token-cls": "entity_f1"}
NAMES = {"macro_f1": "macro-F1", "entity_f1": "entity micro-F1"}


def table(pair: str, specs: list[str]) -> str:
    from rotviz import zoo_registry as zoo
    from rotviz.analysis.fusion import METHODS, fusion_table
    from rotviz.data.reading import split_for
    from rotviz.sources.loading import load_model

    a_ref, b_ref = zoo.pair(pair)
    a, b = load_model(a_ref), load_model(b_ref)
    data = zoo.read_card(a_ref.removeprefix("zoo:"))["data"]["ref"]
    test, train = split_for(a, data, "test"), split_for(a, data, "train")
    t0 = time.perf_counter()
    t = fusion_table(a, b, test, train, methods=METHODS, specs=specs)
    seconds = time.perf_counter() - t0
    f1 = METRIC[test.task]
    ends = (f"anchor `{a_ref}` accuracy {t.anchor_acc:.3f}, {NAMES[f1]} "
            f"{t.anchor_scores[f1]:.3f}; source `{b_ref}` accuracy {t.source_acc:.3f}, "
            f"{NAMES[f1]} {t.source_scores[f1]:.3f}")
    head = "| method | " + " | ".join(f"{sp}: {NAMES[f1]} / accuracy" for sp in t.specs) + " |"
    rows = [head, "|---|" + "---|" * len(t.specs)]
    for m in t.methods:
        cells = [f"{t.scores[m][sp][f1]:.3f} / {t.acc[m][sp]:.3f}" for sp in t.specs]
        rows.append(f"| {m} | " + " | ".join(cells) + " |")
    dist = ", ".join(f"{sp} {t.distance[sp]:.2f}" for sp in t.specs)
    return (f"### `{pair}` ({test.task}, {data}, {t.split} split, {test.n} examples)\n\n"
            f"Ends: {ends}. Distance of the (matched) source to the anchor: {dist}. "
            f"{seconds:.0f} s for the table.\n\n" + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", nargs="+", default=["nlp-cls", "nlp-tok"])
    p.add_argument("--specs", nargs="+", default=["none", "seed", "weight"])
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    import torch

    torch.manual_seed(0)
    parts = [table(pair, args.specs) for pair in args.pairs]
    body = (f"Machine: {machine()}.\n\nRun as `python bench/table1.py`. Merged models of the "
            "zoo's NLP fine-tunes (the seed paper's Table 1 shape): each cell is the merged "
            "model's F1 / accuracy on the test split, for each fusion method (rows) after each "
            "matching (columns: `none` merges the raw pair, `seed` after the seed paper's "
            "matching, `weight` also with head permutation and the residual stream). Every "
            "tensor is merged, classifier heads included.\n\n" + "\n".join(parts))
    print(body)
    write_section("table1", body, args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

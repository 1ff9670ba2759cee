"""Benchmark `similarity`: every layer pair of the default pair on the test split, and a
random roberta-base-shaped pair (12 blocks, d 768, 12 heads, FFN 3072) on 32 x 128 tokens.

    python bench/similarity.py [--repeat 3] [--device cpu] [--results bench/RESULTS.md]

Writes section `similarity` of bench/RESULTS.md. Target: the default pair, all layer pairs,
the test split, <= 5 s on this CPU. The endpoints are matched (or not) before the clock
starts: the rows time `similarity_on` (hidden states of A, B and B', then every layer pair),
not matching, which `bench/match.py` times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import RESULTS, default_pair_on_test, machine, write_section  # noqa: E402

ROBERTA_BASE = dict(layers=12, d=768, heads=12, ffn=3072, positions=128)


def timed(fn, repeat: int) -> tuple[float, float, dict]:
    times, out = [], {}
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), out


def roberta_split(model, n: int = 32, length: int = 128):
    """n random sequences of `length` tokens of the model's vocabulary (all real tokens)."""
    import torch

    from rotviz.data.reading import task_of
    from rotviz.data.split import Split

    gen = torch.Generator().manual_seed(0)
    vocab = int(model.config["vocab_size"])
    x = torch.randint(3, vocab, (n, length), generator=gen)
    return Split("random", "test", task_of(model) or "masked", x, x.clone(), vocab, "chars",
                 extra={"attention_mask": torch.ones(n, length, dtype=torch.long)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args()

    from rotviz.atsize.blocks import open_streamed
    from rotviz.atsize.endpoints import streamed_endpoints
    from rotviz.match.endpoints import match_endpoints, unmatched
    from rotviz.measures.similarity import similarity_on, sized_similarity
    from rotviz.random_models import save_random
    from rotviz.sources.loading import load_model

    load = os.getloadavg()[0]
    rows = []
    a, b, split = default_pair_on_test()
    for spec, metric, tokens in (("none", "cka", "mean"), ("seed", "cka", "mean"),
                                 ("weight", "cka", "mean"), ("seed", "cka", "all"),
                                 ("seed", "procrustes", "mean"), ("seed", "cka-unbiased", "all"),
                                 ("seed", "cka-rbf", "mean")):
        ends = unmatched(a, b) if spec == "none" else match_endpoints(a, b, spec, data=split)
        med, low, d = timed(lambda e=ends, m=metric, t=tokens: similarity_on(
            e, split, m, t, device=args.device), args.repeat)
        change = f"{d['max_change']:.1e}" if "max_change" in d else "-"
        rows.append((f"default pair, {spec}", metric, tokens, d["n"],
                     f"{len(d['layers_anchor'])} x {len(d['layers_source'])}", med, low, change))
        print(rows[-1], flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        cli = [sys.executable, "-m", "rotviz", "similarity", a.ref, b.ref, "--data", "digits",
               "--match", "seed", "--json", str(Path(tmp) / "s.json"), "--overwrite"]
        med, low, _ = timed(lambda: subprocess.run(cli, cwd=ROOT, check=True,
                                                   capture_output=True), args.repeat)
        rows.append(("`rotviz similarity` end to end (fresh process: imports, loading, "
                     "matching seed)", "cka", "mean", split.n, "5 x 5", med, low, "-"))
        print(rows[-1], flush=True)
        refs = [save_random("roberta", Path(tmp) / f"r{s}", seed=s, **ROBERTA_BASE)
                for s in (0, 1)]
        ra, rb = (load_model(r) for r in refs)
        rsplit = roberta_split(ra)
        for spec in ("none", "seed"):
            ends = unmatched(ra, rb) if spec == "none" else \
                match_endpoints(ra, rb, spec, device=args.device, data=rsplit)
            med, low, d = timed(lambda e=ends: similarity_on(e, rsplit, "cka", "mean",
                                                             device=args.device), 1)
            change = f"{d['max_change']:.1e}" if "max_change" in d else "-"
            rows.append((f"roberta-base shape (random), {spec}", "cka", "mean", d["n"],
                         f"{len(d['layers_anchor'])} x {len(d['layers_source'])}", med, low,
                         change))
            print(rows[-1], flush=True)
        with streamed_endpoints(open_streamed(refs[0]), open_streamed(refs[1]), None,
                                args.device) as ends:
            med, low, d = timed(lambda e=ends: sized_similarity(e, rsplit, "cka", "mean",
                                                                device=args.device), 1)
        rows.append(("roberta-base shape (random), none, at size (block by block)", "cka",
                     "mean", d["n"], f"{len(d['layers_anchor'])} x {len(d['layers_source'])}",
                     med, low, "-"))
        print(rows[-1], flush=True)
    load = max(load, os.getloadavg()[0])
    lines = [
        f"Machine: {machine(args.device)}; device {args.device}; load average up to {load:.1f} "
        "while measured (the VM is shared, so higher loads mean pessimistic numbers).",
        "",
        "Target: the default pair, all layer pairs, the test split, <= 5 s on this CPU. Each "
        f"row: median (and minimum) of {args.repeat} runs of `similarity_on` on endpoints "
        "matched beforehand (hidden states of A, B and, matched, B'; then every layer pair).",
        "",
        "| pair, matching | metric | tokens | rows | layers | median s | min s | "
        "largest change A-B vs A-B' |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {w} | {m} | {t} | {n} | {lay} | {med:.2f} | {lo:.2f} | {c} |"
              for w, m, t, n, lay, med, lo, c in rows]
    lines += [
        "",
        "The roberta-base shape is a random model from `rotviz.random_models` (12 blocks, d 768, "
        "12 heads, FFN 3072, a 61-token vocabulary) on 32 random sequences of 128 tokens, timed "
        "once: its forward passes (one per model and B', 4,096 tokens each) are nearly all of "
        "it; every layer pair's CKA and the ladder take under a second. No "
        "GPU was lent to this session: every row ran on the CPU.",
    ]
    write_section("similarity", "\n".join(lines), args.results)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

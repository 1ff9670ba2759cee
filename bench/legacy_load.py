"""Benchmark: loading a checkpoint in the old format (with `embeddings.position_ids`, as
RoBERTa checkpoints saved by older transformers versions hold it) against the same checkpoint
in today's format.

    python bench/legacy_load.py [--repeat 9] [--results bench/RESULTS.md]

A random model of roberta-base's shape (12 layers, d 768, 12 heads, FFN 3072, vocabulary
50265, 514 positions; RobertaForMaskedLM) is written once to a temporary folder, then copied
with `roberta.embeddings.position_ids` added. `rotviz.models.load_model` (the header checks,
transformers' load, rotviz's checks of what it loaded) runs on the two in turn, `--repeat`
times each, interleaved so that a change in the machine's load falls on both; the checks
alone (`rotviz.models.check_weights`, where rotviz.legacy decides what is read past) are timed
the same way. Writes the section `legacy-load` of bench/RESULTS.md. Target: the old format
costs at most 5% more.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import RESULTS, machine, write_section  # noqa: E402

SHAPE = dict(layers=12, d=768, heads=12, ffn=3072, vocab=50265, positions=512)  # 514 rows


def make(folder: Path) -> tuple[Path, Path]:
    """The model saved today (`clean`) and its copy with the old format's position ids."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from transformers.utils import logging as hf_logging

    from rotviz.random_models import save_random

    hf_logging.disable_progress_bar()
    clean = save_random("roberta", folder / "clean", seed=0, **SHAPE)
    old = folder / "old"
    shutil.copytree(clean, old)
    state = load_file(old / "model.safetensors")
    state["roberta.embeddings.position_ids"] = torch.arange(SHAPE["positions"] + 2)[None]
    save_file(state, old / "model.safetensors", metadata={"format": "pt"})
    return clean, old


def timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args()

    from rotviz.arch import spec_for
    from rotviz.models import check_weights, load_model, read_config

    def checks(path: Path) -> None:
        config = read_config(path)
        check_weights(path, config, spec_for(config))

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        clean, old = make(Path(tmp))
        names = {"today's format": clean, "old format (+ position_ids)": old}
        for path in names.values():  # warm the page cache and the imports
            load_model(path)
        rows: dict[str, dict[str, list[float]]] = {n: {"load": [], "checks": []} for n in names}
        for k in range(args.repeat):
            order = list(names.items()) if k % 2 == 0 else list(names.items())[::-1]
            for name, path in order:
                rows[name]["load"].append(timed(load_model, path))
                rows[name]["checks"].append(timed(checks, path))
            load = max(load, os.getloadavg()[0])
            print(k, {n: round(r["load"][-1], 3) for n, r in rows.items()}, flush=True)
        size = (clean / "model.safetensors").stat().st_size

    def med(name: str, what: str) -> float:
        return statistics.median(rows[name][what])

    base, legacy = list(names)
    lines = [
        f"Machine: {machine('cpu')}; load average up to {load:.1f} while measured "
        "(the VM is shared, so higher loads mean pessimistic numbers).",
        "",
        f"roberta-base's shape (RobertaForMaskedLM, random weights, float32, "
        f"{size / 1e6:.0f} MB of safetensors), loaded {args.repeat} times in each format, "
        "interleaved, in one process after a warm-up load of each (files in the page cache).",
        "Target: the old format costs at most 5% more.",
        "",
        "| format | `load_model` median s | min s | checks alone (`check_weights`) median s |",
        "|---|---|---|---|",
    ]
    for name in names:
        lines.append(f"| {name} | {med(name, 'load'):.3f} | {min(rows[name]['load']):.3f} | "
                     f"{med(name, 'checks'):.4f} |")
    over = 100 * (med(legacy, "load") / med(base, "load") - 1)
    over_min = 100 * (min(rows[legacy]["load"]) / min(rows[base]["load"]) - 1)
    over_checks = 100 * (med(legacy, "checks") / med(base, "checks") - 1)
    lines += [
        "",
        f"Overhead of the old format: {over:+.1f}% (medians), {over_min:+.1f}% (minima); the "
        f"checks alone {over_checks:+.1f}%. The old format's extra work is one 4 KB tensor "
        "more in the file, which transformers' loader and rotviz's checks both pass over "
        "(rotviz.legacy.read_past: a few regular expressions over the names the module "
        "lacks).",
    ]
    write_section("legacy-load", "\n".join(lines), args.results)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Benchmark: streamed matching against in-memory matching at real sizes.

Writes two random models of a real shape as bfloat16 safetensors shards (rotviz.random_models.
save_random_sharded, tensor by tensor), then runs `rotviz match` on them in a fresh process
per run, streamed (`--max-memory 0`) and in memory (where the pair fits this machine), and
records seconds, the process's peak resident memory (the kernel's high-water mark) and, on
a GPU, its peak GPU memory. Targets: streamed within 1.3x of in-memory time at the
same size; streamed peak <= 25% of the pair's bytes + 1.5 GB. `--match weight` runs weight
matching (`--heads --residual`, at most `--rounds` rounds per phase: one pass over the blocks
each, streamed; `--rounds 0`: the library's default stopping rule, rotviz.match.alternating).
Writes the section `stream-<device>-<shape>[-weight]` of bench/RESULTS.md.

    python bench/stream.py [--device cpu|cuda] [--shape llama-1b] [--layers 16,4]
                           [--match seed|weight] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import RESULTS, machine, write_section  # noqa: E402

SHAPES = {
    # LLaMA-3.2-1B: d 2048, 16 layers, 32 heads in 8 KV groups, FFN 8192, vocabulary 128256
    "llama-1b": dict(d=2048, heads=32, kv_heads=8, ffn=8192, vocab=128256, layers=16),
    # TinyLlama-1.1B (the bounded-memory test's shape)
    "tinyllama": dict(d=2048, heads=32, kv_heads=4, ffn=5632, vocab=32000, layers=22),
    # LLaMA-2-7B
    "llama-7b": dict(d=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000, layers=32),
    # a LLaMA layout small enough to check a benchmark end to end in seconds (not a real model)
    "llama-tiny": dict(d=256, heads=4, kv_heads=2, ffn=512, vocab=1024, layers=16),
}

# Peaks are the kernel's high-water mark of each child's own address space (VmHWM), not
# ru_maxrss, which also counts the parent's resident memory at the fork.
RUN = """
import json, resource, sys, time
import torch
from rotviz.cli import main
from rotviz.memory import resident_peak
t = time.perf_counter()
rc = main(sys.argv[2:])
use = resource.getrusage(resource.RUSAGE_SELF)
out = {"rc": rc, "seconds": time.perf_counter() - t, "peak": resident_peak(),
       "cpu": use.ru_utime + use.ru_stime}
if torch.cuda.is_available():
    out["gpu_peak"] = torch.cuda.max_memory_allocated()
open(sys.argv[1], "w").write(json.dumps(out))
"""


def run(args: list[str], log: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", RUN, str(log), *args], env=env,
                         capture_output=True, text=True)
    if res.returncode != 0 or not log.exists():
        return {"rc": res.returncode, "error": (res.stderr.strip().splitlines() or ["?"])[-1]}
    out = json.loads(log.read_text())
    out["said"] = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    return out


BASELINE = """
import torch, transformers  # noqa: F401
import rotviz.cli, rotviz.match.at_size  # noqa: F401
from rotviz.memory import resident_peak
print(resident_peak())
"""


def baseline() -> int:
    """The peak resident memory of a process that only imports what `rotviz match` runs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", BASELINE], env=env, capture_output=True,
                         text=True, check=True)
    return int(res.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--shape", default="llama-1b", choices=list(SHAPES))
    p.add_argument("--layers", default="16,4",
                   help="layer counts to build and match at the shape's width")
    p.add_argument("--in-memory-up-to", type=float, default=None,
                   help="run the in-memory path only when its estimated peak (GB) is at most "
                        "this (default: 90%% of the memory available now)")
    p.add_argument("--match", default="seed", choices=["seed", "weight"])
    p.add_argument("--rounds", type=int, default=1,
                   help="with --match weight: alternation rounds per phase (0: the default "
                        "stopping rule)")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    import torch

    from rotviz.atsize.need import IN_MEMORY_FACTOR
    from rotviz.memory import available_memory
    from rotviz.random_models import save_random_sharded
    from rotviz.sources.checkpoint import Checkpoint

    limit = (args.in_memory_up_to * 1e9 if args.in_memory_up_to is not None
             else 0.9 * (available_memory() or 0))
    # --rounds 0: no cap, the library's default stopping rule
    weight_flags = ["--heads", "--residual"] + (["--rounds", str(args.rounds)] if args.rounds
                                                else [])
    rule = (f"at most {args.rounds} round(s) per phase" if args.rounds
            else "the default stopping rule")
    rows = []
    for layers in [int(x) for x in args.layers.split(",")]:
        sizes = {**SHAPES[args.shape], "layers": layers}
        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
            t = time.perf_counter()
            a = save_random_sharded("llama", Path(tmp) / "a", seed=0, dtype=torch.bfloat16,
                                    shards=4, **sizes)
            s = save_random_sharded("llama", Path(tmp) / "s", seed=1, dtype=torch.bfloat16,
                                    shards=4, **sizes)
            built = time.perf_counter() - t
            pair = Checkpoint(a).nbytes + Checkpoint(s).nbytes
            params = pair / 2  # bf16
            need = IN_MEMORY_FACTOR * 4 * params
            common = ["match", str(a), str(s), "--device", args.device]
            if args.match == "weight":
                common += weight_flags
            results = {}
            results["streamed"] = run([*common, "--out", str(Path(tmp) / "o1"),
                                       "--max-memory", "0"], Path(tmp) / "l1.json")
            if need <= limit:
                results["in memory"] = run([*common, "--out", str(Path(tmp) / "o2"),
                                            "--max-memory", "1000000GB"],
                                           Path(tmp) / "l2.json")
            else:
                results["in memory"] = {"skipped": f"needs about {need / 1e9:.0f} GB"}
            rows.append((layers, sizes, pair, built, results))
            print(layers, json.dumps(results), flush=True)
    bound = lambda pair: 0.25 * pair + 1.5e9  # noqa: E731
    fixed = baseline()
    lines = [
        f"Random LLaMA-layout pairs of shape **{args.shape}** "
        f"({', '.join(f'{k} {v}' for k, v in SHAPES[args.shape].items() if k != 'layers')}), "
        "bfloat16 safetensors in 4+ shards, "
        + ("seed matching (`rotviz match`, default options), " if args.match == "seed" else
           f"weight matching (`rotviz match {' '.join(weight_flags)}`: {rule}, two phases), ")
        + "one fresh process per run. `python bench/stream.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`, device {args.device}. "
        f"Machine: {machine(args.device)}; {os.cpu_count()} cores, "
        f"{(available_memory() or 0) / 1e9:.0f} GB available at the end. A process that "
        f"only imports what `rotviz match` runs (Python, torch, transformers) peaks at "
        f"{fixed / 1e9:.2f} GB: on small pairs that fixed cost is most of the bound.",
        "",
        "| layers | pair (GB, bf16) | path | seconds | peak RSS (GB) | bound 25% + 1.5 GB "
        "| GPU peak (GB) | streamed / in memory | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for layers, _, pair, _, results in rows:
        st, mem = results["streamed"], results["in memory"]
        ratio = (st["seconds"] / mem["seconds"]) if "seconds" in mem and "seconds" in st \
            else None
        for name, r in results.items():
            if "seconds" not in r:
                lines.append(f"| {layers} | {pair / 1e9:.2f} | {name} | "
                             f"{r.get('skipped') or 'failed: ' + r.get('error', '')} | | | | | |")
                continue
            target = ""
            if name == "streamed":
                ok_mem = r["peak"] <= bound(pair)
                target = f"memory {'met' if ok_mem else 'MISSED'}"
                if ratio is not None:
                    target += f"; time {'met' if ratio <= 1.3 else 'MISSED'} (<= 1.3x)"
            gpu = f"{r['gpu_peak'] / 1e9:.2f}" if "gpu_peak" in r else "-"
            lines.append(
                f"| {layers} | {pair / 1e9:.2f} | {name} | {r['seconds']:.1f} | "
                f"{r['peak'] / 1e9:.2f} | {bound(pair) / 1e9:.2f} | {gpu} | "
                f"{f'{ratio:.2f}x' if ratio is not None and name == 'streamed' else ''} | "
                f"{target} |")
    lines.append("")
    lines.append("What each run said: " + "; ".join(
        f"{layers} layers, {name}: `{r.get('said', '')}`" for layers, _, _, _, results in rows
        for name, r in results.items() if r.get("said")))
    name = f"stream-{args.device}-{args.shape}" + ("-weight" if args.match == "weight" else "")
    write_section(name, "\n".join(lines), args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

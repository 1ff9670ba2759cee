"""Benchmark: the seed paper's matching on random models of two real sizes.

Random RoBERTa-family models (rotviz.random_models) of roberta-base size (12 layers, d = 768,
12 heads, FFN 3072) and deberta-v3-large size (24 layers, d = 1024, 16 heads, FFN 4096; the
RoBERTa layout at that size, vocabulary 1000 to save memory). For each size and device it times
`rotviz.match.engine.match` on views already in memory (attention only, attention + rescale, and
the full method), median of --repeats runs, and once the end-to-end `match_models` (views,
matching, state dict, finiteness and function check). Peak memory: CPU from the kernel's
high-water mark (/proc/self/status VmHWM after resetting it through /proc/self/clear_refs, or
by sampling VmRSS where that is not allowed), counted from before the models were built, so it
holds the two models plus everything matching allocates; CUDA from
torch.cuda.max_memory_allocated with the two views on the GPU. Both are compared with the two
models' weight bytes (target <= 3x).

Targets (2-core CPU, roberta-base size): attention-only <= 0.5 s, full <= 10 s.

    python bench/match.py [--device auto|cpu|cuda] [--sizes roberta-base,deberta-v3-large]
        [--repeats 3] [--no-e2e] [--lsa-threads N] [--label NAME] [--results PATH]
        [--import-from OTHER.md]

Each run replaces its own labelled table (default: the device name) inside the `match`
section of bench/RESULTS.md and keeps the other labels, so CPU and GPU tables taken on
different machines sit side by side; --import-from copies the labelled tables of another
RESULTS.md (e.g. one written on a GPU machine) into this one without measuring.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.results import RESULTS, machine, write_section  # noqa: E402
from rotviz.arch import spec_for  # noqa: E402
from rotviz.match.engine import match  # noqa: E402
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import match_models  # noqa: E402
from rotviz.random_models import random_model  # noqa: E402
from rotviz.sources.loading import Loaded  # noqa: E402
from rotviz.symmetry.view import read_view  # noqa: E402

SIZES = {
    "roberta-base": dict(layers=12, d=768, heads=12, ffn=3072, vocab=1000),
    "deberta-v3-large": dict(layers=24, d=1024, heads=16, ffn=4096, vocab=1000),
}
MODES = {
    "attention (rotation)": MatchOptions(ffn=False, attn=True, rescale=False),
    "attention + rescale (--no-ffn)": MatchOptions(ffn=False, attn=True, rescale=True),
    "full (FFN + attention + rescale)": MatchOptions(),
}
# (size, mode) -> seconds, on a 2-core CPU; memory target everywhere
TARGETS = {
    ("roberta-base", "attention (rotation)"): 0.5,
    ("roberta-base", "attention + rescale (--no-ffn)"): 0.5,
    ("roberta-base", "full (FFN + attention + rescale)"): 10.0,
}
MEMORY_TARGET = 3.0
GB = 1024**3


# ---- memory --------------------------------------------------------------------------------


def _status(field: str) -> int:
    """A size from /proc/self/status, in bytes (0 where there is no such file)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_high_water_mark() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status("VmHWM") > 0
    except OSError:
        return False


class PeakMemory:
    """Peak memory of this process (CPU) or of torch's CUDA allocator during a block."""

    def __init__(self, device: str):
        self.device = device
        self.peak = 0

    def __enter__(self) -> PeakMemory:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return self
        self._sampling = not _reset_high_water_mark()
        self.peak = _status("VmRSS")
        if self._sampling:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _status("VmRSS"))

    def __exit__(self, *exc) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        elif self._sampling:
            self._stop.set()
            self._thread.join()
        else:
            self.peak = max(self.peak, _status("VmHWM"))


# ---- models ----------------------------------------------------------------------------------


def build(size: str, seed: int) -> Loaded:
    model, config = random_model("roberta", seed, **SIZES[size])
    return Loaded(f"random:{size}:{seed}", Path("."), config, spec_for(config), model,
                  dict(model.state_dict()))


def weight_bytes(*models: Loaded) -> int:
    seen, total = set(), 0
    for m in models:
        for t in m.state.values():
            if t.is_floating_point() and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@dataclass
class Row:
    size: str
    mode: str
    seconds: list[float]
    e2e: float | None
    peak: int
    weights: int
    before: float
    after: float
    max_output_diff: float | None


def warm_up(device: str) -> None:
    """Load the solvers (LAPACK / cuSOLVER, scipy) once, outside the timings."""
    a, ca = random_model("roberta", 0, layers=1, d=64, heads=4, ffn=128, vocab=50)
    b, cb = random_model("roberta", 1, layers=1, d=64, heads=4, ffn=128, vocab=50)
    spec = spec_for(ca)
    va = read_view(spec, ca, dict(a.state_dict())).to(device=device)
    vb = read_view(spec, cb, dict(b.state_dict())).to(device=device)
    match(va, vb)
    sync(device)


def bench_size(size: str, device: str, repeats: int, e2e: bool, baseline: int) -> list[Row]:
    anchor, source = build(size, 0), build(size, 1)
    weights = weight_bytes(anchor, source)
    va = read_view(anchor.spec, anchor.config, anchor.state).to(device=device)
    vs = read_view(source.spec, source.config, source.state).to(device=device)
    if device == "cuda":
        baseline = 0  # max_memory_allocated counts from zero: the two views are in it
    rows = []
    for mode, options in MODES.items():
        n = repeats if options.ffn is False else max(1, repeats // 3)
        seconds, peak, res = [], 0, None
        for _ in range(n):
            res = None
            gc.collect()
            with PeakMemory(device) as mem:
                sync(device)
                t0 = time.perf_counter()
                res = match(va, vs, options)
                sync(device)
                seconds.append(time.perf_counter() - t0)
            peak = max(peak, mem.peak - baseline)
        report = res.report
        del res
        e2e_s = diff = None
        if e2e:
            gc.collect()
            with PeakMemory(device) as mem:
                t0 = time.perf_counter()
                out = match_models(anchor, source, options, device)
                e2e_s = time.perf_counter() - t0
            diff = out.report.max_output_diff
            del out
            if device == "cpu":
                peak = max(peak, mem.peak - baseline)
        rows.append(Row(size, mode, seconds, e2e_s, peak, weights, report.before.total,
                        report.after.total, diff))
        print(f"  {size:17s} {mode:34s} {statistics.median(seconds):8.3f} s"
              f"  e2e {e2e_s if e2e_s is not None else float('nan'):8.3f} s"
              f"  peak {peak / GB:6.2f} GB = {peak / weights:4.2f}x weights", flush=True)
    return rows


# ---- report --------------------------------------------------------------------------------


def table(rows: list[Row], device: str, note: str) -> str:
    head = ("| size | matching | `match` (s) | runs | end-to-end (s) | peak memory (GB) "
            "| peak / weights | distance before -> after | max output diff | target |")
    lines = [note, "", head, "|" + "---|" * 10]
    for r in rows:
        med = statistics.median(r.seconds)
        target = TARGETS.get((r.size, r.mode)) if device == "cpu" else None
        marks = []
        if target is not None:
            marks.append(f"{'met' if med <= target else 'MISSED'} (<= {target:g} s)")
        ratio = r.peak / r.weights
        marks.append(f"memory {'met' if ratio <= MEMORY_TARGET else 'MISSED'}")
        e2e = f"{r.e2e:.2f}" if r.e2e is not None else "-"
        diff = f"{r.max_output_diff:.1e}" if r.max_output_diff is not None else "-"
        lines.append(
            f"| {r.size} | {r.mode} | {med:.3f} | {len(r.seconds)} | {e2e} | {r.peak / GB:.2f} "
            f"| {ratio:.2f}x | {r.before:.1f} -> {r.after:.1f} | {diff} | {'; '.join(marks)} |"
        )
    return "\n".join(lines)


BLOCK = re.compile(r"<!-- match/([\w.+-]+) -->\n(.*?)\n<!-- /match/\1 -->", re.S)
SECTION = re.compile(r"<!-- match:start -->(.*?)<!-- match:end -->", re.S)
INTRO = (
    "Written by `bench/match.py`: random RoBERTa-layout models, float32, views already in "
    "memory for `match`; end-to-end is `rotviz.match.pipeline.match_models` (views, matching, "
    "state dict, finiteness and function check). Peak memory counts the two models plus everything "
    "matching allocates (CPU: process high-water mark above the level before the models were "
    "built; CUDA: allocator peak with both views on the GPU). The time targets apply to a "
    "2-core CPU."
)


def blocks_of(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    m = SECTION.search(path.read_text())
    return dict(BLOCK.findall(m.group(1))) if m else {}


def write(path: Path, blocks: dict[str, str]) -> None:
    body = INTRO + "\n\n" + "\n\n".join(
        f"<!-- match/{k} -->\n{v}\n<!-- /match/{k} -->" for k, v in sorted(blocks.items()))
    write_section("match", body, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="auto: the CPU, and CUDA too when present")
    p.add_argument("--sizes", default=",".join(SIZES))
    p.add_argument("--repeats", type=int, default=3, help="runs per attention mode (full: 1/3)")
    p.add_argument("--no-e2e", dest="e2e", action="store_false", help="skip match_models")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: the cores this process may use)")
    p.add_argument("--lsa-threads", type=int, default=None,
                   help="override rotviz.match.layers.LSA_THREADS (FFN solver threads; 0 = inline)")
    p.add_argument("--label", default=None, help="table label (default: the device)")
    p.add_argument("--note", default="", help="one line printed above the table")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--import-from", type=Path, default=None,
                   help="copy the labelled tables of another RESULTS.md, measure nothing")
    args = p.parse_args(argv)

    if args.import_from is not None:
        blocks = blocks_of(args.results) | blocks_of(args.import_from)
        write(args.results, blocks)
        print(f"imported {sorted(blocks_of(args.import_from))} into {args.results}")
        return 0
    if args.device == "auto":
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    elif args.device == "cuda" and not torch.cuda.is_available():
        print("bench/match.py: error: --device cuda asked for, but no CUDA GPU is visible",
              file=sys.stderr)
        return 2
    else:
        devices = [args.device]
    if args.lsa_threads is not None:
        import rotviz.match.layers

        rotviz.match.layers.LSA_THREADS = args.lsa_threads
        args.note = f"LSA_THREADS={args.lsa_threads}. {args.note}".strip()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(args.threads or cores or 1)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        print(f"bench/match.py: error: unknown sizes {unknown}; known: {list(SIZES)}",
              file=sys.stderr)
        return 2

    blocks = blocks_of(args.results)
    for device in devices:
        print(f"{device}: {machine(device)}; {cores} usable cores", flush=True)
        warm_up(device)
        gc.collect()
        baseline = _status("VmRSS")
        rows = []
        for size in sizes:
            rows += bench_size(size, device, args.repeats, args.e2e, baseline)
            gc.collect()
        label = args.label or device
        if len(devices) > 1 and args.label:
            label = f"{args.label}-{device}"
        note = (f"**{label}**: {machine(device)}; {cores} usable cores. "
                f"{args.note}".strip())
        blocks[label] = table(rows, device, note)
        write(args.results, blocks)
    print(f"wrote the match section of {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: weight matching against the seed paper's matching, at two real sizes.

Weight matching is `MatchOptions(heads=True, residual=True)`: the seed paper's per-layer maps
(FFN permutation, Q-K and V-O rotations, rescaling) plus a head permutation per layer, and the
residual-stream map, alternated (rotviz.match.alternating) until a round gains less than `tol` of
the starting objective, at most `rounds` rounds (library defaults: 50 and 1e-6). The seed
matching is `MatchOptions()`. Both are timed with `rotviz.match.engine.match` on views already in
memory, on two independently seeded random models (seeds 0 and 1) per size:

- roberta-base: 12 layers, d 768, 12 heads, FFN 3072, vocabulary 1000. Post-norm LayerNorm,
  so its residual map is a coordinate permutation. RoBERTa's MLM head is tied to the word
  embeddings but reads another space, which residual maps refuse; the benchmark gives each
  model an untied output head of its own (seeded), as a fine-tuned head would be.
- llama-1b: the Llama-3.2-1B shape (16 layers, d 2048, 32 heads, 8 KV heads, head size 64,
  SwiGLU FFN 8192, RMSNorm, RoPE; untied head, vocabulary 1000 to save memory). Its residual
  map is any orthogonal map. `--layers llama-1b=N` keeps N layers of that width, where the
  whole depth does not fit the time or memory at hand; per-layer times are in the table.
- More families at the shapes of released checkpoints, all layers, with an output head
  of their own (each family's UNTIED options), vocabulary 1000: pythia-160m (GPT-NeoX, 12
  layers, d 768, 12 heads, FFN 3072, rotary on a quarter of each head; centred stream maps),
  qwen2-0.5b (24 layers, d 896, 14 heads in 2 KV groups, SwiGLU FFN 4864, Q/K/V biases;
  orthogonal stream maps) and deberta-v3-large (DeBERTa-v2, 24 layers, d 1024, 16 heads, FFN
  4096, relative attention; stream permutations). Run them by name with --sizes.

Every weight-matching run reports the rounds it ran and the seconds per round, from the
progress callback's time stamps. Where the default misses the target (weight matching <= 3x
the seed matching's time), the round caps in --caps are measured as well (e.g. 1, 2, 3), each
with the distance it reaches; --plain adds the rounds as they were before joint steps
(`plain_rounds=True`, the same --budget), for the final distance side by side; --backoff adds
the default with `ffn_backoff=True` (rounds
hold the FFN maps once its solve stops moving units; rotviz.match.alternating). Peak memory is the
process high-water mark (as bench/match.py measures it) above the level before the models
were built: the two models plus everything matching allocates, compared with the two models'
weight bytes. On CUDA it is the allocator's peak with the two views on the GPU.

    python bench/weight.py [--device cpu|cuda] [--sizes roberta-base,llama-1b]
        [--layers llama-1b=4] [--caps 1,2,3] [--always-caps] [--skip-default]
        [--backoff] [--plain] [--budget SECONDS] [--time-limit SECONDS]
        [--reference SECONDS] [--repeats N] [--threads N] [--label NAME]
        [--note TEXT] [--results PATH]

Every weight-matching row also records how the alternation ended (`ended`: converged,
stalled, time or rounds; rotviz.match.alternating) and the share of its gain in squared
canonical distance that the first round earned. --time-limit S adds the default with
`time_limit=S` (the alternation stops at the end of the round that crosses S seconds and keeps
its best state). --reference S adds the rule before `stall` (`stall=0, tol=0`, no round cap)
stopped by `time_limit=S` (e.g. 1800: "what 30 minutes of rounds earn"), and every weight row
then says what share of that run's gain in squared canonical distance it earned (the issue's
95% target).

Each run replaces its own blocks (label/size, and the depth where --layers cuts it) of the
`weight` section of bench/RESULTS.md and keeps the others, so sizes measured in separate
processes sit side by side.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.match import PeakMemory, _status, weight_bytes  # noqa: E402
from bench.results import RESULTS, machine, write_section  # noqa: E402
from rotviz.arch import family_module, spec_for  # noqa: E402
from rotviz.match.engine import match  # noqa: E402
from rotviz.match.options import MatchOptions
from rotviz.random_models import random_model  # noqa: E402
from rotviz.sources.loading import Loaded  # noqa: E402
from rotviz.symmetry.view import read_view  # noqa: E402

SIZES = {
    "roberta-base": ("roberta", dict(layers=12, d=768, heads=12, ffn=3072, vocab=1000)),
    "llama-1b": ("llama", dict(layers=16, d=2048, heads=32, kv_heads=8, ffn=8192,
                               vocab=1000)),
    # more families at the shapes of released checkpoints (vocabulary 1000 to save memory)
    "pythia-160m": ("gpt-neox", dict(layers=12, d=768, heads=12, ffn=3072, vocab=1000,
                                     rotary_pct=0.25)),
    "qwen2-0.5b": ("qwen2", dict(layers=24, d=896, heads=14, kv_heads=2, ffn=4864,
                                 vocab=1000)),
    "deberta-v3-large": ("deberta-v2", dict(layers=24, d=1024, heads=16, ffn=4096,
                                            vocab=1000)),
}
DEFAULT_SIZES = ("roberta-base", "llama-1b")
SEED = MatchOptions()
WEIGHT = MatchOptions(heads=True, residual=True)
BACKOFF = replace(WEIGHT, ffn_backoff=True)
PLAIN = replace(WEIGHT, plain_rounds=True)  # the rounds before joint steps (docs/solvers.md)
REFERENCE = "reference: the rule before `stall`, stopped by `time_limit={:g}`"
TARGET = 3.0  # weight matching's time <= TARGET x the seed matching's, same size (issue 49)
MEMORY_TARGET = 3.0  # as in bench/match.py
GB = 1024**3


# ---- models ----------------------------------------------------------------------------------


def build(size: str, seed: int, layers: int | None = None) -> Loaded:
    """A random model of `size` (seeded); `layers` overrides the depth."""
    family, dims = SIZES[size]
    dims = dims | ({"layers": layers} if layers is not None else {})
    # an output head of its own where the family can have one (residual maps need it)
    model, config = random_model(family, seed, **dims, **(family_module(family).UNTIED or {}))
    if family == "roberta":
        # the MLM decoder is tied to the word embeddings but reads the space after the head's
        # LayerNorm: residual maps refuse such a tie, so give it its own weights
        w = model.lm_head.decoder.weight
        gen = torch.Generator().manual_seed(1_000_003 + seed)
        fresh = torch.randn(w.shape, generator=gen) / w.shape[-1] ** 0.5
        model.lm_head.decoder.weight = torch.nn.Parameter(fresh.to(w.dtype))
        model.config.tie_word_embeddings = False
        config = model.config.to_dict()
    return Loaded(f"random:{size}:{seed}", Path("."), config, spec_for(config), model,
                  dict(model.state_dict()))


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def warm_up(device: str) -> None:
    """Load the solvers (LAPACK / cuSOLVER, scipy) once, outside the timings: both families,
    both matchings."""
    for family, extra in (("roberta", {}), ("llama", {"kv_heads": 2})):
        views = []
        for seed in (0, 1):
            m, c = random_model(family, seed, layers=1, d=64, heads=4, ffn=128, vocab=50,
                                **extra)
            if family == "roberta":
                m.lm_head.decoder.weight = torch.nn.Parameter(
                    m.lm_head.decoder.weight.detach().clone() + 1.0)
                m.config.tie_word_embeddings = False
                c = m.config.to_dict()
            views.append(read_view(spec_for(c), c, dict(m.state_dict())).to(device=device))
        for options in (SEED, WEIGHT):
            match(views[0], views[1], options)
    sync(device)


# ---- measuring -------------------------------------------------------------------------------


class Stamps:
    """The progress callback: a time stamp at the start of every step of every round."""

    def __init__(self, device: str):
        self.device = device
        self.marks: list[tuple[float, str]] = []

    def __call__(self, done: int, total: int, message: str) -> None:
        sync(self.device)
        self.marks.append((time.perf_counter(), message))

    def rounds(self) -> list[tuple[float, float]]:
        """Per round: (seconds of the per-layer maps, seconds of the residual map)."""
        starts = [t for t, m in self.marks if m.endswith("per-layer maps")]
        mids = [t for t, m in self.marks if m.endswith("residual map")]
        ends = starts[1:] + [t for t, m in self.marks if m == "done"]
        # a run cut off by --budget ends inside a round: only whole rounds count
        return [(b - a, c - b) for a, b, c in zip(starts, mids, ends, strict=False)]


@dataclass
class Row:
    what: str
    cap: int | None  # the rounds option (None: seed matching)
    seconds: float
    cpu: float  # process CPU seconds (all threads): less sensitive to other jobs' load
    peak: int
    before: float
    after: float
    load: tuple[float, float]  # 1-minute load average at start and end
    rounds: int | None = None
    per_round: list[tuple[float, float]] = field(default_factory=list)
    history: list[float] = field(default_factory=list)  # canonical distance after each step
    stopped: bool = False  # cut off by --budget
    runs: list[float] = field(default_factory=list)  # every repeat's seconds
    held: int = 0  # rounds that held the FFN maps (ffn_backoff)
    ended: str = ""  # how the alternation ended: converged, stalled, time or rounds
    first_share: float | None = None  # the first round's share of the gain (squared, canonical)
    gain: float | None = None  # squared canonical distance gained in all

    @property
    def outside(self) -> float:
        """Seconds outside the alternation rounds (canonical forms, first objective, final
        restore and distances)."""
        return self.seconds - sum(a + b for a, b in self.per_round)


class OverBudget(Exception):
    pass


def best(rows: list[Row]) -> Row:
    """The fastest of several runs of one matching (on a shared machine the fastest is the
    least disturbed), with every run's time, the highest peak and the load over them all."""
    row = min(rows, key=lambda r: r.seconds)
    row.peak = max(r.peak for r in rows)
    row.load = (rows[0].load[0], rows[-1].load[1])
    row.runs = [r.seconds for r in rows]
    return row


def run_once(va, vs, options: MatchOptions, what: str, device: str, baseline: int,
             budget: float | None = None) -> Row:
    gc.collect()
    stamps = Stamps(device)
    t0 = 0.0

    def progress(done: int, total: int, message: str) -> None:
        stamps(done, total, message)
        if budget is not None and message != "done" and time.perf_counter() - t0 > budget:
            raise OverBudget

    load0 = os.getloadavg()[0]
    res, stopped = None, False
    with PeakMemory(device) as mem:
        sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            res = match(va, vs, options, progress)
        except OverBudget:
            stopped = True
        sync(device)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    row = Row(what, options.rounds if options.residual else None, seconds, cpu,
              mem.peak - baseline,
              math.nan, math.nan, (load0, os.getloadavg()[0]), stopped=stopped)
    if res is not None:
        rep = res.report
        row.before, row.after = rep.before.total, rep.after.total
        if rep.residual is not None:
            row.rounds = rep.residual["rounds"]
            row.held = rep.residual.get("ffn_held", 0)
            row.history = [x**0.5 for x in rep.residual["objective"]]
            row.ended = rep.residual.get("ended", "")
            row.first_share = rep.residual.get("first_share")
            row.gain = rep.residual.get("gain")
    if options.residual:
        row.per_round = stamps.rounds()
        if stopped:  # the round it was in when cut off did not finish
            row.rounds = len(row.per_round)
    del res
    return row


def bench_size(size: str, layers: int | None, device: str, caps: list[int], always_caps: bool,
               skip_default: bool, budget: float | None, repeats: int,
               baseline: int, backoff: bool = False, plain: bool = False,
               time_limit: float | None = None,
               reference: float | None = None) -> tuple[list[Row], int, int]:
    anchor, source = build(size, 0, layers), build(size, 1, layers)
    weights = weight_bytes(anchor, source)
    va = read_view(anchor.spec, anchor.config, anchor.state).to(device=device)
    vs = read_view(source.spec, source.config, source.state).to(device=device)
    n_layers = va.dims.n_layers
    if device == "cuda":
        baseline = 0  # the allocator's peak counts from zero: the two views are in it
    # one pass runs every matching once; passes repeat, so that the load of other jobs
    # falls on all of them alike
    configs = [("seed (`MatchOptions()`)", SEED, None)]
    if not skip_default:
        configs.append((f"weight (heads + residual, default: rounds <= {WEIGHT.rounds}, "
                        f"tol {WEIGHT.tol:g}, stall {WEIGHT.stall:g})", WEIGHT, budget))
    if backoff:  # after the default, which decides the caps below
        configs.append(("weight, FFN back-off (`ffn_backoff=True`, default rounds and tol)",
                        BACKOFF, budget))
    if plain:
        configs.append(("weight, plain rounds (`plain_rounds=True`, default rounds and tol)",
                        PLAIN, budget))
    if time_limit is not None:
        configs.append((f"weight, `time_limit={time_limit:g}`",
                        replace(WEIGHT, time_limit=time_limit), None))
    if reference is not None:  # once: it is the yardstick, not a contender
        configs.append((REFERENCE.format(reference), replace(
            WEIGHT, stall=0.0, tol=0.0, rounds=10_000, time_limit=reference), None))
    runs: dict[str, list[Row]] = {}
    for rep in range(repeats):
        for what, options, limit in configs:
            if rep and what.startswith("reference"):
                continue
            row = run_once(va, vs, options, what, device, baseline, limit)
            runs.setdefault(what, []).append(row)
            show(size, row, runs[configs[0][0]][-1].seconds, weights)
        if rep == 0:  # which caps to measure, from the first pass
            seed_s = runs[configs[0][0]][0].seconds
            default = runs[configs[1][0]][0] if not skip_default else None
            if default is None or always_caps or default.seconds > TARGET * seed_s:
                for cap in caps:
                    if default is not None and not default.stopped and cap >= default.rounds:
                        continue  # the default stopped earlier: the same run
                    options = MatchOptions(heads=True, residual=True, rounds=cap)
                    what = f"weight, rounds <= {cap}"
                    configs.append((what, options, None))
                    row = run_once(va, vs, options, what, device, baseline)
                    runs[what] = [row]
                    show(size, row, seed_s, weights)
    rows = [best(runs[what]) for what, _, _ in configs]
    return rows, weights, n_layers


def show(size: str, r: Row, seed_s: float, weights: int) -> None:
    rounds = "" if r.rounds is None else f"  rounds {r.rounds}{' (cut off)' if r.stopped else ''}"
    print(f"  {size:13s} {r.what:60s} {r.seconds:8.2f} s = {r.seconds / seed_s:5.2f}x seed"
          f" (CPU {r.cpu:.1f} s)"
          f"{rounds}{f'  ended {r.ended}' if r.ended else ''}"
          f"{'' if r.first_share is None else f'  first round {100 * r.first_share:.1f}%'}"
          f"  distance {r.before:.2f} -> {r.after:.2f}  peak {r.peak / GB:.2f} GB"
          f" = {r.peak / weights:.2f}x weights  load {r.load[0]:.2f} -> {r.load[1]:.2f}",
          flush=True)


# ---- report ----------------------------------------------------------------------------------


def table(size: str, rows: list[Row], weights: int, n_layers: int, head: str) -> str:
    seed_s = rows[0].seconds
    cols = ("matching", "rounds run", "seconds", "s / layer", "s / round (per-layer + residual)",
            "s outside rounds", "weight / seed", "CPU s (weight / seed)",
            "distance before -> after", "ended", "first round's share of the gain",
            "gain / reference's", "peak memory (GB)", "peak / weights",
            "load (1 min) start -> end", "target")
    ref = next((r for r in rows if r.what.startswith("reference") and r.gain), None)
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        ratio = r.seconds / seed_s
        if r.cap is None:
            rounds = per_round = outside = "-"
            target = ""
        else:
            rounds = f"{r.rounds}" + (f", {r.held} holding the FFN maps" if r.held else "")
            pl = [a for a, _ in r.per_round]
            rs = [b for _, b in r.per_round]
            per_round = (f"{(sum(pl) + sum(rs)) / len(pl):.2f} ({sum(pl) / len(pl):.2f} + "
                         f"{sum(rs) / len(rs):.2f})" if pl else "-")
            outside = f"{r.outside:.2f}"
            target = f"{'met' if ratio <= TARGET else 'MISSED'} (<= {TARGET:g}x seed)"
            if r.stopped:  # it would have run longer: its time is a lower bound
                rounds = (f"{r.rounds} whole, of at most {r.cap} per phase (cut off by "
                          "--budget, not converged)")
                outside = "-"
                target = (f"MISSED (> {TARGET:g}x seed even cut off)" if ratio > TARGET
                          else "unknown (cut off)")
        mem = f"memory {'met' if r.peak / weights <= MEMORY_TARGET else 'MISSED'}"
        dist = "not finished" if r.stopped else f"{r.before:.2f} -> {r.after:.2f}"
        secs = f"{'> ' if r.stopped else ''}{r.seconds:.2f}"
        if len(r.runs) > 1:
            secs += f" (fastest of {', '.join(f'{x:.1f}' for x in r.runs)})"
        share = "-" if r.first_share is None else f"{100 * r.first_share:.1f}%"
        versus = ("-" if ref is None or r.gain is None or r.cap is None
                  else f"{100 * r.gain / ref.gain:.1f}%")
        lines.append(
            f"| {r.what} | {rounds} | {secs} | {r.seconds / n_layers:.2f} "
            f"| {per_round} | {outside} | {'> ' if r.stopped else ''}{ratio:.2f}x "
            f"| {r.cpu:.1f} ({r.cpu / rows[0].cpu:.2f}x) "
            f"| {dist} | {r.ended or '-'} | {share} | {versus} | {r.peak / GB:.2f} | "
            f"{r.peak / weights:.2f}x | {r.load[0]:.2f} -> {r.load[1]:.2f} "
            f"| {'; '.join(x for x in (target, mem) if x)} |"
        )
    longest = max((r for r in rows if r.history), key=lambda r: len(r.history), default=None)
    if longest is not None:
        by_round = longest.history[2::2]  # after each round's residual step
        lines += ["", f"Run `{longest.what}`, canonical distance after each round (start "
                  f"{longest.history[0]:.2f}): "
                  + ", ".join(f"{x:.2f}" for x in by_round)
                  + ". The canonical forms have the norm gains folded into their readers "
                  "(rotviz.symmetry.residual), so these differ from the distances above, which are "
                  "taken in the anchor's own gauge, except on post-norm models."]
    return "\n".join(lines)


BLOCK = re.compile(r"<!-- weight/([\w.+-]+) -->\n(.*?)\n<!-- /weight/\1 -->", re.S)
SECTION = re.compile(r"<!-- weight:start -->(.*?)<!-- weight:end -->", re.S)
INTRO = (
    "Written by `bench/weight.py`: weight matching (`MatchOptions(heads=True, residual=True)`: "
    "the seed paper's per-layer maps, head permutation and the residual-stream map, "
    "alternated until a round gains less than tol = 1e-6 of the start or less than stall = "
    "0.1% of the total gain so far, at most 50 rounds; `ended` says which) "
    "against the seed paper's matching (`MatchOptions()`), timed with `rotviz.match.engine.match` "
    "on views already in memory; random float32 models, seeds 0 (anchor) and 1 (source). "
    "With --repeats N every matching runs N times, interleaved (seed, weight, caps, then "
    "again), and the table has the fastest run of each, all runs listed. "
    "Target: weight matching <= 3x the seed matching's time at the same size; where the "
    "default misses it, round caps are measured too. s / round splits each alternation round "
    "into the per-layer maps and the residual step (map, its application and the objective). "
    "Peak memory: process high-water mark above the level before the models were built "
    "(the two models plus everything matching allocates), against the two models' weight "
    "bytes. The machine is shared: the load column is the 1-minute load average when each "
    "run started and ended; loads above the core count mean pessimistic wall times. The CPU "
    "column (process CPU seconds, all threads) is less sensitive to other jobs, so its ratio "
    "is the steadier comparison; the target is judged on wall time."
)


def blocks_of(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    m = SECTION.search(path.read_text())
    return dict(BLOCK.findall(m.group(1))) if m else {}


def write(path: Path, blocks: dict[str, str]) -> None:
    body = INTRO + "\n\n" + "\n\n".join(
        f"<!-- weight/{k} -->\n{v}\n<!-- /weight/{k} -->" for k, v in sorted(blocks.items()))
    write_section("weight", body, path)


def parse_layers(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        size, _, n = item.partition("=")
        if size not in SIZES or not n.isdigit() or int(n) < 1:
            raise SystemExit(f"bench/weight.py: error: --layers wants SIZE=N with SIZE in "
                             f"{list(SIZES)}, got {item!r}")
        out[size] = int(n)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                   help=f"comma-separated, of {', '.join(SIZES)}")
    p.add_argument("--layers", action="append", default=[], metavar="SIZE=N",
                   help="keep N layers of SIZE's width (repeatable)")
    p.add_argument("--caps", default="1,2,3",
                   help="round caps measured where the default misses the target")
    p.add_argument("--always-caps", action="store_true", help="measure the caps regardless")
    p.add_argument("--skip-default", action="store_true",
                   help="measure the seed matching and the caps only (the default in a run "
                        "of its own, e.g. with another --label)")
    p.add_argument("--backoff", action="store_true",
                   help="also time the default with ffn_backoff=True")
    p.add_argument("--plain", action="store_true",
                   help="also time the plain rounds (plain_rounds=True), under --budget too")
    p.add_argument("--budget", type=float, default=None,
                   help="cut the default weight matching off after this many seconds (at a "
                        "step boundary; the table says so)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="also time the default with time_limit=SECONDS (the library's own "
                        "stop: the best state of the round that crosses it)")
    p.add_argument("--reference", type=float, default=None,
                   help="also run the rule before stall (tol 0, no cap) for SECONDS, once: the "
                        "yardstick of each weight row's gain (e.g. 1800)")
    p.add_argument("--repeats", type=int, default=1,
                   help="passes over all the matchings; the table has each one's fastest run")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: the cores this process may use)")
    p.add_argument("--label", default=None, help="table label (default: the device)")
    p.add_argument("--note", default="", help="one line printed above each table")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/weight.py: error: --device cuda asked for, but no CUDA GPU is visible",
              file=sys.stderr)
        return 2
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        print(f"bench/weight.py: error: unknown sizes {unknown}; known: {list(SIZES)}",
              file=sys.stderr)
        return 2
    layers = parse_layers(args.layers)
    caps = sorted({int(c) for c in args.caps.split(",") if c.strip()})
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(args.threads or cores or 1)
    label = args.label or args.device
    command = "python bench/weight.py " + " ".join(argv if argv is not None else sys.argv[1:])

    print(f"{args.device}: {machine(args.device)}; {cores} usable cores", flush=True)
    warm_up(args.device)
    for size in sizes:
        gc.collect()
        baseline = _status("VmRSS")
        load0 = os.getloadavg()
        rows, weights, n_layers = bench_size(size, layers.get(size), args.device, caps,
                                             args.always_caps, args.skip_default,
                                             args.budget, args.repeats, baseline,
                                             args.backoff, args.plain, args.time_limit,
                                             args.reference)
        load1 = os.getloadavg()
        family, dims = SIZES[size]
        shape = dict(dims, layers=n_layers)
        depth = ("" if n_layers == dims["layers"] else
                 f" **{n_layers} of its {dims['layers']} layers** (same width)")
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        head = (
            f"**{size}** ({family}, {', '.join(f'{k} {v}' for k, v in shape.items())}){depth}; "
            f"two models {weights / GB:.2f} GB of weights. `{command}`, device {args.device}, "
            f"{stamp}. Machine: {machine(args.device)}; {cores} usable cores; load average "
            f"(1, 5, 15 min) {', '.join(f'{x:.2f}' for x in load0)} at the start, "
            f"{', '.join(f'{x:.2f}' for x in load1)} at the end. {args.note}"
        ).strip()
        blocks = blocks_of(args.results)
        key = f"{label}-{size}" + ("" if n_layers == dims["layers"] else f"-{n_layers}l")
        blocks[key] = table(size, rows, weights, n_layers, head)
        write(args.results, blocks)
        del rows
        gc.collect()
    print(f"wrote the weight section of {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

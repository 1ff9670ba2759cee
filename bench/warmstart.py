"""Benchmark: where weight matching's alternation starts, counted in rounds.

The alternation (rotviz.match.alternating) starts cold: the source's canonical form as it is,
the first round solving the per-layer maps and then the residual map. Two warm starts are
measured against it at a released checkpoint's shape (bench/weight.py builds the random
models, seeds 0 and 1), side by side in one process:

- `seed`: the seed paper's matching (`MatchOptions()`, per-layer maps on the views) first,
  then the alternation from its matched source;
- `act`: activation matching (rotviz.match.datamatch.match_activations: the residual map from
  the streams' cross-covariance, FFN permutations from hidden correlations, attention maps
  from the weights) on seeded random tokens, then the alternation from its matched source.

Rounds and the distance reached are the measure (the machine is shared: seconds are given
beside them, noisy). For each start: the rounds the alternation ran, the canonical squared
distance at its start and end, and the rounds it took to come within 0.5% (squared distance)
of the cold start's end.

    python bench/warmstart.py [--size pythia-160m] [--layers N] [--starts cold,seed,act]
        [--tiny FAMILY] [--tokens 64] [--examples 64] [--threads N] [--time-limit S]
        [--from-logs LOG ...] [--note TEXT] [--results PATH]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import rotviz.match.alternating as alt  # noqa: E402
from bench.results import RESULTS, machine, write_section  # noqa: E402
from bench.weight import SIZES, build  # noqa: E402
from rotviz.arch import family_module, spec_for  # noqa: E402
from rotviz.data.split import Split  # noqa: E402
from rotviz.match.alternating import check_residual  # noqa: E402
from rotviz.match.datamatch import match_activations  # noqa: E402
from rotviz.match.engine import match  # noqa: E402
from rotviz.match.options import MatchOptions  # noqa: E402
from rotviz.random_models import random_model  # noqa: E402
from rotviz.sources.loading import Loaded  # noqa: E402
from rotviz.symmetry import residual as rs  # noqa: E402
from rotviz.symmetry.view import read_view  # noqa: E402

WEIGHT = MatchOptions(heads=True, residual=True)
SEED = MatchOptions()
ACT = MatchOptions(act=True, residual=True)
WITHIN = 0.005  # "the same distance": within 0.5% of the cold start's end (squared)


@dataclass
class Row:
    start: str
    prep_s: float  # the warm start's own seconds (0 cold)
    alt_s: float  # the alternation's seconds
    rounds: int
    ended: str
    begin: float  # squared canonical distance before the alternation's first round
    end: float  # ... after its last
    per_round: list[float]  # squared canonical distance after each round
    after: float  # distance to the anchor in its own gauge, after

    def rounds_to(self, target: float, within: float = WITHIN) -> int | None:
        """Rounds until the squared distance comes within `within` of `target` (0: at the
        start already; None: never)."""
        if self.begin <= target * (1 + within):
            return 0
        for k, x in enumerate(self.per_round, start=1):
            if x <= target * (1 + within):
                return k
        return None


def random_tokens(vocab: int, n: int, length: int, seed: int = 0) -> Split:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (n, length), generator=gen)
    return Split("random-tokens", "train", "text", x, torch.roll(x, -1, 1), vocab, "")


def run(start: str, anchor, va, vs, split: Split, weight: MatchOptions = WEIGHT) -> Row:
    t0 = time.perf_counter()
    src = vs
    if start == "seed":
        src = match(va, vs, SEED).view
    elif start == "act":
        group = check_residual(vs, ACT)
        anc_c, gauge = rs.canonicalise(va)
        src_c, _ = rs.canonicalise(vs)
        moved, _, _, _ = match_activations(anchor, anc_c, src_c, ACT, group, split,
                                           torch.device("cpu"))
        src = rs.restore(moved, gauge)
    t1 = time.perf_counter()
    def said(done: int, total: int, message: str) -> None:
        if message.endswith("per-layer maps"):
            print(f"  {start} {time.perf_counter() - t0:7.1f} s {message}", flush=True)

    keep = alt._Best.keep

    def kept(best, run) -> None:  # after every round: its squared canonical distance
        print(f"  {start} {time.perf_counter() - t0:7.1f} s objective {run.history[-1]:.4f}",
              flush=True)
        keep(best, run)

    alt._Best.keep = kept
    try:
        res = match(va, src, weight, said)
    finally:
        alt._Best.keep = keep
    t2 = time.perf_counter()
    info = res.report.residual
    per_round = [x["objective"] for x in info["history"]]
    return Row(start, t1 - t0, t2 - t1, info["rounds"], info["ended"],
               info["objective"][0], per_round[-1] if per_round else info["objective"][0],
               per_round, res.report.after.total)


def table(rows: list[Row], head: str) -> str:
    cold = next((r for r in rows if r.start == "cold"), rows[0])
    cols = ("start", "rounds run", "ended", "squared canonical distance: start -> end",
            "end / cold end", "rounds to cold's end",
            f"rounds to within {100 * WITHIN:g}% of it",
            "distance to the anchor after", "seconds: start + alternation")
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        k, near = r.rounds_to(cold.end, 0.0), r.rounds_to(cold.end)
        lines.append(f"| {r.start} | {r.rounds} | {r.ended} | {r.begin:.2f} -> {r.end:.2f} | "
                     f"{r.end / cold.end:.5f} | {'never' if k is None else k} | "
                     f"{'never' if near is None else near} | "
                     f"{r.after:.4f} | {r.prep_s:.1f} + {r.alt_s:.1f} |")
    return "\n".join(lines)


LINE = re.compile(r"^(\w+)\s+rounds\s+(\d+) ended (\w+)\s+([\d.]+) -> ([\d.]+)\s+after "
                  r"([\d.]+)\s+([\d.]+) \+ ([\d.]+) s\s+per round \[(.*)\]$")


def rows_of(log: str) -> list[Row]:
    """The rows a run printed (one start a process, side by side: their logs joined)."""
    out = []
    for line in log.splitlines():
        m = LINE.match(line.strip())
        if m:
            s, n, ended, begin, end, after, prep, alt_s, per = m.groups()
            out.append(Row(s, float(prep), float(alt_s), int(n), ended, float(begin),
                           float(end), [float(x) for x in per.split(",")], float(after)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="pythia-160m", choices=list(SIZES))
    p.add_argument("--tiny", default=None, metavar="FAMILY",
                   help="the tests' tiny pair of FAMILY (2 layers, d 32) in place of --size")
    p.add_argument("--layers", type=int, default=None, help="keep N layers (same width)")
    p.add_argument("--starts", default="cold,seed,act")
    p.add_argument("--tokens", type=int, default=64, help="tokens per example (act)")
    p.add_argument("--examples", type=int, default=64, help="examples (act)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--time-limit", type=float, default=None,
                   help="each alternation stops at the end of the round that crosses this "
                        "many seconds (the library's own stop; on a loaded machine the rounds "
                        "compared are then the ones every start reached)")
    p.add_argument("--note", default="")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--from-logs", nargs="+", default=None, metavar="LOG",
                   help="write the table from the printed output of earlier runs (one start "
                        "per process, run side by side: --starts cold, --starts seed, ...)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    family, dims = SIZES[args.size]
    if args.tiny:
        family, dims = args.tiny, TINY
    rows = []
    if args.from_logs:
        rows = rows_of("".join(Path(f).read_text() for f in args.from_logs))
        n = args.layers or dims["layers"]
    else:
        n = _measure(args, rows)
    depth = "" if n == dims["layers"] else f", **{n} of its {dims['layers']} layers**"
    name = f"tiny {family}" if args.tiny else args.size
    head = (f"**{name}** ({family}, d {dims['d']}, FFN {dims['ffn']}{depth}), weight "
            f"matching `MatchOptions(heads=True, residual=True)`; act start on "
            f"{16 if args.tiny else args.examples} x {16 if args.tiny else args.tokens} "
            f"seeded random tokens. `python bench/warmstart.py "
            f"{' '.join(_without_note(argv if argv is not None else sys.argv[1:]))}`, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Machine: "
            f"{machine('cpu')}, shared with other jobs (seconds are noisy; rounds and "
            f"distances are not). {args.note}").strip()
    blocks = blocks_of(args.results)
    blocks[f"tiny-{family}" if args.tiny else f"{args.size}-{n}l"] = table(rows, head)
    write_section("warmstart", INTRO + "\n\n" + "\n\n".join(
        f"<!-- warmstart/{k} -->\n{v}\n<!-- /warmstart/{k} -->"
        for k, v in sorted(blocks.items())), args.results)
    print(f"wrote the warmstart section of {args.results}")
    return 0


INTRO = ("Written by `bench/warmstart.py`: where weight matching's alternation starts. `cold` "
         "(the default): the source as it is; `seed`: the seed paper's matching first; "
         "`act`: activation matching first (on data). Rounds are the alternation's, the "
         "distances squared canonical ones; `rounds to cold's end`: the first round at or "
         "below the cold start's final distance. One process per start, run side by side on "
         "a shared machine: seconds are noisy, rounds and distances are not.")
BLOCK = re.compile(r"<!-- warmstart/([\w.+-]+) -->\n(.*?)\n<!-- /warmstart/\1 -->", re.S)
SECTION = re.compile(r"<!-- warmstart:start -->(.*?)<!-- warmstart:end -->", re.S)


def blocks_of(path: Path) -> dict[str, str]:
    """The tables already written (one per shape and depth), kept beside a new one."""
    if not path.exists():
        return {}
    m = SECTION.search(path.read_text())
    return dict(BLOCK.findall(m.group(1))) if m else {}


def _without_note(argv: list[str]) -> list[str]:
    """The command line as run, less --note's text (printed after it on its own)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--note":
            skip = True
        elif not a.startswith("--note="):
            out.append(a)
    return out


TINY = dict(layers=2, d=32, heads=4, ffn=64)  # the tests' tiny models (tests/conftest.py)


def tiny(family: str, seed: int) -> Loaded:
    """The tests' tiny random model of `family` (seeded), with an output head of its own."""
    model, config = random_model(family, seed, **TINY, **(family_module(family).UNTIED or {}))
    return Loaded(f"random:{family}:{seed}", Path("."), config, spec_for(config), model,
                  dict(model.state_dict()))


def _measure(args: argparse.Namespace, rows: list[Row]) -> int:
    """Run each start in turn into `rows`; the depth measured."""
    if args.tiny:
        anchor, source = tiny(args.tiny, 0), tiny(args.tiny, 1)
    else:
        anchor, source = build(args.size, 0, args.layers), build(args.size, 1, args.layers)
    va = read_view(anchor.spec, anchor.config, anchor.state)
    vs = read_view(source.spec, source.config, source.state)
    examples, tokens = (16, 16) if args.tiny else (args.examples, args.tokens)
    split = random_tokens(int(anchor.config["vocab_size"]), examples, tokens)
    for start in args.starts.split(","):
        row = run(start, anchor, va, vs, split,
                  replace(WEIGHT, time_limit=args.time_limit))
        rows.append(row)
        print(f"{start:5s} rounds {row.rounds:3d} ended {row.ended:9s} "
              f"{row.begin:.3f} -> {row.end:.3f}  after {row.after:.4f}  "
              f"{row.prep_s:.1f} + {row.alt_s:.1f} s  per round "
              f"{[round(x, 3) for x in row.per_round]}", flush=True)
    return va.dims.n_layers


if __name__ == "__main__":
    sys.exit(main())

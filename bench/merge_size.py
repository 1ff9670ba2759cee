"""Benchmark: every elementwise merge method at size, rotviz streamed against mergekit's own
executor, same files, side by side (issue 48).

Writes three random LLaMA-layout models of a real shape as bfloat16 safetensors shards ONCE (a
base and two models about it; rotviz.random_models.save_random_sharded), then, for each method
of `--methods`, merges the two (about the base where the method needs one) twice, each in a
fresh process: `rotviz merge --max-memory 0 --evaluate no` (block by block, the merged model
only written: the work mergekit does; `--evaluate yes` also evaluates it and the two models on
a short text, as `rotviz merge` does by default) and mergekit 0.1.5's `run_merge` on the YAML
that rotviz's `--mergekit-config` writer makes for the same merge. Records seconds, CPU
seconds (user and system: what the other work on a shared machine inflates less), each
process's peak resident memory (the kernel's high-water mark) and rotviz's own merge seconds
(its line says them).
Targets: rotviz's peak <= 25% of the pair's bytes + 1.5 GB; time within 1.5x of mergekit's.
`--methods all` is every registered method that runs at size and has a mergekit equivalent
(read from rotviz.merging.registry, so a new method joins without a list to update). Writes
the section `merge-size-methods-<shape>` of bench/RESULTS.md after each method, so an
interrupted run keeps its finished rows. (`merge-size-<shape>` is the TIES run of an older
version of this script, kept as written.)

    python bench/merge_size.py [--shape llama-1b] [--layers 4] [--density 0.5]
                               [--methods all | ties,sce,...] [--skip-mergekit]
                               [--evaluate no | yes]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import RESULTS, machine, write_section  # noqa: E402
from bench.stream import SHAPES, baseline  # noqa: E402

# The fraction of a task vector kept: mergekit's default (1.0) prunes nothing, in both tools,
# so a method with it would be timed without its selection; the bench's --density sets it.
DENSITY = ("density", "select_topk")

# Each method's benchmark parameters besides DENSITY: mergekit 0.1.5's defaults, written out
# so both tools are told the same (nearswap's `t` has no mergekit default: rotviz's earlier
# bench value). A method of `all` missing here runs with each tool's own defaults.
METHODS: dict[str, dict[str, Any]] = {
    "simple": {}, "task_arithmetic": {"scale": 1.0}, "ties": {"scale": 1.0},
    "dare_linear": {"scale": 1.0}, "dare_ties": {"scale": 1.0},
    "breadcrumbs": {"gamma": 0.01, "scale": 1.0},
    "breadcrumbs_ties": {"gamma": 0.01, "scale": 1.0},
    "della": {"epsilon": 0.15, "scale": 1.0}, "della_linear": {"epsilon": 0.15, "scale": 1.0},
    "slerp": {}, "nuslerp": {"nuslerp_flatten": "yes", "nuslerp_row_wise": "no"},
    "multislerp": {}, "karcher": {"karcher_max_iter": 10, "karcher_tol": 1e-5},
    "model_stock": {}, "sce": {}, "ram": {"ram_epsilon": 1e-5},
    "ramplus_tl": {"ramplus_r": 0.1, "ramplus_alpha": 0.2, "ram_epsilon": 1e-5},
    "nearswap": {"nearswap_t": 1e-3}, "arcee_fusion": {},
}

# Each child's seconds and CPU seconds run from its timer's start, after its imports: rotviz's
# CLI, the modules its merge command imports when it runs (the runner, the at-size merge and
# the family's transformers modeling module, which builds the meta module), and mergekit's
# whole import (peft and transformers' models, about 9 CPU s): the CPU seconds once counted
# rotviz's lazy imports and not mergekit's. Peaks are the kernel's high-water mark of each
# child's own address space (VmHWM), imports included, as in bench/stream.py.
RUN = """
import json, resource, sys, time
import torch
import rotviz.atsize.endpoints, rotviz.atsize.merge, rotviz.measures.merge, rotviz.runner
import transformers.models.llama.modeling_llama
from rotviz.cli import main
from rotviz.memory import resident_peak
def cpu():
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime
t, c = time.perf_counter(), cpu()
rc = main(sys.argv[2:])
open(sys.argv[1], "w").write(json.dumps({"rc": rc, "seconds": time.perf_counter() - t,
                                         "peak": resident_peak(), "cpu": cpu() - c}))
"""

MERGEKIT = """
import json, resource, sys, time
import yaml
from mergekit.config import MergeConfiguration
from mergekit.merge import run_merge
from mergekit.options import MergeOptions
from rotviz.memory import resident_peak
def cpu():
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime
cfg = MergeConfiguration.model_validate(yaml.safe_load(open(sys.argv[2]).read()))
t, c = time.perf_counter(), cpu()
run_merge(cfg, sys.argv[3], MergeOptions(cuda=False, copy_tokenizer=False, lazy_unpickle=True,
                                         random_seed=0, quiet=True))
open(sys.argv[1], "w").write(json.dumps({"rc": 0, "seconds": time.perf_counter() - t,
                                         "peak": resident_peak(), "cpu": cpu() - c}))
"""

# stderr lines that are not the error: warnings (Python's, transformers' deprecations), the
# indented source or traceback lines under them, progress bars
_NOISE = re.compile(r"warn|deprecat|^\s|\d+%\|", re.I)


def error_line(stderr: str, rc: int) -> str:
    """The failure in one line: the last line of stderr that is not a warning (a deprecation
    printed last says nothing of why the run stopped), with a killing signal named."""
    lines = [x for x in stderr.splitlines() if x.strip()]
    real = [x for x in lines if not _NOISE.search(x)]
    said = (real or ["(no error line on stderr)"])[-1].strip().replace("|", "/")
    return f"killed by signal {-rc}: {said}" if rc < 0 else said


def _child(code: str, log: Path, args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code, str(log), *args], env=env,
                         capture_output=True, text=True)
    if res.returncode != 0 or not log.exists():
        return {"error": error_line(res.stderr, res.returncode)}
    out = json.loads(log.read_text())
    if out.get("rc"):  # rotviz's own refusal: its one line on stderr
        return {"error": error_line(res.stderr, out["rc"])}
    lines = res.stdout.strip().splitlines()
    out["said"] = next((x for x in reversed(lines) if x.startswith("merged")),
                       lines[-1] if lines else "")
    return out


def at_size_methods() -> tuple[str, ...]:
    """Every registered merge method that runs at size (its record's `rows`, no statistics)
    and has a mergekit equivalent (its record's `mergekit`), in the registry's order."""
    from rotviz.merging import methods

    return tuple(m.name for m in methods() if m.at_size and m.mergekit is not None)


def chosen(spec: str) -> list[str]:
    """The methods `--methods` names: `all`, or a comma list of at-size methods that mergekit
    also has (an unknown one refused in one line)."""
    known = at_size_methods()
    if spec.strip().lower() == "all":
        return list(known)
    names = [x.strip().lower() for x in spec.split(",") if x.strip()]
    wrong = [x for x in names if x not in known]
    if wrong or not names:
        raise SystemExit(f"error: --methods takes all or some of {', '.join(known)}; "
                         f"got {', '.join(wrong) or 'none'}")
    return names


def values_for(name: str, density: float) -> dict[str, Any]:
    """The parameter values `name` is benchmarked with: METHODS', and --density for the
    fraction kept where the method declares one."""
    from rotviz.merging import method

    declared = {p.name for p in method(name).params}
    return {**{k: density for k in DENSITY if k in declared}, **METHODS.get(name, {})}


@dataclass
class Pair:
    """The models built once for every method: the base, the two merged, the pair's bytes."""

    base: Path
    a: Path
    b: Path
    nbytes: int
    built: float
    text: Path


def build(tmp: Path, sizes: dict[str, int]) -> Pair:
    """Three random LLaMA-layout bf16 models in 4 shards each, and the short evaluation text."""
    import torch

    from rotviz.random_models import save_random_sharded
    from rotviz.sources.checkpoint import Checkpoint

    t0 = time.perf_counter()
    base, a, b = (save_random_sharded("llama", tmp / n, seed=s, dtype=torch.bfloat16,
                                      shards=4, **sizes)
                  for n, s in (("base", 0), ("a", 1), ("b", 2)))
    built = time.perf_counter() - t0
    text = tmp / "text.txt"
    text.write_text((ROOT / "rotviz" / "merging" / "ties.py").read_text()[:4000])
    return Pair(base, a, b, Checkpoint(a).nbytes + Checkpoint(b).nbytes, built, text)


@dataclass
class Row:
    """One method's runs: its parameters, each tool's record ({} when skipped), the loads."""

    name: str
    values: dict[str, Any]
    based: bool
    rotviz: dict = field(default_factory=dict)
    mergekit: dict = field(default_factory=dict)
    load: list[float] = field(default_factory=list)


def run_method(name: str, pair: Pair, tmp: Path, density: float, skip_mergekit: bool,
               evaluate: str = "no") -> Row:
    """Merge the pair with `name` in rotviz's process, then in mergekit's (fresh each)."""
    from rotviz.merging import method
    from rotviz.merging.mergekit import mergekit_config

    values = values_for(name, density)
    row = Row(name, values, method(name).needs_base)
    options = [x for k, v in values.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    out = tmp / name
    out.mkdir()
    row.load.append(os.getloadavg()[0])
    row.rotviz = _child(RUN, out / "rotviz.json", [
        "merge", str(pair.a), str(pair.b), "--data", f"text:{pair.text}", "--match", "none",
        "--method", name, *options, *(["--base", str(pair.base)] if row.based else []),
        "--max-memory", "0", "--evaluate", evaluate, "--out", str(out / "merged-rotviz")])
    _remove(out / "merged-rotviz")
    if skip_mergekit:
        return row
    config = out / f"{name}.yaml"
    try:
        config.write_text(mergekit_config(name, values, 0.5, pair.a, pair.b, "bfloat16",
                                          base=pair.base if row.based else None))
    except Exception as e:  # a parameter mergekit cannot say: the row says so
        row.mergekit = {"error": f"no YAML: {e}"}
        return row
    row.load.append(os.getloadavg()[0])
    row.mergekit = _child(MERGEKIT, out / "mergekit.json",
                          [str(config), str(out / "merged-mergekit")])
    _remove(out / "merged-mergekit")
    return row


def _remove(folder: Path) -> None:
    """Drop a merged model once measured: 19 of them at size would fill the disk."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def merge_seconds(said: str) -> float | None:
    """rotviz's own merge seconds, from its line (`...; 68.02 s; wrote ...`)."""
    found = re.search(r"; (\d+(?:\.\d+)?) s;", said)
    return float(found.group(1)) if found else None


def _cells(r: dict) -> list[str]:
    if "seconds" not in r:
        return [f"failed: {r['error']}", "", ""] if "error" in r else ["-", "-", "-"]
    return [f"{r['seconds']:.1f}", f"{r.get('cpu', 0.0):.1f}", f"{r['peak'] / 1e9:.2f}"]


def table_row(row: Row, bound: float) -> str:
    """One method's line of the table: both tools, the ratio and the two targets."""
    rz, mk = row.rotviz, row.mergekit
    what = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in row.values.items()) or "-"
    own = merge_seconds(rz.get("said", ""))
    ratio = memory = timing = "-"
    if "seconds" in rz:
        memory = "met" if rz["peak"] <= bound else "not met"
        if "seconds" in mk:
            r = rz["seconds"] / mk["seconds"]
            ratio = f"{r:.2f} (CPU {rz.get('cpu', 0.0) / max(mk.get('cpu', 0.0), 1e-9):.2f})"
            timing = "met" if r <= 1.5 else "not met"
    rz_s, rz_cpu, rz_peak = _cells(rz)
    cells = [row.name + (" (base)" if row.based else ""), what, rz_s,
             f"{own:.1f}" if own is not None else "-", rz_cpu, rz_peak, *_cells(mk), ratio,
             memory, timing, ", ".join(f"{x:.1f}" for x in row.load)]
    return "| " + " | ".join(cells) + " |"


HEAD = ("| method | parameters | rotviz s | rotviz merge s | rotviz CPU s | rotviz peak GB "
        "| mergekit s | mergekit CPU s | mergekit peak GB | ratio (wall; CPU) | memory | time "
        "| load at each start |\n" + "|---" * 13 + "|")


def section(rows: list[Row], todo: int, pair: Pair, sizes: dict, args, argv: list[str],
            start: float, fixed: int) -> str:
    """The section's markdown: what ran, the machine, the loads, the command, the table."""
    bound = 0.25 * pair.nbytes + 1.5e9
    done = "" if len(rows) == todo else f" **Partial: {len(rows)} of {todo} methods so far.**"
    mergekit = ("mergekit skipped (`--skip-mergekit`): rotviz's peaks only." if
                args.skip_mergekit else
                "mergekit 0.1.5: `run_merge` on the YAML rotviz writes for the same merge "
                "(lazy unpickling, CPU).")
    return "\n".join([
        f"Every elementwise method at size: two random LLaMA-layout models, shape "
        f"**{args.shape}** with {args.layers} layers "
        f"({', '.join(f'{k} {v}' for k, v in sizes.items())}), bfloat16 safetensors in 4 "
        f"shards ({pair.nbytes / 1e9:.2f} GB the pair; a third as the base of the methods "
        f"marked (base)), built once in {pair.built:.0f} s. Weight 0.5; density-like "
        f"parameters (the fraction kept) at --density {args.density:g}, the others at "
        "mergekit's defaults. `python bench/merge_size.py "
        f"{' '.join(argv)}`. Machine: {machine('cpu')}. rotviz: `rotviz merge --max-memory 0 "
        f"--evaluate {args.evaluate}` (streamed, in a fresh process; "
        + ("the merged model only written, as mergekit's is" if args.evaluate == "no" else
           "the merged model also evaluated on a short text with the two models, and "
           "written")
        + "; `rotviz merge s`: the merge's own seconds, as its line says). "
        f"{mergekit} Seconds and CPU seconds from each child's timer, started after its "
        "imports: rotviz's CLI, runner, at-size merge and transformers' LLaMA module; "
        "mergekit's whole import (about 9 CPU s here), its timer around `run_merge` alone. "
        "Bound on the peak: "
        "25% of the pair + 1.5 GB = "
        f"{bound / 1e9:.2f} GB; time target: rotviz's wall seconds within 1.5x mergekit's. "
        f"One-minute load average at the start: {start:.1f}; per method, at the start of "
        "rotviz's run and of mergekit's (on a shared machine the seconds are inflated by "
        f"the load of their time). A process that only imports what `rotviz match` runs "
        f"peaks at {fixed / 1e9:.2f} GB.{done}",
        "", HEAD, *(table_row(r, bound) for r in rows)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="llama-1b", choices=list(SHAPES))
    p.add_argument("--layers", type=int, default=4, help="layers built at the shape's width")
    p.add_argument("--density", type=float, default=0.5,
                   help="fraction kept, for every method that selects (density, select_topk)")
    p.add_argument("--methods", default="all",
                   help=f"all, or a comma list of: {', '.join(at_size_methods())}")
    p.add_argument("--skip-mergekit", action="store_true", help="rotviz's runs only")
    p.add_argument("--evaluate", default="no", choices=("no", "yes"),
                   help="rotviz's --evaluate: no (default) only merges and writes, as "
                        "mergekit does; yes also evaluates the merge and the two models")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    names = chosen(args.methods)
    said = argv if argv is not None else sys.argv[1:]
    # 64 positions: the text is read in sequences of 64 tokens
    sizes = {**SHAPES[args.shape], "layers": args.layers, "positions": 64}
    start = os.getloadavg()[0]
    fixed = baseline()
    rows: list[Row] = []
    name = f"merge-size-methods-{args.shape}"
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        pair = build(Path(tmp), dict(sizes))
        for method in names:
            rows.append(run_method(method, pair, Path(tmp), args.density, args.skip_mergekit,
                                   args.evaluate))
            text = section(rows, len(names), pair, sizes, args, said, start, fixed)
            print(table_row(rows[-1], 0.25 * pair.nbytes + 1.5e9), flush=True)
            write_section(name, text, args.results)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: a merge at size (TIES, or --method), rotviz streamed against mergekit's own
executor, same files.

Writes three random LLaMA-layout models of a real shape as bfloat16 safetensors shards (a base
and two models about it; rotviz.random_models.save_random_sharded), then merges the two about
the base with TIES twice, each in a fresh process: `rotviz merge --max-memory 0` (block by
block, the merged model evaluated on a short text and written) and mergekit 0.1.5's
`run_merge` on the YAML that rotviz's `--mergekit-config` writer makes for the same merge.
Records seconds, CPU seconds (user and system: what the other work on a shared machine
inflates less) and each process's peak resident memory (the kernel's high-water mark).
Targets: rotviz's peak <= 25% of the pair's bytes + 1.5 GB; time within 1.5x of mergekit's.
Writes the section `merge-size-<shape>` of bench/RESULTS.md (TIES), or
`merge-size-<method>-<shape>` (another method, with the parameters of METHODS).

    python bench/merge_size.py [--shape llama-1b] [--layers 4] [--density 0.5] [--method sce]
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
from bench.stream import RUN, SHAPES, baseline  # noqa: E402

# the methods besides TIES and the parameters each is benchmarked with (options, values)
METHODS: dict[str, dict[str, float]] = {
    "sce": {"select_topk": 0.5}, "ram": {"ram_epsilon": 1e-5},
    "nearswap": {"nearswap_t": 1e-3}, "arcee_fusion": {},
    "ramplus_tl": {"ramplus_r": 0.1, "ramplus_alpha": 0.2, "ram_epsilon": 1e-5},
    "breadcrumbs": {"density": 0.5, "gamma": 0.01}, "della": {"density": 0.5, "epsilon": 0.1},
    "karcher": {}, "multislerp": {},
}

MERGEKIT = """
import json, resource, sys, time
import yaml
from mergekit.config import MergeConfiguration
from mergekit.merge import run_merge
from mergekit.options import MergeOptions
from rotviz.memory import resident_peak
cfg = MergeConfiguration.model_validate(yaml.safe_load(open(sys.argv[2]).read()))
t = time.perf_counter()
run_merge(cfg, sys.argv[3], MergeOptions(cuda=False, copy_tokenizer=False, lazy_unpickle=True,
                                         random_seed=0, quiet=True))
use = resource.getrusage(resource.RUSAGE_SELF)
open(sys.argv[1], "w").write(json.dumps({"rc": 0, "seconds": time.perf_counter() - t,
                                         "peak": resident_peak(),
                                         "cpu": use.ru_utime + use.ru_stime}))
"""


def _child(code: str, log: Path, args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code, str(log), *args], env=env,
                         capture_output=True, text=True)
    if res.returncode != 0 or not log.exists():
        return {"error": (res.stderr.strip().splitlines() or ["?"])[-1]}
    out = json.loads(log.read_text())
    out["said"] = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="llama-1b", choices=list(SHAPES))
    p.add_argument("--layers", type=int, default=4, help="layers built at the shape's width")
    p.add_argument("--density", type=float, default=0.5)
    p.add_argument("--method", default="ties", choices=["ties", *METHODS])
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    import torch

    from rotviz.merging import method as method_record
    from rotviz.merging.mergekit import mergekit_config
    from rotviz.random_models import save_random_sharded
    from rotviz.sources.checkpoint import Checkpoint

    # 64 positions: the text is read in sequences of 64 tokens
    sizes = {**SHAPES[args.shape], "layers": args.layers, "positions": 64}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        t = Path(tmp)
        t0 = time.perf_counter()
        base, a, b = (save_random_sharded("llama", t / n, seed=s, dtype=torch.bfloat16,
                                          shards=4, **sizes)
                      for n, s in (("base", 0), ("a", 1), ("b", 2)))
        built = time.perf_counter() - t0
        pair = Checkpoint(a).nbytes + Checkpoint(b).nbytes
        text = t / "text.txt"
        text.write_text((ROOT / "rotviz" / "merging" / "ties.py").read_text()[:4000])
        values = {"density": args.density} if args.method == "ties" else METHODS[args.method]
        based = method_record(args.method).needs_base
        options = [x for k, v in values.items() for x in (f"--{k.replace('_', '-')}", str(v))]
        rz = _child(RUN, t / "rotviz.json", [
            "merge", str(a), str(b), "--data", f"text:{text}", "--match", "none", "--method",
            args.method, *options, *(["--base", str(base)] if based else []),
            "--max-memory", "0", "--out", str(t / "merged-rotviz")])
        config = t / f"{args.method}.yaml"
        config.write_text(mergekit_config(args.method, values, 0.5, a, b, "bfloat16",
                                          base=base if based else None))
        load.append(os.getloadavg()[0])
        mk = _child(MERGEKIT, t / "mergekit.json", [str(config), str(t / "merged-mergekit")])
        load.append(os.getloadavg()[0])
    bound = 0.25 * pair + 1.5e9
    what = (f"TIES (density {args.density})" if args.method == "ties" else
            f"{args.method} ({', '.join(f'{k} {v:g}' for k, v in values.items()) or 'defaults'})")
    about = " about a third" if based else " (the anchor mergekit's base)"
    fixed = baseline()
    lines = [
        f"{what} of two random LLaMA-layout models{about}, shape "
        f"**{args.shape}** with {args.layers} layers "
        f"({', '.join(f'{k} {v}' for k, v in sizes.items())}), bfloat16 safetensors in 4 "
        f"shards ({pair / 1e9:.2f} GB the pair), built in {built:.0f} s. "
        "`python bench/merge_size.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`. Machine: {machine('cpu')}; "
        f"{os.cpu_count()} cores. rotviz: `rotviz merge --max-memory 0` (streamed; the merged "
        "model also evaluated on a short text, and written); mergekit 0.1.5: `run_merge` on the "
        "YAML rotviz writes for the same merge (lazy unpickling, CPU). One-minute load "
        f"average at the start, between the runs and at the end: "
        f"{', '.join(f'{x:.1f}' for x in load)} (other work shared the machine: the seconds "
        f"are inflated, each run's by the load of its time). A process that only imports "
        f"what `rotviz match` runs peaks at {fixed / 1e9:.2f} GB.",
        "",
        "| tool | seconds | CPU seconds | peak RSS (GB) | bound 25% of the pair + 1.5 GB "
        "| target |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in (("rotviz", rz), ("mergekit", mk)):
        if "seconds" not in r:
            lines.append(f"| {name} | failed: {r.get('error', '')} | | | | |")
            continue
        target = ""
        if name == "rotviz":
            target = f"memory {'met' if r['peak'] <= bound else 'not met'}"
            if "seconds" in mk:
                ratio = r["seconds"] / mk["seconds"]
                target += f"; time {ratio:.2f}x mergekit's ({'met' if ratio <= 1.5 else 'not met'})"
        lines.append(f"| {name} | {r['seconds']:.1f} | {r.get('cpu', 0.0):.1f} | "
                     f"{r['peak'] / 1e9:.2f} | {bound / 1e9:.2f} | {target} |")
    if rz.get("said"):
        lines += ["", f"rotviz said: `{rz['said']}`"]
    print("\n".join(lines))
    section = "merge-size" + ("" if args.method == "ties" else f"-{args.method}")
    write_section(f"{section}-{args.shape}", "\n".join(lines), args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

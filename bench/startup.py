"""Benchmark start-up: each command on the default pair end to end, in a fresh process, against
its own work as the command reports it.

    python bench/startup.py [--repeat 3] [--only barrier,match] [--results bench/RESULTS.md]

Writes section `startup` of bench/RESULTS.md. Target (issue 30): every command on the default
pair within 2 s of its own work. Each command runs `--repeat` times as `rotviz.cli.main` in a
fresh interpreter (what `python -m rotviz` runs), which also says which heavy libraries ended
up imported. "work" is the time the command itself reports (the `seconds` its JSON or report
holds: matching and measuring, not loading); "over" is end to end minus work, per run, the
median; "CPU" is the child's user + system seconds (less sensitive to other processes than the
wall clock, which a shared VM inflates). The floor rows are what any such command pays before
rotviz does anything: the interpreter and `import torch`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import RESULTS, machine, write_section  # noqa: E402

A, B = "zoo:vit-digits-s3", "zoo:vit-digits-s6"
# name -> (arguments, the JSON key of the work, the option that writes that JSON)
COMMANDS = {
    "eval": ([A, "--data", "digits"], "seconds", "--json"),
    "barrier": ([A, B, "--data", "digits", "--match", "seed"], "seconds", "--json"),
    "distances": ([A, B, "--match", "seed"], "match_seconds", "--json"),
    "match": ([A, B, "--out", "{tmp}/matched"], "seconds", "--report"),
    "merge": ([A, B, "--data", "digits", "--match", "seed"], "seconds", "--json"),
    "merge --out": ([A, B, "--data", "digits", "--match", "seed", "--out", "{tmp}/merged"],
                    "seconds", "--json"),
    # smaller than the defaults (a 21x21 plane; every rung with learned matching): start-up is
    # what is measured here, and it does not depend on the grid or the steps
    "slice": ([A, "--data", "digits", "--grid", "5"], "seconds", "--json"),
    "ladder": ([A, B, "--data", "digits", "--points", "5", "--steps", "20"], "seconds",
               "--json"),
}
# what barrier imports before its work: torch, then rotviz's own modules
ENGINE = ("import torch, rotviz.cli, rotviz.sources.plain_torch, rotviz.data.split, "
          "rotviz.evaluation, rotviz.match.endpoints, rotviz.measures.barrier, "
          "rotviz.measures.barrier")
HEAVY = ("transformers", "scipy.optimize", "pandas", "plotly", "huggingface_hub", "safetensors")
RUN = (
    "import sys\n"
    "from rotviz.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    f"print('IMPORTED', *[m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def timed(cmd: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds, the child's CPU seconds, and the finished process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr}")
    return wall, cpu, proc


def floor(code: str, repeat: int) -> tuple[float, float]:
    runs = [timed([sys.executable, "-c", code]) for _ in range(repeat)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def command(name: str, repeat: int) -> dict:
    argv, key, flag = COMMANDS[name]
    walls, cpus, works, imported = [], [], [], ""
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            js = Path(tmp) / "out.json"
            args = [name.split()[0], *(a.format(tmp=tmp) for a in argv), flag, str(js)]
            wall, cpu, proc = timed([sys.executable, "-c", RUN, *args])
            walls.append(wall)
            cpus.append(cpu)
            works.append(float(json.loads(js.read_text())[key]))
            imported = next((ln.split()[1:] for ln in proc.stderr.splitlines()
                             if ln.startswith("IMPORTED")), [])
    over = statistics.median(w - k for w, k in zip(walls, works, strict=True))
    return {"name": name, "wall": statistics.median(walls), "min": min(walls),
            "cpu": statistics.median(cpus), "work": statistics.median(works), "over": over,
            "imported": ", ".join(imported) or "-"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", default=None, help="comma list of commands (default: all)")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args()
    names = args.only.split(",") if args.only else list(COMMANDS)
    loads = [os.getloadavg()[0]]
    py_wall, py_cpu = floor("pass", args.repeat)
    torch_wall, torch_cpu = floor("import torch", args.repeat)
    engine_wall, engine_cpu = floor(ENGINE, args.repeat)
    rows = []
    for name in names:
        rows.append(command(name, args.repeat))
        loads.append(os.getloadavg()[0])
        print(rows[-1], flush=True)
    lines = [
        f"Machine: {machine('cpu')}; load average {min(loads):.1f} to {max(loads):.1f} while "
        f"measured (1-minute; the VM is shared, and a load above 1 inflates every number).",
        "",
        "Target: every command on the default pair within 2 s of its own work (over <= 2).",
        f"Floor: python start-up {py_wall:.2f} s (CPU {py_cpu:.2f}); `import torch` "
        f"{torch_wall:.2f} s (CPU {torch_cpu:.2f}), which every command pays; torch and the "
        f"rotviz modules barrier imports before its work {engine_wall:.2f} s (CPU "
        f"{engine_cpu:.2f}).",
        "",
        "| command (fresh process, median of "
        f"{args.repeat}) | end to end s | min s | CPU s | work s | over s | imported |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| `rotviz {r['name']}` | {r['wall']:.2f} | {r['min']:.2f} | {r['cpu']:.2f} | "
              f"{r['work']:.2f} | {r['over']:.2f} | {r['imported']} |" for r in rows]
    lines += [
        "",
        "Work: the JSON's `seconds` (matching and measuring; distances: `match_seconds`; match: "
        "its report's `seconds`; eval: from the command's start, its imports of torch and the "
        "model included); loading the models and the data is start-up here. slice runs a "
        "5x5 plane and ladder 5 points and 20 learned steps: smaller than their defaults, the "
        "same start-up. Every command here loads the pair through rotviz.sources.plain_torch "
        "(plain torch, "
        "no transformers import); `match` and `merge --out` write the model as "
        "`save_pretrained` does, byte for byte, through rotviz.sources.plain (safetensors "
        "only). scipy's assignment solver is loaded on its own (rotviz.groups._lsap), without "
        "scipy.optimize.",
    ]
    write_section("startup", "\n".join(lines), args.results)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

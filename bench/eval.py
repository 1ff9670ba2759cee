"""Benchmark `rotviz eval` end to end: a fresh `python -m rotviz eval` per run, imports included.

    python bench/eval.py [--repeat 5] [--results bench/RESULTS.md]

Writes section `eval` of bench/RESULTS.md. Target: `rotviz eval` of a shipped model
<= 3 s end to end on 2 CPU cores. Each row is the median (and minimum) wall time of `--repeat`
subprocess runs; the floor rows show what any such command pays before rotviz does anything
(interpreter start, `import torch`), and the last row what the same evaluation costs when the
model is loaded through transformers instead of rotviz.sources.plain_torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import RESULTS, machine, write_section  # noqa: E402
from rotviz import zoo_registry as zoo  # noqa: E402

CASES = [  # the first model of each shipped pair
    (zoo.pair("default")[0], "digits"),
    (zoo.pair("finetuned")[0], "digits"),
    (zoo.pair("gpt2")[0], "pystdlib"),
]
FULL_PATH = (
    "import sys, torch; from rotviz.sources.loading import load_model; "
    "from rotviz.data.split import load_split; "
    "from rotviz.evaluation import evaluate; torch.set_num_threads(1); "
    "print(evaluate(load_model(sys.argv[1]), load_split(sys.argv[2], 'test')))"
)


def wall(cmd: list[str], repeat: int) -> tuple[float, float, str]:
    times, out = [], ""
    for _ in range(repeat):
        t = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - t)
        if proc.returncode != 0:
            raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr}")
        out = proc.stdout
    return statistics.median(times), min(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args()
    py = sys.executable
    rows = []
    load = os.getloadavg()[0]

    med, low, _ = wall([py, "-c", "pass"], args.repeat)
    rows.append(("python start-up (floor)", "-", med, low, "-"))
    med, low, _ = wall([py, "-c", "import torch"], args.repeat)
    rows.append(("`import torch` (floor)", "-", med, low, "-"))
    with tempfile.TemporaryDirectory() as tmp:
        for model, data in CASES:
            js = Path(tmp) / "e.json"
            med, low, _ = wall([py, "-m", "rotviz", "eval", model, "--data", data,
                                "--json", str(js), "--overwrite"], args.repeat)
            got = json.loads(js.read_text())
            rows.append((f"`rotviz eval {model} --data {data}`", f"{got['n']}", med, low,
                         f"{got['seconds']:.2f}"))
            print(rows[-1], flush=True)
    model, data = CASES[0]
    med, low, _ = wall([py, "-c", FULL_PATH, model, data], args.repeat)
    rows.append((f"{model} on {data} through transformers (`load_model`, not the CLI)", "397",
                 med, low, "-"))
    load = max(load, os.getloadavg()[0])

    lines = [
        f"Machine: {machine('cpu')}; load average up to {load:.1f} while measured "
        "(the VM is shared, so higher loads mean pessimistic numbers).",
        "",
        "Target: `rotviz eval` of a shipped model <= 3 s end to end, imports included.",
        "",
        "| command (fresh process) | examples | median s | min s | `seconds` in JSON |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {c} | {n} | {m:.2f} | {lo:.2f} | {s} |" for c, n, m, lo, s in rows]
    lines += [
        "",
        "`seconds` in the JSON is the command's own time after start-up (imports of torch and "
        "rotviz, data, model, evaluation). `rotviz eval` loads ViT and GPT-2 checkpoints with "
        "rotviz.sources.plain_torch (plain-torch modules, same logits as transformers, tested), "
        "so it never "
        "imports transformers, whose import alone pulls in torch._dynamo and takes seconds; "
        "small models are evaluated on one CPU thread.",
    ]
    write_section("eval", "\n".join(lines), args.results)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

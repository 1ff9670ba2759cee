"""Results on the default pair, pinned bit for bit before the package was rebuilt in layers:
`rotviz match --report` for seed, weight and weight,act, the 21-point barrier
curves for none, seed and weight, `rotviz merge --method regmean`, and the seeded learned
barrier. A refactor must leave every number as it was.

Float results depend on the machine (the CPU's vector units decide how float32 sums round) and
on the numerical libraries, so the file records the environment it was computed in
(`environment()`, key `_environment`). Where it is the same, every number must be the same bit
for bit; elsewhere floats must agree to the rounding such a change can cause (see
tests/test_pinned.py), which is far below what any change of behaviour moves them.

    .venv/bin/python tests/pinned.py        # re-record tests/data/pinned.json (only on purpose)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

A, B = "zoo:vit-digits-s3", "zoo:vit-digits-s6"
FILE = Path(__file__).resolve().parent / "data" / "pinned.json"
TIMING = {"seconds", "match_seconds", "stats_seconds", "rotviz", "out"}  # not results


def _strip(obj):
    """The JSON without timings, the version stamp and output paths."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in TIMING}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _run(argv: list[str], out: Path) -> dict:
    from rotviz.cli import main

    assert main(argv) == 0, argv
    return _strip(json.loads(out.read_text()))


def environment() -> dict:
    """What float results depend on: the CPU (model and vector extensions) and the versions of
    the numerical libraries."""
    import platform
    from importlib.metadata import version

    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    simd = sorted(f for f in flags if f.startswith(("avx", "fma", "amx", "sse4")))
    return {"cpu": cpu, "simd": simd, "python": platform.python_version(),
            **{p: version(p) for p in ("torch", "transformers", "numpy", "scipy")}}


def compute() -> dict:
    """Every pinned result, computed now (one CPU thread, as the tests run)."""
    import torch

    torch.set_num_threads(1)
    got: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for i, spec in enumerate(("seed", "weight", "weight,act")):
            flags = {"seed": [], "weight": ["--heads", "--residual"],
                     "weight,act": ["--heads", "--residual", "--act", "--data", "digits"]}[spec]
            rep = t / f"m{i}.json"
            got[f"match {spec}"] = _run(["match", A, B, "--out", str(t / f"m{i}"), "--report",
                                         str(rep), "--device", "cpu", *flags], rep)
        for spec in ("none", "seed", "weight"):
            js = t / f"b-{spec}.json"
            got[f"barrier {spec}"] = _run(["barrier", A, B, "--data", "digits", "--match", spec,
                                           "--points", "21", "--json", str(js),
                                           "--device", "cpu"], js)
        js = t / "merge.json"
        got["merge regmean"] = _run(["merge", A, B, "--data", "digits", "--method", "regmean",
                                     "--json", str(js), "--device", "cpu"], js)
        js = t / "learned.json"
        got["barrier learned"] = _run(["barrier", A, B, "--data", "digits", "--match", "learned",
                                       "--points", "21", "--json", str(js), "--device", "cpu"],
                                      js)
    return got


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    FILE.parent.mkdir(exist_ok=True)
    FILE.write_text(json.dumps({**compute(), "_environment": environment()}, indent=1,
                               sort_keys=True) + "\n")
    print(f"wrote {FILE}")

"""Benchmark: the whole paper-figure gallery, `rotviz figures --out DIR`, on the zoo's default
pair, as a user runs it (a fresh `python -m rotviz` process: imports, loading, every figure,
the PNGs in one browser, the report).

    python bench/figures.py [--results bench/RESULTS.md]

Writes section `figures` of bench/RESULTS.md: the wall and CPU seconds of the command (target:
<= 5 minutes on this CPU), each figure's seconds, and the numbers the figures show, read back
from the CSVs the command wrote. The machine is shared: the load average says how busy it was.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import RESULTS, machine, write_section  # noqa: E402

TARGET = 300.0


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"


def numbers(out: Path) -> str:
    """What the figures show, from their CSVs."""
    from rotviz.gallery import read_table

    def rows(name: str) -> list[dict]:
        f = out / f"{name}.csv"
        return read_table(f.read_text()) if f.exists() else []

    lines = []
    d = {r["match"]: r["after"] for r in rows("fig4_distances") if r["by"] == "total"}
    if d:
        lines.append("Figure 4, distance to the anchor: " + ", ".join(
            f"`{m}` {v:.4f}" for m, v in d.items()))
    for name, what in (("fig5_barriers", "Figure 5"), ("glmc_learned", "learned matching")):
        by: dict[str, list[float]] = {}
        for r in rows(name):
            by.setdefault(r["match"], []).append(r["loss"])
        if by:
            from rotviz.plots.paths import barrier_point

            def barrier(v: list[float]) -> float:
                _, top, base = barrier_point([i / (len(v) - 1) for i in range(len(v))], v)
                return top - base

            lines.append(f"{what}, barrier (nats): " + ", ".join(
                f"`{m}` {barrier(v):.4f}" for m, v in by.items()))
    s = rows("fig6_sweeps")
    if s:
        best = min((r for r in s if str(r["matched"]).startswith("single")),
                   key=lambda r: r["mid_loss"])
        ends = {r["matched"]: r["mid_loss"] for r in s if r["matched"] in ("none", "all")}
        lines.append(f"Figure 6, merged loss: none matched {ends['none']:.4f}, all "
                     f"{ends['all']:.4f}, best single layer ({best['matched']}) "
                     f"{best['mid_loss']:.4f}")
    t = rows("table1_merges")
    if t:
        f1 = "macro_f1" if "macro_f1" in t[0] else "acc"
        cells = [f"{r['method']} `{r['match']}` {r[f1]:.4f}" for r in t if r["model"] == "merged"]
        lines.append(f"Table 1, merged {f1}: " + ", ".join(cells))
    return "\n".join(f"- {ln}" for ln in lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
        before, c0, t0 = load(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "rotviz", "figures", "--out", str(out)],
                             cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
        if run.returncode != 0:
            print(run.stdout, run.stderr, sep="\n")
            return 1
        said = run.stdout.strip().splitlines()[-1]
        files = sorted(f.name for f in out.iterdir())
        seen = numbers(out)
    verdict = "met" if wall <= TARGET else "MISSED"
    body = (f"Run as `python bench/figures.py`. Machine: {machine()}; 1-minute load average "
            f"{before} at the start, {load()} at the end (a shared machine: loads above the "
            "core count mean pessimistic wall times; CPU seconds are steadier).\n\n"
            "`python -m rotviz figures --out DIR` on the default pair (zoo:vit-digits-s3 anchor, "
            "zoo:vit-digits-s6 source), digits test split (397 images), every figure, the "
            "PNGs drawn in one browser: a fresh process, imports and model loading included. "
            f"Target <= {TARGET:.0f} s: **{wall:.1f} s wall, {cpu:.1f} s CPU, {verdict}**.\n\n"
            f"Its last line: `{said}`\n\n{len(files)} files written: "
            f"{', '.join(files)}.\n\n{seen}\n")
    print(body)
    write_section("figures", body, args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

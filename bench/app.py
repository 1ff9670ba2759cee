"""Time the app's script runs headless (streamlit.testing AppTest), without a browser.

Measures, on the default pair and the whole digits test split:
- cold start: a fresh Python process until the Models page has run (imports, model loading,
  both model cards) - the server-side part of the first paint;
- the Barrier page's first run with its defaults (its matching options x 21 points), which
  the app starts computing once the Models page has painted;
- a cached rerun of the Barrier page (what pressing Run again costs on the server).
Browser-side timings (rendering included) come from bench/screenshots.py.

    .venv/bin/python bench/app.py [--device cpu] [--no-results]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rotviz.app.specs import DEFAULT_SPECS  # noqa: E402

CHILD = """
import json, sys, time
t0 = float(sys.argv[1])
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[2], default_timeout=600)
at.query_params["device"] = sys.argv[3]
at.run()
assert not at.exception, [e.message for e in at.exception]
assert len(at.metric) >= 6, "the model cards did not render"
t_models = time.time() - t0
at.switch_page("views/barrier.py")
t = time.time(); at.run(); t_barrier = time.time() - t
assert not at.exception, [e.message for e in at.exception]
assert len(at.get("plotly_chart")) >= 2, "the barrier curves did not render"
t = time.time(); at.run(); t_cached = time.time() - t
print(json.dumps({"models": t_models, "barrier": t_barrier, "cached": t_cached}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    ap.add_argument("--no-results", action="store_true", help="do not write bench/RESULTS.md")
    args = ap.parse_args(argv)
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", CHILD, str(t0), str(REPO / "rotviz/ui/main.py"),
                          args.device],
                         cwd=REPO, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        print(out.stderr[-3000:], file=sys.stderr)
        return 1
    t = json.loads(out.stdout.strip().splitlines()[-1])
    rows = [
        ("cold start to the Models page rendered (imports, 2 models, 2 cards)", t["models"],
         "<= 8 s to first paint"),
        (f"Barrier page, first run: {len(DEFAULT_SPECS)} options x 21 points, 397 test images "
         "(computed ahead from the Models page on)", t["barrier"], "<= 10 s"),
        ("Barrier page, cached rerun", t["cached"], "<= 1 s"),
    ]
    for name, sec, target in rows:
        print(f"{name}: {sec:.2f} s (target {target})")
    if not args.no_results:
        sys.path.insert(0, str(REPO))
        from bench.results import machine, write_section

        table = "\n".join(f"| {n} | {s:.2f} | {g} |" for n, s, g in rows)
        body = (f"Machine: {machine(args.device)}\n\n`bench/app.py --device {args.device}`: the "
                "app's script runs under AppTest (server side, no browser), default pair.\n\n"
                "| step | seconds | target |\n|---|---|---|\n" + table)
        write_section(f"app-server-{args.device}", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Drop-in (issue 44's acceptance): the README's two example modules, a measurement and a merge
method, each copied as the README writes it into rotviz/measures/ and rotviz/merging/ of a
copy of the package, and no other file touched: each appears in `rotviz --help`, runs from the
CLI, from the library (`rotviz.measure`, `rotviz.merge`) and through the app's compute
dispatch (`rotviz.app.run`), with the same numbers, and lands in the exports (--json, the
app's zip with its table as CSV). The modules are read from README.md, so the README cannot
go stale."""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
A, B = "zoo:vit-digits-s3", "zoo:vit-digits-s6"


def readme_modules() -> dict[str, str]:
    """The README's example modules: path in the package (the block's first line, a comment)
    -> the code, exactly as written there."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n# (rotviz/(?:measures|merging)/\w+\.py)\n(.*?)```", text,
                        re.S)
    return {path: code for path, code in blocks}


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """A copy of rotviz/ with the README's two modules dropped in, and nothing else changed."""
    root = tmp_path_factory.mktemp("dropin")
    shutil.copytree(REPO / "rotviz", root / "rotviz",
                    ignore=shutil.ignore_patterns("__pycache__"))
    modules = readme_modules()
    assert sorted(Path(p).parent.name for p in modules) == ["measures", "merging"], modules
    for path, code in modules.items():
        assert not (root / path).exists(), f"{path} is a module of the package already"
        (root / path).write_text(code)
    differ = filecmp.dircmp(REPO / "rotviz", root / "rotviz", ignore=["__pycache__"])
    assert not differ.diff_files and not differ.left_only  # nothing else touched
    return root


def python(package: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(package),
           "ROTVIZ_ZOO": str(REPO / "rotviz" / "assets" / "zoo"), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_readme_modules_drop_in(package, tmp_path):
    # one interpreter for all (each imports torch and compiles the copied package anew): the
    # top-level --help first, before anything imports the two modules by name, so that they
    # are listed only if the package finds them itself
    script = textwrap.dedent(f"""
        import contextlib, io
        from rotviz.cli import main

        with contextlib.redirect_stdout(io.StringIO()) as shown:
            helped = main(["--help"])
        import json, sys, zipfile
        import rotviz, rotviz.measures.point, rotviz.merging.lean
        from rotviz import app
        from rotviz.app.export import measurement_zip
        from rotviz.cli import main
        from rotviz.data.split import load_split
        from rotviz.match.endpoints import match_endpoints
        from rotviz.sources.loading import load_model

        assert rotviz.measures.point.__file__.startswith({str(package)!r})
        for argv in (["point", "--help"], ["merge", "--help"]):
            try:
                main(argv)
            except SystemExit as e:
                assert e.code == 0
        for argv in (["point", "{A}", "{B}", "--data", "digits", "--alpha", "0.25",
                      "--device", "cpu", "--json", "point.json"],
                     ["merge", "{A}", "{B}", "--data", "digits", "--method", "lean",
                      "--lean", "0.3", "--device", "cpu", "--json", "lean.json"]):
            assert main(argv) == 0, argv
        bad = main(["point", "{A}", "{B}", "--data", "digits", "--alpha", "2"])
        cli = json.load(open("point.json")), json.load(open("lean.json"))

        a, b, split = load_model("{A}"), load_model("{B}"), load_split("digits", "test", 0)
        lib = rotviz.measure("point", match_endpoints(a, b, "seed"), split, alpha=0.25)
        merged = rotviz.merge(a, b, "lean", "seed", split, lean=0.3)

        base = {{"anchor": "{A}", "source": "{B}", "data": "digits", "seed": 0, "n_eval": 0,
                 "device": "cpu"}}
        cfg = app.measure_cfg(base, "seed", alpha=0.25)
        got = app.run("point", app.Resources(), cfg)
        mcfg = app.measure_cfg(base, "seed", method="lean", lean=0.3)
        mgot = app.run("merge", app.Resources(), mcfg)
        with zipfile.ZipFile(io.BytesIO(measurement_zip("point", cfg, got, images=False))) as z:
            zipped = json.loads(z.read("results.json"))["point"]
            table = z.read("tables/point.csv").decode().splitlines()
        with zipfile.ZipFile(io.BytesIO(measurement_zip("merge", mcfg, mgot,
                                                        images=False))) as z:
            mzipped = json.loads(z.read("results.json"))["merge"]
        print(json.dumps({{"help": [helped, shown.getvalue()], "bad": bad, "cli": cli,
                          "lib": lib.to_dict(),
                          "merged": {{"acc": merged.acc, "loss": merged.loss,
                                     "params": merged.params}},
                          "app": got, "mapp": mgot, "zipped": zipped, "table": table,
                          "mzipped": mzipped, "kinds": app.kinds()}}))
    """)
    out = python(package, script, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.count("\n") == 1 and "--alpha must be a number from 0 to 1" in out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    helped, shown = r["help"]
    assert helped == 0, shown
    assert re.search(r"\bpoint\b.*the loss at one point of the path", shown), shown
    assert "lean" in shown  # the merge command's help lists the registered methods
    assert r["bad"] == 2 and "point" in r["kinds"]
    point, lean = r["cli"]
    assert point["alpha"] == 0.25 and point["match"] == "seed"
    for k in ("loss", "acc"):  # CLI, library, app and the app's export: one number
        assert point[k] == pytest.approx(r["lib"][k], rel=1e-9)
        assert r["app"][k] == r["zipped"][k] == pytest.approx(point[k], rel=1e-9)
    assert r["table"][0].startswith("alpha,loss,acc,match")
    assert float(r["table"][1].split(",")[1]) == pytest.approx(point["loss"], rel=1e-9)
    assert lean["method"] == "lean" and lean["params"] == {"lean": 0.3}
    for k in ("acc", "loss"):
        assert lean[k] == pytest.approx(r["merged"][k], rel=1e-9)
        assert r["mapp"][k] == r["mzipped"][k] == pytest.approx(lean[k], rel=1e-9)
    assert r["merged"]["params"] == r["mapp"]["params"] == {"lean": 0.3}

"""The tutorial notebook (examples/tutorial.ipynb) runs from top to bottom in a fresh kernel,
as a reader would run it, and its numbers are the command line's: the seed-matched barrier
and the merges at 0.5 equal the pinned `rotviz barrier` curves of the default pair
(tests/data/pinned.json), and the align-to-self rung is exactly 0."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "tutorial.ipynb"
PINNED = Path(__file__).resolve().parent / "data" / "pinned.json"


def test_the_tutorial_runs_and_agrees_with_the_cli(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    # the kernel is a process of its own: one torch thread that sleeps while it waits, as the
    # suite's workers run (tests/conftest.py), not two spinning against the other worker (10 s
    # alone, 32 s in the suite); the pinned CLI results were computed on one thread too
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "commit the notebook without outputs"
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors, errors
    last = [o for o in nb.cells[-1].outputs if o.output_type == "stream"]
    got = json.loads(last[-1].text.strip().splitlines()[-1])

    pins = json.loads(PINNED.read_text())
    seed, none = pins["barrier seed"], pins["barrier none"]
    assert seed["alphas"][10] == 0.5 and seed["match"] == "seed"
    # the same options as the pinned CLI runs: equal to float32 summation order (test_pinned)
    assert math.isclose(got["barrier_seed"], seed["barrier"], rel_tol=1e-5)
    assert got["merged_acc_seed"] == seed["acc"][10]  # the simple merge is the path at 0.5
    assert got["merged_acc_none"] == none["acc"][10]
    assert got["self_barrier"] == 0.0 and got["self_distance"] == 0.0
    none_rung, seed_rung, self_rung = got["rungs"]
    assert none_rung > seed_rung > self_rung == 0.0

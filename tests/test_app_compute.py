"""rotviz.app, the app's computations, called without Streamlit: each must give exactly what
the engine gives for the same configuration (the pages only cache, draw and export it).

Runs on the zoo's default pair (two digits ViTs) on 100 test images, on the CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rotviz import app
from rotviz.app import roots as app_roots
from rotviz.app import summaries
from rotviz.errors import RotvizError

ROOT = Path(__file__).resolve().parents[1]
N_EVAL = 100


@pytest.fixture(scope="module")
def refs() -> tuple[str, str]:
    try:
        return app_roots.default_pair()
    except RotvizError:
        pytest.skip("the zoo's default pair is not installed")


@pytest.fixture(scope="module")
def res() -> app.Resources:
    return app.Resources()


@pytest.fixture(scope="module")
def base(refs) -> dict:
    return {"anchor": refs[0], "source": refs[1], "data": "digits", "seed": 0,
            "n_eval": N_EVAL, "device": "cpu", "layers": ""}


@pytest.fixture(scope="module")
def engine(refs):
    """The pair as the engine loads it, and the split, straight from the engine."""
    from rotviz.data.split import load_split
    from rotviz.sources.loading import load_model

    return load_model(refs[0]), load_model(refs[1]), load_split("digits", "test", 0).subset(N_EVAL)


def test_importing_rotviz_app_loads_no_engine():
    """The pages import rotviz.app and its modules (rotviz.devices among them) before they
    paint, and a GPU-less machine's device picker asks no torch: no torch, transformers or
    scipy comes with them."""
    code = ("import sys, rotviz.app, rotviz.app.roots, rotviz.app.cache, rotviz.app.export, "
            "rotviz.devices, rotviz.app.specs, rotviz.app.summaries, rotviz.app.demos, "
            "rotviz.measures, rotviz.merging, rotviz.params\n"
            "from rotviz import devices\n"  # the sidebar's device picker on a GPU-less machine
            "if devices.surely_cpu_only():\n"
            "    assert devices.device_choices() == ['auto', 'cpu']\n"
            "    assert devices.device_kind('auto') == 'cpu' == devices.device_kind('cpu')\n"
            "    assert devices.device_summary('cpu')['total_gib'] > 0\n"
            "rotviz.app.roots.recorded_card('zoo:vit-digits-s3', 'digits', 0, 0)\n"
            "print(sorted(m for m in ('torch', 'transformers', 'scipy', 'streamlit') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("spec", ["seed", "weight"])
def test_match_equals_match_models(base, engine, spec):
    """Distances (total, per layer, per kind), the per-head report and the function check of
    the match computation are rotviz.match.pipeline.match_models' own, and its progress
    reaches the caller."""
    from rotviz.match.pipeline import FUNCTION_TOLERANCE, match_models
    from rotviz.match.selection import match_options

    seen = []  # the progress the computation reports (a fresh cache: it computes)
    got = app.run("match", app.Resources(), {**base, **app.spec_cfg(spec)},
                  lambda done, total, msg: seen.append((done, total, msg)))
    assert all(0 <= d <= t for d, t, _ in seen)
    if spec == "weight":  # the alternation's rounds reach the caller
        assert got["report"]["residual"]["rounds"] >= 1 and seen
    a, b, _ = engine
    want = match_models(a, b, match_options(spec, None), "cpu").report.to_dict()
    if spec == "weight":  # the default stopping rule ends within 0.5% of the old rule's
        # canonical distance (tests/data/old_rule.json: 18.5209, converged in 39 rounds)
        old = json.loads((Path(__file__).parent / "data" / "old_rule.json").read_text())
        res = want["residual"]
        assert res["distance_canonical_after"] <= 1.005 * old["default pair"] ** 0.5
        assert abs(sum(x["gain"] for x in res["history"]) - res["gain"]) <= \
            1e-6 * res["objective"][0]
    assert got["before_total"] == want["distance_before"]["total"]
    assert got["after_total"] == want["distance_after"]["total"]
    assert got["report"]["distance_after"] == want["distance_after"]
    assert got["report"]["heads"] == want["heads"]
    assert got["max_output_diff"] == want["max_output_diff"] <= FUNCTION_TOLERANCE
    assert got["preserved"] and got["tolerance"] == FUNCTION_TOLERANCE
    assert got["after_total"] < got["before_total"]


def test_no_matching_is_the_plain_distance(res, base, engine):
    from rotviz.match.distances import distances
    from rotviz.match.pipeline import view_of

    got = app.run("match", res, {**base, "spec": "none"})
    a, b, _ = engine
    d = distances(view_of(b), view_of(a)).to_dict()
    assert got["before_total"] == got["after_total"] == d["total"]
    assert got["report"]["distance_after"] == d and got["max_output_diff"] == 0.0
    assert app.matched(res, {**base, "spec": "none"}) is None


def test_matched_sources_are_computed_once_per_resources(base):
    """Resources keeps what it computed on the instance, nothing global: a second instance
    computes afresh."""
    calls = []

    class Counting(app.Resources):
        def remember(self, key, compute):
            calls.append(key)
            return super().remember(key, compute)

    r1, r2 = Counting(), Counting()
    cfg = {**base, "spec": "ffn"}
    m1 = app.matched(r1, cfg)
    assert app.matched(r1, app.PairConfig.of(cfg)) is m1
    m2 = app.matched(r2, cfg)
    assert m2 is not m1 and len(calls) == 3 and len(set(calls)) == 1
    assert r1.load(base["anchor"]) is not r2.load(base["anchor"])


def test_card_equals_model_card_of_the_full_model(res, refs, engine):
    """The Models page's card evaluates the lighter model (rotviz.sources.plain_torch where exact),
    and gets exactly the numbers of the full model: loss, accuracy, size, the symmetry check."""
    a, b, split = engine
    for ref, full in zip(refs, (a, b), strict=True):
        got = app.run("card", res, {"ref": ref, "data": "digits", "seed": 0, "n_eval": N_EVAL})
        assert got == summaries.model_card(full, split)
        assert got["check"]["passed"] and got["n_eval"] == N_EVAL


def test_card_and_residual_check_on_the_gpt2_pair():
    """The same for the zoo's GPT-2 pair (tied head): cards equal, and the lighter model
    gives the same reason why the residual stream cannot be matched."""
    from rotviz.sources.loading import load_model

    ref = "zoo:gpt2-pystdlib-s0"
    if ref not in app_roots.zoo_refs():
        pytest.skip("the zoo's GPT-2 pair is not installed")
    res = app.Resources()
    full = load_model(ref)
    got = app.run("card", res, {"ref": ref, "data": "pystdlib", "seed": 0, "n_eval": 16})
    want = summaries.model_card(full, res.split("pystdlib", 0, 16, ref))
    # the function check's largest logit change is roundoff of its own: the app's lighter
    # module and transformers' sum in other orders (6.88e-6 against 6.91e-6)
    diffs = [d.pop("max_output_diff") for d in (got["check"], want["check"])]
    assert diffs[0] == pytest.approx(diffs[1], abs=1e-6) and max(diffs) <= 1e-4
    assert got == want
    why = summaries.residual_unsupported(res.load_eval(ref))
    assert why and "tied" in why and why == summaries.residual_unsupported(full)


def test_residual_why_and_check_pair(res, refs):
    a, b = (res.load_eval(r) for r in refs)
    assert summaries.residual_unsupported(a) is None
    app.check_pair(a, b, res.split("digits", 0, N_EVAL, a.ref))
    with pytest.raises(RotvizError, match="is text data but"):
        app.check_pair(a, b, res.split("pystdlib", 0, 8, a.ref))
    # at size, the same checks on the skeletons: nothing loaded
    pair = {"anchor": refs[0], "source": refs[1], "seed": 0, "n_eval": N_EVAL}
    app.check_pair_at_size(res, {**pair, "data": "digits"})
    with pytest.raises(RotvizError, match="is text data but"):
        app.check_pair_at_size(res, {**pair, "data": "pystdlib"})
    for ref in (refs[0], "zoo:gpt2-pystdlib-s0"):  # None, and the tied head's sentence
        assert app.residual_why(res, ref, True) == app.residual_why(res, ref, False)
    assert app.residual_why(res, "zoo:gpt2-pystdlib-s0", True) is not None


def test_spectra_equal_spectra(res, base, engine):
    from rotviz.match.pipeline import view_of
    from rotviz.measures.spectra import spectra
    from rotviz.symmetry.view import read_view

    cfg = app.measure_cfg(base, "seed", "0,2")
    got = app.run("spectra", res, cfg)
    a, b, _ = engine
    m = app.matched(res, cfg)
    want = spectra(view_of(a), view_of(b), read_view(b.spec, b.config, m.state), (0, 2))
    assert {k: got[k] for k in want.to_dict()} == want.to_dict()
    assert got["preserved"] and got["match"] == "seed"
    assert [lay["layer"] for lay in got["layers"]] == [0, 2]
    assert got["max_circuit_change"] <= 1e-4


def test_plane_marks_the_three_models(res, base):
    got = app.run("plane", res, app.measure_cfg(base, "seed", grid=5))
    assert set(got["points"]) == {"A", "B", "B'", "AB", "AB'"} and got["match"] == "seed"
    z = np.asarray(got["loss"], dtype=float)
    assert z.shape == (5, 5) and np.isfinite(z).all()
    assert got["point_loss"]["B"] == pytest.approx(got["point_loss"]["B'"], abs=1e-4)


def test_fusion_equals_fusion_table(res, base, engine):
    from rotviz.analysis.fusion import fusion_table
    from rotviz.measures.fusion import combine

    # the fusion record runs once per matching (the Merge page's column each), combined
    got = combine([app.run("fusion", res, app.measure_cfg(base, sp, methods="simple",
                                                           weight=0.5))
                   for sp in ("none", "seed")])
    a, b, split = engine
    want = fusion_table(a, b, split, methods=("simple",), specs=("none", "seed"), batches=2)
    assert got["acc"]["simple"] == want.acc["simple"]
    assert got["loss"]["simple"] == want.loss["simple"]
    assert got["anchor_acc"] == want.anchor_acc and got["source_acc"] == want.source_acc


def test_learn_demo_matches_back(res, refs):
    cfg = {"ref": refs[0], "data": "digits", "seed": 0, "n_eval": N_EVAL, "kind": "all",
           "demo_seed": 3, "layer": 1, "head": 2}
    got = app.run("learn", res, cfg)
    assert got["layer"] == 1 and got["head"] == 2
    assert got["distance_scrambled"] > 1.0 and got["distance_matched"] < 1e-4
    assert max(got["diff_scrambled"], got["diff_matched"]) <= got["tolerance"]


def test_unknown_kinds_are_refused():
    with pytest.raises(RotvizError, match="no computation 'nope'"):
        app.run("nope", app.Resources(), {})


def test_devices_and_spec_configurations(refs):
    """The device picker's choices, and the part of a configuration a SPEC decides (the step
    budget only for a SPEC that learns)."""
    from rotviz.devices import device_choices

    assert device_choices()[:2] == ["auto", "cpu"]
    assert app.spec_cfg("weight,learned", 0) == {"spec": "weight,learned",
                                                 "learn_steps": app.DEFAULT_LEARN_STEPS}
    assert app.spec_cfg("act", 50) == {"spec": "weight,act"}
    assert summaries.n_params(app.Resources().load_eval(refs[0])) > 10_000


def test_a_pair_over_the_memory_budget_runs_block_by_block(res, base):
    """Over the memory budget (`max_memory`, bytes), what streams runs as `--max-memory` runs
    it and equals the in-memory result; what needs whole models says so in one line."""
    tiny = {**base, "max_memory": 1}
    sized, need, budget = app.at_size(res, tiny)
    assert sized and budget == 1 and need > 1e6
    assert not app.at_size(res, base)[0]  # what the machine has free holds this pair
    # what each record computes at size equals what it computes in memory on every host
    # (one runner): tests/measures/test_every_record.py; here the app's own part
    got = {}
    for spec, name, params in (("seed", "barrier", {"points": 3}),
                               ("none", "merge", {"method": "slerp"})):
        cfg = app.measure_cfg(base, spec, **params)
        held, streamed = app.run(name, res, cfg), app.run(name, res, {**cfg, "max_memory": 1})
        key = {"barrier": "loss", "merge": "acc"}[name]
        assert np.allclose(streamed[key], held[key], rtol=0, atol=1e-6), name
        assert streamed["at_size"]["need"] == need and streamed["at_size"]["held"] >= 0
        assert "at_size" not in held and held["match"] == streamed["match"] == spec
        got[name] = streamed
    # the Merge page's table: what merges block by block, the rest off with its reason
    table = app.run("fusion", res, app.measure_cfg(tiny, "none", methods="simple,fisher"))
    assert table["methods"] == ["simple"] and list(table["off"]) == ["fisher"]
    assert "statistics of whole models" in table["off"]["fisher"]
    held = app.run("fusion", res, app.measure_cfg(base, "none", methods="simple"))  # no stats
    assert table["acc"]["simple"]["none"] == held["acc"]["simple"]["none"]
    seed = got["barrier"]  # matched block by block: its function check, as in memory
    assert seed["preserved"] and 0 < seed["max_output_diff"] <= seed["tolerance"]
    for kind, cfg, words in (
            ("hessian", app.measure_cfg(tiny, "none"), "whole model"),
            ("match", {**tiny, **app.spec_cfg("seed")}, "holds whole models"),
            ("card", {**tiny, "ref": base["anchor"]}, "holds whole models")):
        with pytest.raises(RotvizError) as e:
            app.run(kind, res, cfg)
        msg = str(e.value)
        assert "off for this pair" in msg and words in msg and "\n" not in msg, msg
        assert "memory budget" in msg, msg

"""One file per record: a measurement and a merge method written in a module of their own,
registered, and nothing else touched, appear in `rotviz --help` and their own `--help` with
their bounded parameters (a bad value is one line, exit 2), run from the CLI, run through the
app's compute dispatch, and land in an export, with the numbers their definitions give."""

from __future__ import annotations

import importlib
import io
import json
import sys
import zipfile

import pytest
import torch

from rotviz.cli import main
from rotviz.measures import registry as measures_registry
from rotviz.merging import registry as merging_registry

A, B = "zoo:vit-digits-s3", "zoo:vit-digits-s6"

TOY = '''
"""A plug-in: the loss at one point of the path, and a weighted average with its own weight."""

import torch

from rotviz.limits import Bound
from rotviz.measures import Measurement, Param, register
from rotviz.merging import MergeMethod
from rotviz.merging import register as register_method


class Point:
    def __init__(self, at, loss, acc, match):
        self.at, self.loss, self.acc, self.match = at, loss, acc, match

    def to_dict(self):
        return {"at": self.at, "loss": self.loss, "acc": self.acc, "match": self.match}


def run(ends, ctx, v):
    from rotviz.evaluation import Evaluator

    ev = Evaluator(ends.anchor, ctx.split, ctx.device)
    pa, pb = ev.params(ends.anchor.state), ev.params(ends.matched)
    loss, acc = ev.evaluate({k: torch.lerp(pa[k], pb[k], v["at"]) for k in pa})
    return Point(v["at"], loss, acc, ends.match)


register(Measurement(
    "toy_point", "Loss at one point", "toy: the loss at one point of the straight path", run,
    (Param("at", 0.5, "where on the path, in [0, 1]", Bound("--at", 0.0, 1.0, integer=False)),),
    summary=lambda r, how: f"toy point at {r.at:g}: loss {r.loss:.6f}",
    rows=lambda d: [{"at": d["at"], "loss": d["loss"], "acc": d["acc"]}]))


class Norm(dict):
    def to_dict(self):
        return dict(self)


def norm(ends, ctx, v):
    return Norm(norm=float(sum(t.double().pow(2).sum() for t in ends.anchor.state.values()
                               if t.is_floating_point()) ** 0.5), model=ends.anchor_ref)


register(Measurement("toy_norm", "Weight norm", "toy: the weight norm of one model", norm,
                     data=False, pair=False, summary=lambda r, how: f"norm {r['norm']:.6f}"))


def combine(job, name, tensors, base):
    a, b = tensors
    w = job.params["toy_weight"]
    return ((1 - w) * a.double() + w * b.double()).to(a.dtype)


register_method(MergeMethod(
    "toy_avg", "toy average", "toy: a weighted average with a weight of its own", combine,
    params=(Param("toy_weight", 0.25, "the toy's weight of the source, in [0, 1]",
                  Bound("--toy-weight", 0.0, 1.0, integer=False)),),
    extra=("toy_weight",)))
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The plug-in module, imported from a folder of its own; the registries are restored
    afterwards, so no other test sees it."""
    for records in (measures_registry.MEASUREMENTS, merging_registry.METHODS):
        monkeypatch.setattr(records, "_by_name", dict(records._by_name))
    (tmp_path / "toy_records.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("toy_records", None)
    yield importlib.import_module("toy_records")
    sys.modules.pop("toy_records", None)


@pytest.fixture(scope="module")
def matched():
    """The default pair, matched (seed) once, and its test split."""
    from rotviz.data.split import load_split
    from rotviz.match.endpoints import match_endpoints
    from rotviz.sources.loading import load_model

    ends = match_endpoints(load_model(A), load_model(B), "seed")
    return ends, load_split("digits", "test", 0)


def _run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_the_plugin_appears_in_help_with_its_bounded_parameters(toy, capsys):
    rc, out, _ = _run(["--help"], capsys)
    assert rc == 0 and "toy_point" in out and "toy: the loss at one point" in out
    assert "toy_avg" in out  # the merge command lists the registered methods
    rc, out, _ = _run(["toy_point", "--help"], capsys)
    assert rc == 0 and "--at" in out and "--data" in out and "--match" in out
    rc, out, _ = _run(["merge", "--help"], capsys)
    assert rc == 0 and "--toy-weight" in out and "toy_avg" in out
    for argv, words in ((["toy_point", A, B, "--data", "digits", "--at", "1.5"],
                         "--at must be a number from 0 to 1, got 1.5"),
                        (["merge", A, B, "--data", "digits", "--method", "toy_avg",
                          "--toy-weight", "nan"], "--toy-weight must be a number from 0 to 1"),
                        (["merge", A, B, "--data", "digits", "--toy-weight", "0.5"],
                         "--toy-weight needs --method toy_avg")):
        rc, out, err = _run(argv, capsys)
        assert rc == 2 and err.count("\n") == 1 and words in err, err


def test_the_toy_measurement_runs_from_the_cli_and_the_app(toy, matched, tmp_path, capsys):
    from rotviz import app
    from rotviz.app.export import measurement_zip
    from rotviz.evaluation import Evaluator

    ends, split = matched
    ev = Evaluator(ends.anchor, split)  # the definition: the model at alpha on the path
    pa, pb = ev.params(ends.anchor.state), ev.params(ends.matched)
    want = ev.evaluate({k: (1 - 0.25) * pa[k] + 0.25 * pb[k] for k in pa})

    js = tmp_path / "toy.json"
    rc, out, _ = _run(["toy_point", A, B, "--data", "digits", "--at", "0.25", "--device", "cpu",
                       "--json", str(js)], capsys)
    assert rc == 0 and out.startswith("toy point at 0.25: loss")
    got = json.loads(js.read_text())
    assert got["at"] == 0.25 and got["match"] == "seed"
    assert got["loss"] == pytest.approx(want[0], rel=1e-6)
    assert got["acc"] == pytest.approx(want[1], abs=1e-12)

    base = {"anchor": A, "source": B, "data": "digits", "seed": 0, "n_eval": 0,
            "device": "cpu"}
    cfg = app.measure_cfg(base, "seed", at=0.25)
    res = app.Resources()
    r = app.run("toy_point", res, cfg)
    assert "toy_point" in app.kinds()
    assert r["loss"] == got["loss"] and r["acc"] == got["acc"]
    assert r["preserved"] and r["max_output_diff"] <= r["tolerance"]

    with zipfile.ZipFile(io.BytesIO(measurement_zip("toy_point", cfg, r, images=False))) as z:
        assert json.loads(z.read("results.json"))["toy_point"]["loss"] == r["loss"]
        rows = z.read("tables/toy_point.csv").decode().splitlines()
    assert rows[0] == "at,loss,acc" and float(rows[1].split(",")[1]) == r["loss"]


def test_the_toy_merge_method_runs_from_the_cli_and_the_app(toy, matched, tmp_path, capsys):
    from rotviz import app
    from rotviz.app.export import measurement_zip
    from rotviz.sources.loading import load_model

    ends, _ = matched
    js, out_dir = tmp_path / "m.json", tmp_path / "merged"
    rc, out, _ = _run(["merge", A, B, "--data", "digits", "--method", "toy_avg",
                       "--toy-weight", "0.3", "--device", "cpu", "--json", str(js), "--out",
                       str(out_dir)], capsys)
    assert rc == 0 and out.startswith("merged [toy_avg, match seed")
    got = json.loads(js.read_text())
    assert got["method"] == "toy_avg" and got["params"] == {"toy_weight": 0.3}
    merged = load_model(str(out_dir)).state
    for k, a in ends.anchor.state.items():  # the definition, tensor by tensor
        if a.is_floating_point():
            want = (0.7 * a.double() + 0.3 * ends.matched[k].double()).to(a.dtype)
            torch.testing.assert_close(merged[k], want, rtol=0, atol=0)

    base = {"anchor": A, "source": B, "data": "digits", "seed": 0, "n_eval": 0,
            "device": "cpu"}
    cfg = app.measure_cfg(base, "seed", method="toy_avg", toy_weight=0.3)
    r = app.run("merge", app.Resources(), cfg)
    assert r["acc"] == got["acc"] and r["loss"] == got["loss"] and r["params"] == got["params"]
    table = app.run("fusion", app.Resources(), app.measure_cfg(
        base, "seed", methods="simple,toy_avg", weight=0.3, toy_weight=0.3))
    assert table["acc"]["toy_avg"]["seed"] == got["acc"]
    with zipfile.ZipFile(io.BytesIO(measurement_zip("merge", cfg, r, images=False))) as z:
        assert json.loads(z.read("results.json"))["merge"]["params"] == {"toy_weight": 0.3}
        assert "tables/merge.csv" in z.namelist()


def test_measurements_take_streamed_endpoints_too(matched):
    """The same records on endpoints streamed from the checkpoint folders (a pair larger than
    memory): the barrier and the distances equal the held ones; a measurement without an
    at-size implementation says so in one line, from its record."""
    from rotviz import measure
    from rotviz.atsize.blocks import open_streamed
    from rotviz.atsize.endpoints import streamed_endpoints
    from rotviz.errors import RotvizError
    from rotviz.match.selection import match_options

    held, split = matched
    want = measure("barrier", held, split, points=5)
    with streamed_endpoints(open_streamed(A), open_streamed(B), match_options("seed"),
                            "cpu") as ends:
        assert ends.at_size and ends.match == "seed"
        got = measure("barrier", ends, split, points=5)
        d = measure("distances", ends).to_dict()
        with pytest.raises(RotvizError, match="read block by block, and spectra read every"):
            measure("spectra", ends)
    assert max(abs(x - y) for x, y in zip(got.loss, want.loss, strict=True)) <= 1e-5
    assert got.acc == want.acc and got.match == want.match == "seed"
    assert d["distance_after"] == pytest.approx(held.info.distance_after, rel=1e-9)
    assert d["distance_before"] == pytest.approx(held.info.distance_before, rel=1e-9)


def test_a_one_model_record_takes_one_model(toy, tmp_path, capsys):
    """A record that measures one model (pair=False): one positional model on the CLI, no
    --match, and the app runs it on `ref`."""
    from rotviz import app
    from rotviz.sources.loading import load_model

    m = load_model(A)
    want = sum(float(t.double().pow(2).sum()) for t in m.state.values()
               if t.is_floating_point()) ** 0.5
    js = tmp_path / "n.json"
    rc, out, _ = _run(["toy_norm", A, "--json", str(js)], capsys)
    assert rc == 0 and out.startswith("norm ")
    got = json.loads(js.read_text())
    assert got["norm"] == pytest.approx(want, rel=1e-12) and got["model"] == A
    rc, _, err = _run(["toy_norm", A, B], capsys)
    assert rc == 2 and err.count("\n") == 1
    r = app.run("toy_norm", app.Resources(), {"ref": A, "device": "cpu"})
    assert r["norm"] == got["norm"]


def test_a_parameter_declares_what_it_needs_and_values_refuses_the_rest():
    """Param.needs: a parameter given while the one it depends on does not hold is refused in
    one line (it would be ignored); its default, not given, is never refused."""
    from rotviz.errors import RotvizError
    from rotviz.limits import Bound
    from rotviz.measures import Measurement, Param

    m = Measurement("toy_needs", "Toy", "toy", lambda *a: None, (
        Param("mode", "a", "a or b", choices=("a", "b")),
        Param("knob", 1, "with --mode b", Bound("--knob", 0, 9), needs=("mode", ("b",)))))
    with pytest.raises(RotvizError, match=r"^--knob needs --mode b: add it, or drop --knob$"):
        m.values({"knob": 2})
    assert m.values({"knob": 2, "mode": "b"})["knob"] == 2
    assert m.values({"mode": "a"}) == {"mode": "a", "knob": 1}

"""No NaN or infinity in any result (issue 43): `--json` is strict JSON, and a statistic
that is undefined is null in it and "n/a (one probe)" in the command's line.

The three one-probe cases (a Hutchinson trace from one probe in `hessian` and `sharpness`, an
SLQ count from one probe in `flat`) give null and the words. Then a property test draws every
built-in record's parameters within their bounds (rotviz.limits, through each Param) and runs
the command on a pair of tiny random ViTs (890 parameters) on the digits data: exit 0 with a
JSON that a strict parser reads (no NaN, no Infinity), or a one-line refusal with exit 2 and
nothing written. To stay within seconds (each run well under one) it draws from the cheap
end of the bounds where the work grows with a value (points, grid, Lanczos steps, probes,
examples, training and teleport steps, Karcher iterations, geodesic samples, the blocks
counted with a dense Hessian: `CAP`; batch sizes from
32: `FLOOR`) and leaves out the records that train models or read three and more
(`SLOW`: training, spawn, many, ladder, trajectory); the values that only change numbers (spans,
margins, weights, scales, seeds, tolerances) take their whole range, extremes included.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rotviz.cli import main
from rotviz.measures import measurements
from rotviz.outputs import write_json_file

VIT = dict(layers=1, d=8, heads=2, ffn=16, image=8, patch=2, channels=1, labels=10)  # digits
ONE_PROBE = "n/a (one probe)"
SLOW = {"training", "spawn", "many", "ladder", "trajectory"}  # training runs, or 3+ models
CAP = {"points": 3, "grid": 4, "repeats": 2, "batches": 2, "iterations": 6, "top": 3,
       "trace": 3, "density": 2, "steps": 3, "per_layer": 2, "nullity_probes": 2,
       "nullity_steps": 6, "examples": 32,
       "nullity_exact": 256,  # the largest value drawn, below the bound's (dense: seconds)
       "trace_probes": 3,  # teleport's Hutchinson probes: 226 drawn took 3.8 s, 23841 3 min
       "teleport_steps": 3, "teleport_examples": 32,  # teleport_train's (bounds 1000, 1e5)
       "karcher_max_iter": 3,  # the Karcher mean's iterations (bound 10000)
       "geodesic_samples": 2, "geodesic_steps": 3}  # hessian's geodesic average (1000 each)
FLOOR = {"batch_size": 32}  # the smallest value drawn, above the bound's
# a capped value is always given (its default may cost seconds), but for these, which a
# record refuses without another option (--iterations needs --directions hessian in slice,
# --karcher-max-iter --method karcher, --geodesic-* --geodesic average) and whose default
# is cheap on the tiny pair: given or left out, as every other parameter
OPTIONAL = {("slice", "iterations"), *((r, p) for r in ("merge", "merge_sweep")
                                        for p in ("batches", "batch_size", "karcher_max_iter")),
            ("hessian", "geodesic_samples"), ("hessian", "geodesic_steps")}
# records whose parameters depend on each other (--density needs --method ties, ...) are
# mostly refused, in milliseconds: more draws, so that some run
EXAMPLES = {"merge": 12, "merge_sweep": 12, "slice": 8}

def _settings(name: str):
    return settings(max_examples=EXAMPLES.get(name, 4), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def _refuse_constant(name: str):
    raise ValueError(f"not strict JSON: {name}")


def strict(path: Path) -> dict:
    """The file as a strict parser reads it: NaN, Infinity and -Infinity raise."""
    return json.loads(path.read_text(), parse_constant=_refuse_constant)


@pytest.fixture(scope="module")
def pair(saved) -> tuple[str, str, str]:
    """Two tiny ViTs, and a third as a merge's base."""
    return tuple(str(saved("vit", seed, **VIT)) for seed in (0, 1, 2))


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _last(out: str) -> str:
    return out.strip().splitlines()[-1]


def test_hessian_trace_from_one_probe_is_null(pair, tmp_path, capsys):
    js = tmp_path / "h.json"
    rc, out, err = _run(["hessian", pair[0], "--data", "digits", "--trace", "1", "--top", "1",
                         "--iterations", "6", "--examples", "32", "--by", "block",
                         "--json", str(js)], capsys)
    assert rc == 0, err
    d = strict(js)
    assert math.isfinite(d["trace"]) and d["trace_se"] is None and d["probes"] == 1
    assert all(g["trace_se"] is None and math.isfinite(g["trace"]) for g in d["groups"])
    assert f"+- {ONE_PROBE}" in _last(out) and "nan" not in out


def test_hessian_trace_from_two_probes_has_its_error(pair, tmp_path, capsys):
    js = tmp_path / "h.json"
    rc, out, _ = _run(["hessian", pair[0], "--data", "digits", "--trace", "2", "--top", "1",
                       "--iterations", "6", "--examples", "32", "--json", str(js)], capsys)
    d = strict(js)
    assert rc == 0 and d["trace_se"] > 0 and ONE_PROBE not in out
    assert f"+- {d['trace_se']:.2g}" in _last(out)


def test_sharpness_trace_from_one_probe_is_null(pair, tmp_path, capsys):
    js = tmp_path / "s.json"
    rc, out, err = _run(["sharpness", *pair[:2], "--data", "digits", "--trace", "1", "--points",
                         "2", "--iterations", "3", "--examples", "16", "--json", str(js)],
                        capsys)
    assert rc == 0, err
    d = strict(js)
    for path in ("matched", "unmatched"):
        assert d[f"{path}_trace_se"] == [None, None]
        assert all(math.isfinite(t) for t in d[f"{path}_trace"])
    assert f"(standard error {ONE_PROBE})" in _last(out) and "nan" not in out


def test_flat_count_from_one_probe_is_null(pair, tmp_path, capsys):
    js = tmp_path / "f.json"
    rc, out, err = _run(["flat", pair[0], "--data", "digits", "--per-layer", "1",
                         "--nullity", "yes", "--nullity-exact", "0", "--nullity-probes", "1",
                         "--nullity-steps", "4", "--examples", "16", "--json", str(js)],
                        capsys)
    assert rc == 0, err
    rows = strict(js)["nullity"]
    assert rows and all(r["method"] == "slq" and r["error"] is None for r in rows)
    line = _last(out)
    assert line.count(f"+- {ONE_PROBE} (slq)") == len(rows) and "nan" not in line


def test_a_non_finite_number_is_never_written(tmp_path):
    """The one writer every --json goes through refuses NaN and infinity, naming the key,
    and leaves no file: a record must say null where a number is undefined."""
    for bad in (math.nan, math.inf, -math.inf):
        f = tmp_path / f"x{bad}.json"
        with pytest.raises(ValueError, match=r"non-finite number at rows\[1\]\.se"):
            write_json_file(f, {"rows": [{"se": 1.0}, {"se": bad}]}, "test")
        assert not f.exists()
    write_json_file(tmp_path / "ok.json", {"se": None, "x": 1.5}, "test")
    assert strict(tmp_path / "ok.json")["se"] is None


def _strategy(p):
    """Values of one parameter within its bound (narrowed by CAP and FLOOR), or its choices;
    None for free text (a merge's base model: not drawn)."""
    if p.choices:
        return st.sampled_from(p.choices)
    b = p.bound
    if b is None:
        return None
    if not b.integer:  # a share, a scale, a span: its whole range
        return st.floats(b.lo, b.hi, allow_nan=False, allow_infinity=False)
    return st.integers(int(max(b.lo, FLOOR.get(p.name, b.lo))),
                       int(min(b.hi, CAP.get(p.name, b.hi))))


RECORDS = [m for m in measurements() if m.name not in SLOW]


def test_every_record_is_drawn_or_named_slow():
    names = {m.name for m in measurements()}
    assert SLOW <= names and len(RECORDS) == len(names) - len(SLOW) >= 14


KEYS = {"method", "around", "directions", "param", "nullity"}  # others depend on these


@st.composite
def _values(draw, m) -> dict:
    """A record's parameters: every capped one (its default may cost seconds) and every one
    in KEYS, then up to two of the others, each within its bound; the rest keep their
    defaults. Few at a time, since most of them depend on a key (--density needs --method
    ties, ...)."""
    always, others = {}, {}
    for p in m.parameters():
        s = _strategy(p)
        if s is None:
            continue
        capped = (p.bound is not None and p.bound.integer  # merge's --density: a share
                  and (p.name in CAP or p.name in FLOOR) and (m.name, p.name) not in OPTIONAL)
        (always if capped else others)[p.name] = s
    for key in KEYS & set(others):  # what the others depend on: always drawn
        always[key] = others.pop(key)
    names = draw(st.sets(st.sampled_from(sorted(others)), max_size=2)) if others else set()
    return {k: draw(s) for k, s in {**always, **others}.items() if k in always or k in names}


@pytest.mark.parametrize("m", RECORDS, ids=lambda m: m.name)
def test_every_json_a_record_writes_is_strict(m, pair, capsys):
    @_settings(m.name)
    @given(_values(m), st.booleans())
    def check(v: dict, second: bool) -> None:
        flags = [f"{p.flag}={v[p.name]!r}" if isinstance(v[p.name], float)
                 else f"{p.flag}={v[p.name]}" for p in m.parameters() if p.name in v]
        models = list(pair[:2]) if m.pair else [pair[0]]
        if "base" in {p.name for p in m.parameters()} and second:  # task vectors' base
            models += ["--base", pair[2]]
        if not m.pair and m.source is not None and second:  # slice's second model
            models += ["--source", pair[1]]
        with tempfile.TemporaryDirectory() as d:
            js = Path(d) / "r.json"
            rc, out, err = _run([m.name, *models,
                                 "--data", "digits", *flags, "--json", str(js)], capsys)
            if rc == 2:  # refused: one line, nothing written
                assert err.startswith("rotviz: error: ") and err.count("\n") == 1, err
                assert not js.exists()
                return
            assert rc == 0, (rc, err)
            assert strict(js)["rotviz"]["command"] == m.name
            assert not re.search(r"\b(nan|inf)\b", out, re.IGNORECASE), out

    check()

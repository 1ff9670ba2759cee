"""The default pair's results are exactly those pinned in tests/data/pinned.json (see
tests/pinned.py): matching reports (distances, angles, objective history), barrier curves,
RegMean merge and the seeded learned barrier, bit for bit in the environment they were
recorded in (CPU and numerical libraries, `_environment`).

On another CPU or library version float32 sums round differently: there every float must
agree to 1e-5 relative (or 1e-6 absolute), except the function check's largest logit
difference, itself a roundoff-sized number (1e-5 absolute); everything else (counts, lengths,
options, labels) exactly. Measured between two machines: 2e-6 relative at most (the learned
barrier, then after 300 Adam steps; the default is now 80) and 1.7e-6 on the function check;
a change of behaviour moves these numbers by orders of magnitude more."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import torch
from pinned import FILE, compute, environment

REL, ABS = 1e-5, 1e-6
# absolute tolerances of roundoff-sized results: the function check's largest logit
# difference, and the angles (degrees) of rotations at the identity, where arccos turns a
# roundoff of 1e-16 in a cosine into 8e-7 degrees (seen: 0.0 vs 1.2e-6 on another CPU)
ROUNDOFF = {"max_output_diff": 1e-5, "residual_angles": 1e-5}
# Angles of the seed matching's per-head maps (degrees, from float32 SVDs) are compared across
# environments by their cosines: at 0 and 180 degrees arccos turns a float32 roundoff of 1e-7
# in a cosine into 0.03 degrees (seen: 180.0 vs 179.972 between an AMD EPYC and an Intel Xeon)
COSINES = {"qk_angles", "vo_angles"}
COSINE_ABS = 1e-6
# The weight-matching alternation takes discrete steps (unit permutations, joint block steps)
# whose choices flip under another CPU's rounding: measured between an AMD EPYC and an Intel
# Xeon, 35 against 38 rounds and a canonical distance of 18.5273 against 18.5209 (3.4e-4).
# Across environments, the results built on it are checked as a whole to LOOSE (relative, or
# absolute below 1e-3), per-round records (whose number may differ) by their common part, and
# round and step counts not at all; in their own environment, bit for bit like the rest.
# The stream map's rotation angles are not compared there: the alternation ends in a valley
# along which the map turns by degrees at an unchanged distance (docs/solvers.md), so which
# point of it a run stops at is a matter of rounding (seen: 41.66 against 44.56 degrees).
WEIGHT = {"match weight", "barrier weight"}
LOOSE = 5e-2
UNSTABLE = {".residual.angles"}


def _diffs(want, got, path="", exact=True, loose=False) -> list[str]:
    """Where two JSON values differ (floats exactly, or within REL/ABS when not `exact`, LOOSE
    when `loose`; NaN equal to NaN)."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}.{k}: missing" for k in want.keys() - got.keys()]
        out += [f"{path}.{k}: new" for k in got.keys() - want.keys()]
        for k in want.keys() & got.keys():
            out += _diffs(want[k], got[k], f"{path}.{k}", exact, loose)
        return out
    if loose and path in UNSTABLE:
        return []
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got) and not loose:
            return [f"{path}: length {len(want)} != {len(got)}"]
        n = min(len(want), len(got))
        return [d for i, (a, b) in enumerate(zip(want[:n], got[:n], strict=True))
                for d in _diffs(a, b, f"{path}[{i}]", exact, loose)]
    name = path.rsplit(".", 1)[-1].split("[", 1)[0]
    if loose and isinstance(want, int) and isinstance(got, int) and not isinstance(want, bool):
        return []  # counts of rounds and steps
    if not exact and name in COSINES and isinstance(want, float) and isinstance(got, float):
        a, b = math.cos(math.radians(want)), math.cos(math.radians(got))
        return [] if abs(a - b) <= (1e-3 if loose else COSINE_ABS) else \
            [f"{path}: {want!r} != {got!r}"]
    if isinstance(want, float) and isinstance(got, float):
        if math.isnan(want):
            return [] if math.isnan(got) else [f"{path}: nan != {got!r}"]
        tol = ROUNDOFF.get(name, ABS)
        if not exact and math.isclose(want, got, rel_tol=LOOSE if loose else REL,
                                      abs_tol=1e-3 if loose else tol):
            return []
    return [] if want == got and type(want) is type(got) else [f"{path}: {want!r} != {got!r}"]


KEYS = ("match seed", "match weight", "match weight,act", "barrier none", "barrier seed",
        "barrier weight", "merge regmean", "barrier learned")


def _same_environment() -> bool:
    return json.loads(FILE.read_text()).get("_environment") == environment()


def _same(x, y) -> bool:
    """Whether two inputs of a solver are equal: tensors bit for bit (dtype, shape, bytes),
    dataclasses field by field, containers item by item, anything else by ==."""
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                and x.dtype == y.dtype and x.shape == y.shape
                and torch.equal(x.reshape(-1).view(torch.uint8),
                                y.reshape(-1).view(torch.uint8)))
    if type(x) is not type(y):
        return False
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return x is y or all(_same(getattr(x, f.name), getattr(y, f.name))
                             for f in dataclasses.fields(x))
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_same(u, v) for u, v in zip(x, y, strict=True))
    return x == y


def _weight_matching_once(monkeypatch) -> None:
    """`match --heads --residual` and `barrier --match weight` both run weight matching (the
    residual alternation, about 6 CPU-s each here) on the default pair with the same
    options: a call whose inputs (every tensor bit for bit, the options) are an earlier
    call's gets a copy of that call's result, which the solver, deterministic, would compute
    again; other inputs are solved as before."""
    import rotviz.match.engine as engine

    solve, done = engine.match_residual, []

    def once(anchor, source, options, progress=None):
        for inputs, result in done:
            if _same(inputs, (anchor, source, options)):
                return copy.deepcopy(result)
        result = solve(anchor, source, options, progress)
        done.append((copy.deepcopy((anchor, source, options)), copy.deepcopy(result)))
        return result

    monkeypatch.setattr(engine, "match_residual", once)


def test_default_pair_results_are_pinned(monkeypatch):
    """Every pinned result, computed once in one test (one process: under pytest-xdist a
    module fixture would be computed again by each worker that runs one of its tests)."""
    _weight_matching_once(monkeypatch)
    results = compute()
    pins = json.loads(FILE.read_text())
    exact = _same_environment()
    failed = {}
    for key in KEYS:
        diffs = _diffs(pins[key], results[key], exact=exact, loose=not exact and key in WEIGHT)
        if diffs:
            failed[key] = f"{len(diffs)} differences, first: {diffs[:5]}"
    assert not failed, f"({'bit for bit' if exact else 'to rounding'}) {failed}"
    assert set(KEYS) == set(pins) - {"_environment"}
    # the acceptance on the default pair, whatever was pinned (issue 30): learned matching (the
    # seeded default) leaves a test barrier of at most 0.02 and keeps the function; its path
    # ends where weight matching's does (the same two functions)
    learned, weight = results["barrier learned"], results["barrier weight"]
    assert learned["barrier"] <= 0.02 and learned["mid_acc"] >= 0.9
    assert learned["max_output_diff"] <= 1e-4
    assert abs(learned["loss"][0] - weight["loss"][0]) <= 1e-5
    assert abs(learned["loss"][-1] - weight["loss"][-1]) <= 1e-4


def test_the_comparison_can_fail():
    """Rounding-level changes pass only off the recorded environment; a change the size of a
    behaviour change fails both ways."""
    pins = json.loads(FILE.read_text())["barrier seed"]
    nudged = json.loads(json.dumps(pins))
    nudged["loss"][3] *= 1 + 1e-7
    assert _diffs(pins, nudged) and not _diffs(pins, nudged, exact=False)
    nudged["loss"][3] *= 1 + 1e-3
    assert _diffs(pins, nudged, exact=False)
    nudged = json.loads(json.dumps(pins))
    nudged["loss"] = nudged["loss"][:-1]
    assert _diffs(pins, nudged, exact=False)


def test_the_pins_hold_real_numbers():
    pins = json.loads(FILE.read_text())
    assert pins["barrier learned"]["barrier"] <= 0.02 < 1.0 < pins["barrier weight"]["barrier"]
    assert pins["barrier weight"]["barrier"] < pins["barrier seed"]["barrier"]
    assert pins["barrier seed"]["barrier"] < pins["barrier none"]["barrier"]
    assert len(pins["match weight"]["residual"]["objective"]) > 50
    assert len(pins["barrier seed"]["loss"]) == 21

"""The default pair's results are exactly those pinned in tests/data/pinned.json (see
tests/pinned.py): matching reports (distances, angles, objective history), barrier curves,
RegMean merge and the seeded learned barrier, bit for bit."""

from __future__ import annotations

import json
import math

import pytest
from pinned import FILE, compute


def _diffs(want, got, path="") -> list[str]:
    """Where two JSON values differ (floats compared exactly, NaN equal to NaN)."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}.{k}: missing" for k in want.keys() - got.keys()]
        out += [f"{path}.{k}: new" for k in got.keys() - want.keys()]
        for k in want.keys() & got.keys():
            out += _diffs(want[k], got[k], f"{path}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: length {len(want)} != {len(got)}"]
        return [d for i, (a, b) in enumerate(zip(want, got, strict=True))
                for d in _diffs(a, b, f"{path}[{i}]")]
    if isinstance(want, float) and isinstance(got, float) and math.isnan(want):
        return [] if math.isnan(got) else [f"{path}: nan != {got!r}"]
    return [] if want == got and type(want) is type(got) else [f"{path}: {want!r} != {got!r}"]


@pytest.fixture(scope="module")
def results():
    return compute()


@pytest.mark.parametrize("key", ["match seed", "match weight", "match weight,act",
                                 "barrier none", "barrier seed", "barrier weight",
                                 "merge regmean", "barrier learned"])
def test_default_pair_results_are_pinned(results, key):
    want = json.loads(FILE.read_text())[key]
    diffs = _diffs(want, results[key])
    assert not diffs, f"{len(diffs)} differences, first: {diffs[:5]}"


def test_the_pins_hold_real_numbers():
    pins = json.loads(FILE.read_text())
    assert pins["barrier learned"]["barrier"] < 0.1 < pins["barrier weight"]["barrier"]
    assert pins["barrier weight"]["barrier"] < pins["barrier seed"]["barrier"]
    assert pins["barrier seed"]["barrier"] < pins["barrier none"]["barrier"]
    assert len(pins["match weight"]["residual"]["objective"]) > 50
    assert len(pins["barrier seed"]["loss"]) == 21

"""The rounds record (rotviz.measures.rounds): weight matching replayed round by round, its
first and last rounds the endpoints' own numbers, its animation's frames."""

from __future__ import annotations

import numpy as np
import pytest
from pairs import default_pair, digits

from rotviz.errors import RotvizError
from rotviz.match.endpoints import match_endpoints, unmatched
from rotviz.match.options import MatchOptions
from rotviz.measures import measurement
from rotviz.measures.barrier import curve_on
from rotviz.runner import measure


def test_weight_matching_replayed_round_by_round():
    """Round 0 is the source, the last round the endpoints' matched source: their distances
    and barriers equal those measured on the endpoints directly."""
    a, b = default_pair()
    split = digits().subset(40)
    ends = match_endpoints(a, b, MatchOptions(heads=True, residual=True, rounds=2, tol=0.0))
    r = measure("rounds", ends, split, points=3).to_dict()
    rounds = r["rounds"]
    assert r["phases"] == ends.report.residual["phase_rounds"] == [2, 2]
    assert [(x["phase"], x["round"]) for x in rounds] == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2)]
    assert r["last_round_diff"] == 0.0
    assert rounds[0]["distance"] == pytest.approx(ends.info.distance_before, rel=1e-6)
    assert rounds[-1]["distance"] == pytest.approx(ends.info.distance_after, rel=1e-6)
    assert rounds[-1]["distance"] < rounds[0]["distance"]
    for x, e in ((rounds[0], unmatched(a, b)), (rounds[-1], ends)):
        c = curve_on(e, split, 3)
        assert x["barrier"] == pytest.approx(c.barrier, abs=1e-6)
        np.testing.assert_allclose(x["loss"], c.loss, atol=1e-6)
    fig = measurement("rounds").animate(r)
    assert len(fig.frames) == len(rounds)
    for k, frame in enumerate(fig.frames):
        assert list(frame.data[0].y) == [x["distance"] for x in rounds[: k + 1]]
        assert list(frame.data[1].y) == [x["barrier"] for x in rounds[: k + 1]]
        assert list(frame.data[2].y) == rounds[k]["loss"]
    with pytest.raises(RotvizError, match="--match weight"):
        measure("rounds", match_endpoints(a, b, "seed"), split, points=3)

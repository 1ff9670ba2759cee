"""When weight matching's alternation stops (rotviz.match.alternating): the time limit ends it
at the end of the round that crosses it and returns the lowest state any round reached, a
limit of 0 returns the first round's state, the report's history adds up, and a bad limit is
one line on every command that matches. (The stall rule against the old rule's distances:
tests/test_residual.py on the tiny pairs, tests/test_app_compute.py on the default pair.)"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import view_of

import rotviz.match.alternating as alt
from rotviz.cli import main
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import match_models
from rotviz.match.residual import match_residual
from rotviz.sources.loading import load_model


class _Clock:
    """A clock that moves one second each time the alternation reads it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@pytest.fixture(scope="module")
def llama_pair(saved):
    return load_model(saved("llama", 0)), load_model(saved("llama", 1))


def _totals(out) -> list[float]:
    return out.report.residual["objective"]


def test_time_limit_ends_at_the_round_that_crosses_it(llama_pair, monkeypatch):
    """On a pair the default rule runs longer (11 rounds), a limit crossed during round 3
    (the clock reads 1 s a round) ends it there: the state is exactly the one three capped
    rounds reach (tol and stall off), its distance the lowest of its history, its function
    kept; a limit of 0 returns the first round's state. The history's gains add up to the
    total gain and their shares to 1."""
    monkeypatch.setattr(alt, "_now", _Clock())
    timed = match_models(*llama_pair, MatchOptions(residual=True, time_limit=2.5))
    monkeypatch.undo()
    res = timed.report.residual
    assert res["ended"] == "time" and res["phase_ended"] == ["time"] and res["rounds"] == 3
    assert timed.preserved and timed.report.max_output_diff <= 1e-4
    per_round = [x["objective"] for x in res["history"]]
    assert res["distance_canonical_after"] ** 2 == pytest.approx(min(per_round), rel=1e-12)
    capped = match_models(*llama_pair, MatchOptions(residual=True, rounds=3, tol=0.0,
                                                    stall=0.0))
    assert capped.report.residual["ended"] == "rounds"
    assert _totals(timed) == _totals(capped)
    for k, v in capped.state.items():
        assert torch.equal(timed.state[k], v), k
    # a replay (the rounds record) repeats the timed run's rounds whatever its own clock says
    again = match_residual(view_of(llama_pair[0]), view_of(llama_pair[1]),
                           MatchOptions(residual=True, time_limit=0.0), replay=[3])
    assert again.report.residual["objective"] == _totals(timed)
    assert again.report.residual["ended"] == "time"
    gains = [x["gain"] for x in res["history"]]
    assert abs(sum(gains) - res["gain"]) <= 1e-6 * res["objective"][0]
    assert abs(sum(x["share"] for x in res["history"]) - 1.0) <= 1e-6
    assert res["first_share"] == res["history"][0]["share"] > 0.5

    first = match_models(*llama_pair, MatchOptions(heads=True, residual=True, time_limit=0.0))
    one = match_models(*llama_pair, MatchOptions(residual=True, rounds=1, tol=0.0, stall=0.0))
    r = first.report.residual
    assert r["ended"] == "time" and r["rounds"] == 1 and r["phase_rounds"] == [1]
    assert _totals(first) == _totals(one) and first.preserved
    assert r["first_share"] == pytest.approx(1.0, abs=1e-12)


class _Scripted:
    """A State whose rounds end at scripted objectives (residual map only, a permutation
    stream: one plain step a round); `load` records what it was asked to come back to."""

    def __init__(self, values: list[float]) -> None:
        self.values, self.round, self.loaded = list(values), 0, None

    def initial(self) -> float:
        return 100.0

    def turn(self, group: str, settle: bool):
        self.round += 1
        return torch.eye(2, dtype=torch.float64), self.values[self.round - 1]

    def save(self) -> object:
        return self.round

    def load(self, saved: object) -> None:
        self.loaded = saved

    def agree(self, decision):
        return decision


def test_a_run_returns_its_best_round():
    """A round that ends higher than an earlier one (float32 roundoff, at most, in a real
    run: it gained nothing, so the run has converged) is not what the run returns: the state
    comes back to the lowest round's, and the report says so; the gains still add up to what
    the rounds did. The stall rule and the cap, on scripts of their own."""
    state = _Scripted([50.0, 40.0, 40.5])
    options = MatchOptions(ffn=False, attn=False, rescale=False, residual=True, stall=0.0)
    info = alt.alternate(state, options, "permutation").info
    assert info["ended"] == "converged" and info["rounds"] == 3
    assert state.loaded == 2 and info["restored_best"] is True
    assert info["distance_canonical_after"] == pytest.approx(40.0 ** 0.5, rel=1e-12)
    assert [x["gain"] for x in info["history"]] == [50.0, 10.0, -0.5]
    assert info["gain"] == pytest.approx(59.5, rel=1e-12)
    # the stall rule, on the same script: round 3 gains less than 1% of the total
    state = _Scripted([50.0, 40.0, 39.9, 39.0])
    info = alt.alternate(state, MatchOptions(ffn=False, attn=False, rescale=False,
                                             residual=True, stall=0.01), "permutation").info
    assert info["ended"] == "stalled" and info["rounds"] == 3 and not alt.ended_by_cap(info)
    capped = alt.alternate(_Scripted([50.0, 40.0]), MatchOptions(
        ffn=False, attn=False, rescale=False, residual=True, rounds=2, stall=0.0), "permutation")
    assert capped.info["ended"] == "rounds" and alt.ended_by_cap(capped.info)


def test_time_limit_on_the_command_line(saved, tmp_path, capsys):
    """`match --time-limit 0` runs one round and says so in its last line; a negative or
    non-numeric limit is one line and exit 2 on `match` and on a measurement command (its
    option made from the same record), and a limit with a matching that does not alternate
    is refused before anything is loaded."""
    a, b = str(saved("llama", 0)), str(saved("llama", 1))
    report = tmp_path / "r.json"
    assert main(["match", a, b, "--match", "weight", "--time-limit", "0",
                 "--out", str(tmp_path / "o"), "--report", str(report)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("alternation: 1 round(s)") and "first round 100.0%" in last
    assert last.endswith("ended time: --time-limit was reached")
    rep = json.loads(report.read_text())
    assert rep["residual"]["ended"] == "time" and rep["options"]["time_limit"] == 0.0
    assert rep["max_output_diff"] <= 1e-4
    bad = [(["match", a, b, "--match", "weight", "--out", str(tmp_path / "x"), "--time-limit",
             "-1"], "--time-limit must be a number from 0 to"),
           (["match", a, b, "--match", "weight", "--out", str(tmp_path / "x"), "--time-limit",
             "soon"], "--time-limit must be a number from 0 to"),
           (["barrier", a, b, "--data", "digits", "--match", "weight", "--time-limit", "-5"],
            "--time-limit must be a number from 0 to"),
           (["barrier", a, b, "--data", "digits", "--match", "seed", "--time-limit", "5"],
            "--time-limit limits weight matching's alternation")]
    for argv, fragment in bad:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "x").exists()


def test_time_limit_reaches_a_record_of_several_models(saved, tmp_path, capsys, monkeypatch):
    """A record that makes its own matchings (taskvectors: each fine-tune matched onto the
    first) takes --time-limit from the same parameter record, through its Context: with a
    limit of 0 each of its weight matchings runs one round and ends `time`, its function
    kept. On such a command a bad limit is one line and exit 2, and so is a limit that none
    of its matchings would honour (many --match seed), before any model loads."""
    import rotviz.match.endpoints as ep

    real, seen = ep.match_endpoints, []

    def spy(anchor, source, options=None, *args, **kwargs):
        ends = real(anchor, source, options, *args, **kwargs)
        seen.append((options, ends.report.residual, ends.info.max_output_diff))
        return ends

    monkeypatch.setattr(ep, "match_endpoints", spy)
    base, a, b = (str(saved("llama", s)) for s in (0, 1, 2))
    assert main(["taskvectors", base, a, b, "--match", "weight", "--time-limit", "0"]) == 0
    capsys.readouterr()
    assert len(seen) == 1  # b matched onto a
    options, residual, diff = seen[0]
    assert options.time_limit == 0.0 and options.residual
    assert residual["ended"] == "time" and residual["rounds"] == 1 and diff <= 1e-4
    bad = [(["taskvectors", base, a, b, "--match", "weight", "--time-limit", "-1"],
            "--time-limit must be a number from 0 to"),
           (["many", base, a, b, "--data", "digits", "--match", "seed", "--time-limit", "5"],
            "none of these matchings has one")]
    for argv, fragment in bad:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0], err

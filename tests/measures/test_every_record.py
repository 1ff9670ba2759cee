"""What every registered measurement must do, generated once per record (rotviz.measures):
the command line, the library (`rotviz.measure`) and the app's compute dispatch
(`rotviz.app.run`) give the same numbers, since all three run it through the one runner
(rotviz.runner); where the record runs at size (`--max-memory`), at size equals in memory;
a bad parameter value is one line and exit 2 from the CLI, and a RotvizError from the library.

Each record runs on the zoo's default pair (two digits ViTs) with its smallest settings
(`smallest`: every integer parameter at the low end of its bound, the evaluation batch
kept), so that a new record is covered by adding it and nothing here. A record that takes
other inputs (`Measurement.inputs`) takes the zoo's references for its arguments (`REFS`,
by argument name) and its first two matchings.
"""

from __future__ import annotations

import json
import math

import pytest

from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.measures import Measurement, measurements

A, B = "zoo:vit-digits-s3", "zoo:vit-digits-s6"

# What a record's inputs are, by the name of its argument (rotviz.measures.Inputs.args).
REFS = {"anchor": (A,), "source": (B,), "series_a": ("zoo:vit-digits-run-a",),
        "series_b": ("zoo:vit-digits-run-b",), "spawn_dir": ("zoo:vit-digits-spawn",),
        "series": ("zoo:vit-digits-sgd",),
        "models": (A, B, "zoo:vit-digits-s7"),
        "base": ("zoo:vit-digits-base",),
        "finetuned": ("zoo:vit-digits-ft-a", "zoo:vit-digits-ft-b")}

RECORDS = [m.name for m in measurements()]
AT_SIZE = [m.name for m in measurements() if m.at_size is not None and m.inputs is None]
WITH_PARAMS = [m.name for m in measurements() if m.parameters()]

# Records whose default matching is weight matching's alternation, run for one round in
# every host: a time limit below any round's seconds stops each alternation after its first
# round (the same round everywhere; the limit's rule is tests/test_alternation_stop.py's).
# The rounds record re-runs the alternation after matching: a whole run took 28 s of the
# suite.
ONE_ROUND = 1e-9
ONE_ROUND_RECORDS = {"rounds"}

# Keys that say how long a run took or where it ran, not what it measured.
CLOCK = ("seconds", "timing", "elapsed", "time_s")


def _record(name: str) -> Measurement:
    from rotviz.measures import measurement

    return measurement(name)


def smallest(m: Measurement) -> dict:
    """The record's cheapest settings: each integer parameter at the low end of its bound
    (fewest points, rounds, steps, examples), except the evaluation batch (larger is
    cheaper) and a parameter the defaults leave without effect (the record refuses it: its
    declared `needs`, its own check, its inputs' check); the rest keep their defaults."""
    inputs = None
    if m.inputs is not None and m.inputs.check is not None:
        from rotviz.confine import ANYWHERE

        inputs = m.inputs.read(refs_of(m), specs_of(m), ANYWHERE)
    out: dict = {}
    for p in m.parameters():
        b = p.bound
        if b is None or not b.integer or p.name == "batch_size" or \
                not isinstance(p.default, int) or p.default <= b.lo:
            continue
        trial = {**out, p.name: int(b.lo)}
        try:
            values = m.values(trial)
            if inputs is not None:
                m.inputs.check(inputs, values, set(trial))
        except RotvizError:
            continue
        out = trial
    return out


def refs_of(m: Measurement) -> tuple[str, ...]:
    assert m.inputs is not None
    missing = [a for a, _ in m.inputs.args if a not in REFS]
    assert not missing, f"{m.name}: give REFS a zoo reference for its argument {missing}"
    return tuple(r for a, _ in m.inputs.args for r in REFS[a])


def specs_of(m: Measurement) -> list[str]:
    """A record of inputs: its first two matchings (one for a record that takes one)."""
    assert m.inputs is not None
    return list(m.inputs.default_specs[:1 if m.inputs.one_spec else 2])


def cli_argv(m: Measurement, params: dict) -> list[str]:
    """The record's command on the default pair (or its inputs), with `params` as options."""
    by_name = {p.name: p for p in m.parameters()}
    opts = [x for k, v in params.items() for x in (by_name[k].flag, str(v))]
    if m.inputs is not None:
        specs = [x for sp in specs_of(m) for x in ("--match", sp)]
        data = ["--data", "digits"] if m.data else []  # conserved reads weights only
        return [m.name, *refs_of(m), *data, *specs, "--device", "cpu", *opts]
    models = [A, B] if m.pair else [A]
    data = ["--data", "digits"] if m.data else []
    match = ["--match", m.match_default] if m.pair else []
    if m.name in ONE_ROUND_RECORDS:
        match += ["--time-limit", str(ONE_ROUND)]
    return [m.name, *models, *data, *match, "--device", "cpu", *opts]


def run_cli(argv: list[str], tmp_path, capsys, says: str = "") -> dict:
    """The command's --json, after it exits 0 (and its line `says` what is given)."""
    js = tmp_path / f"{argv[0]}-{len(list(tmp_path.iterdir()))}.json"
    rc = main([*argv, "--json", str(js)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert says in out.out, out.out
    return json.loads(js.read_text())


# The record's command at its smallest settings, by argv: both the first test (against the
# library and the app) and the at-size test (the in-memory side) read it, and it is the same
# run in one process (the same few_examples), so it runs once; each reader gets a fresh copy.
_SMALLEST_CLI: dict[tuple[str, ...], str] = {}


def smallest_cli(argv: list[str], tmp_path, capsys) -> dict:
    """run_cli(argv) once per process (an at-size record's in-memory run at its settings)."""
    key = tuple(argv)
    if key not in _SMALLEST_CLI:
        _SMALLEST_CLI[key] = json.dumps(run_cli(argv, tmp_path, capsys))
    return json.loads(_SMALLEST_CLI[key])


def same(got, want, path: str = "", rel: float = 1e-6, abs_: float = 1e-9) -> None:
    """Every number of `want` in `got`, equal within `rel` (clocks left out): the same
    keys, lists of the same length, the same strings."""
    if isinstance(want, dict):
        assert isinstance(got, dict), path
        for k, v in want.items():
            if any(c in k for c in CLOCK) or k == "device":
                continue
            assert k in got, f"{path}.{k} missing"
            same(got[k], v, f"{path}.{k}", rel, abs_)
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            same(g, w, f"{path}[{i}]", rel, abs_)
    elif isinstance(want, float) and not isinstance(want, bool):
        if isinstance(got, (int, float)) and got == want:  # approx's own first test,
            return  # without building an approx per number (3 CPU-s over the file)
        if math.isnan(want):
            assert isinstance(got, float) and math.isnan(got), path
        else:
            assert got == pytest.approx(want, rel=rel, abs=abs_), path
    else:
        assert got == want, path


N = 48  # test examples every host evaluates on


@pytest.fixture(scope="module", autouse=True)
def few_examples():
    """Every host reads the test split through rotviz.data.reading.split_for (the CLI's
    commands, the app's splits): here its first N examples, so that each record runs in
    seconds; the library is given the same."""
    import rotviz.data.reading as reading

    read = reading.split_for

    def first(*args, **kwargs):
        s = read(*args, **kwargs)
        return s.subset(N) if s.split == "test" and N < s.n else s

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reading, "split_for", first)
        yield


@pytest.fixture(scope="session")
def split():
    from rotviz.data.split import load_split

    return load_split("digits", "test", 0).subset(N)


@pytest.fixture(scope="session")
def ends():
    """The default pair matched once per SPEC (one model twice, unmatched, for `one`)."""
    from rotviz.match.endpoints import match_endpoints
    from rotviz.match.options import limited
    from rotviz.match.selection import match_options
    from rotviz.sources.plain_torch import load_for_eval

    cache: dict = {}

    def get(spec: str, one: bool = False, limit: float | None = None):
        if (spec, one, limit) not in cache:
            a = load_for_eval(A)
            options = "none" if one else limited(match_options(spec), limit)
            cache[spec, one, limit] = match_endpoints(a, a if one else load_for_eval(B),
                                                      options)
        return cache[spec, one, limit]

    return get


@pytest.fixture(scope="session")
def res():
    from rotviz import app

    return app.Resources()


BASE = {"anchor": A, "source": B, "data": "digits", "seed": 0, "n_eval": 0, "device": "cpu"}


def run_library(m: Measurement, params: dict, ends, split) -> dict:
    from rotviz import measure

    if m.inputs is not None:
        return measure(m.name, list(refs_of(m)), split, match=specs_of(m), **params).to_dict()
    return measure(m.name, ends(m.match_default, not m.pair, _limit(m)),
                   split if m.data else None, **params).to_dict()


def _limit(m: Measurement) -> float | None:
    return ONE_ROUND if m.name in ONE_ROUND_RECORDS else None


def run_app(m: Measurement, params: dict, res) -> dict:
    from rotviz import app

    if m.inputs is not None:
        return app.run(m.name, res, app.inputs_cfg(BASE, list(refs_of(m)), specs_of(m),
                                                   **params))
    cfg = app.measure_cfg(BASE, m.match_default if m.pair else "none", **params)
    if _limit(m) is not None:
        cfg["match_time"] = _limit(m)  # the sidebar's time budget
    return app.run(m.name, res, cfg if m.pair else {**cfg, "ref": A})


@pytest.mark.parametrize("name", RECORDS)
def test_the_cli_the_library_and_the_app_give_the_same_numbers(name, ends, split, res,
                                                               tmp_path, capsys):
    m = _record(name)
    params = smallest(m)
    cli = smallest_cli(cli_argv(m, params), tmp_path, capsys)
    lib = run_library(m, params, ends, split)
    got = run_app(m, params, res)
    same(cli, lib)
    same(got, lib)
    if m.inputs is None:  # the app adds the matched source's function check: the library's
        info = ends(m.match_default, not m.pair, _limit(m)).info
        assert got["max_output_diff"] == info.max_output_diff and got["preserved"]
        assert got["match"] == info.match


@pytest.mark.parametrize("name", AT_SIZE)
def test_at_size_equals_in_memory(name, tmp_path, capsys):
    """`--max-memory 0` (the pair matched and measured at size) gives the in-memory result:
    the same keys, strings and integers, numbers to 1e-5 (float32 round-off: the streamed
    match writes float32 files and sums run in another order), and says how it ran."""
    m = _record(name)
    settings = smallest(m)
    if name == "fusion":  # at size it leaves the methods that need statistics `off`: compare
        from rotviz.merging import methods  # the ones that run at size (and need no base)

        settings = {"methods": ",".join(x.name for x in methods()
                                        if x.at_size and not x.needs_base)}
    argv = cli_argv(m, settings)
    held = smallest_cli(argv, tmp_path, capsys)
    says = m.at_size_how.strip() if m.summary is not None else ""  # the line says how
    sized = run_cli([*argv, "--max-memory", "0"], tmp_path, capsys, says)
    assert sized.pop("held_bytes", 1) > 0
    clocks = {k for k in (*held, *sized) if any(c in k for c in CLOCK)}
    assert set(held) - clocks == set(sized) - clocks
    same(sized, held, rel=1e-5, abs_=1e-5)


def bad_value(m: Measurement) -> tuple[str, str, object]:
    """(the parameter, its bad command-line text, its bad value) of the record's first
    bounded or chosen parameter: just over its bound, or a choice it does not offer."""
    for p in m.parameters():
        if p.bound is not None:
            over = p.bound.hi + 1
            return p.name, f"{over:g}", over
        if p.choices:
            return p.name, "nope", "nope"
    raise AssertionError(f"{m.name} has no bounded parameter")


@pytest.mark.parametrize("name", WITH_PARAMS)
def test_a_bad_value_is_one_line_and_exit_2(name, ends, split, capsys):
    m = _record(name)
    param, text, value = bad_value(m)
    flag = next(p.flag for p in m.parameters() if p.name == param)
    argv = cli_argv(m, {})
    rc = main([*argv, flag, text])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and flag in err, err
    from rotviz import measure

    with pytest.raises(RotvizError, match=flag):
        if m.inputs is not None:
            measure(name, list(refs_of(m)), split, match=specs_of(m), **{param: value})
        else:
            # the endpoints the first test uses (one alternation round for `rounds`, whose
            # whole alternation cost seconds here): a bad value is refused before they are read
            measure(name, ends(m.match_default, not m.pair, _limit(m)), split,
                    **{param: value})

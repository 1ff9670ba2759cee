"""Every CLI option that takes a number, a path or a name, fed every kind of bad value:
exit 2, exactly one stderr line, no traceback, nothing written and nothing deleted.

The table is read off the parser itself, so an option added without a row here fails
`test_every_option_has_a_row`.
"""

from __future__ import annotations

import argparse
import importlib.abc
import math
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import refused, workspace

from rotviz.cli import build_parser
from rotviz.measures import measurements
from rotviz.merging import all_params, users

A, B = "zoo:vit-digits-s3", "zoo:vit-digits-s6"
MEASURES = {m.name: m for m in measurements()}  # one command each (rotviz.cli.measure)

# The zoo's series and spawn folder, for the records whose inputs they are (training, spawn).
SERIES = {"series_a": "zoo:vit-digits-run-a", "series_b": "zoo:vit-digits-run-b",
          "spawn_dir": "zoo:vit-digits-spawn", "series": "zoo:vit-digits-sgd"}


def _inputs(m) -> list[str]:
    if m.inputs is not None and m.inputs.least:  # N models (many)
        return [A, B, "zoo:vit-digits-s7"]
    if m.inputs is not None:  # series, a spawn folder, or a pair (ladder)
        return [SERIES.get(name) or {"anchor": A, "source": B}[name] for name, _ in m.inputs.args]
    return [A, *([B] if m.pair else [])]


# What each command needs besides the option under test, so that only that option is wrong.
BASE = {
    "match": ["match", A, B, "--out", "o"],
    **{n: [n, *_inputs(m), *(["--data", "digits"] if m.data else [])]
       for n, m in MEASURES.items()},
    "eval": ["eval", A, "--data", "digits"],
    "zoo build": ["zoo", "build", "vit-digits-ft-b"],
    "serve": ["serve", "--print-command"],
    "figures": ["figures", "--out", "o", "--only", "fig4_distances"],
}
# Options that only mean something with another one.
WITH = {
    ("match", "--rounds"): ["--residual"], ("match", "--tol"): ["--residual"],
    ("match", "--residual-group"): ["--residual"],
    ("match", "--steps"): ["--learned", "--data", "digits"],
    ("barrier", "--seed"): ["--repeats", "2"],
    **{("merge", p.flag): ["--method", users(p.name)[0]] for p in all_params()},
    ("merge", "--base"): ["--method", "task_arithmetic"],
    **{("merge_sweep", p.flag): ["--method", users(p.name)[0]] for p in all_params()},
    ("merge_sweep", "--base"): ["--method", "task_arithmetic"],
    **{("many", p.flag): ["--method", users(p.name)[0]] for p in all_params()},
    ("many", "--base"): ["--method", "task_arithmetic"],
    # slice's second model and the options that use it
    ("slice", "--source"): ["--around", "source"],
    **{("slice", o): ["--source", B, "--around", "matched"] for o in ("--match", "--layers")},
    ("slice", "--alpha"): ["--source", B, "--around", "path"],
    ("slice", "--merge"): ["--source", B, "--around", "merged"],
    ("slice", "--toward"): ["--source", B, "--directions", "toward"],
}

NUMBERS = ["abc", "-5", "0", "nan", "inf", "-inf", "1e400", "99999999999999999999", "1.5", ""]
# Every bounded option parses through one function (rotviz.limits.Bound.parse). The values
# whose refusal depends on the option's own bound (below it, above it, not a whole number) are
# fed to every option, with "abc" and "nan" (a plain int or float type would take "nan"); the
# values refused by their shape alone (infinities, overflow, empty) to the options of FULL.
PER_OPTION = {"abc", "-5", "0", "nan", "99999999999999999999", "1.5"}
# kinds of path and name options -> their bad values (the workspace: f.txt is a file, full/ a
# folder holding a user's file, link a symbolic link, /proc refuses new entries)
PATHS = {
    "out folder": ["f.txt", "full", "/proc/x/o", "f.txt/sub", "link", "", "."],
    "out file": ["f.txt", "full", "/proc/x/r.json", "f.txt/r.json", "link", ""],
    # --figure: the suffix names the format; a user's file is never replaced
    "figure": ["x.jpg", "f.txt", "/proc/x/r.png", "f.txt/r.svg", "link", "", "noext"],
    # --animation: the same rules, its own suffixes (.html, .gif, .mp4)
    "animation": ["x.avi", "f.txt", "/proc/x/r.gif", "f.txt/r.mp4", "link", "", "noext"],
    "zoo out": ["f.txt", "zoofull", "/proc/x", "f.txt/sub", ""],  # NAME folders go under it
    "model": ["f.txt", "full", "/proc/x/m", "f.txt/m", "", "zoo:nope", "nope:x"],
    "series": ["f.txt", "full", "/proc/x/m", "f.txt/m", "", "zoo:nope", "nope:x",
               "zoo:vit-digits-s3", "hf-cache:nope", "hf-cache:../x"],
    "data": ["imagefolder:f.txt", "imagefolder:full", "text:/proc/x/t", "text:f.txt/x",
             "cifar10:full", "imagefolder:", "", "nope"],
    "roots": ["f.txt", "/proc/x", "f.txt/x", ""],
    "layers": ["a-b", "-1", "nan", "inf", "0-99999999999", "3-1", "", "1.5", "0," * 120],
    "name": ["nope", "", "-5", "nan"],
    # passthrough's layer ranges: a model letter it does not know, a range past the models'
    # depth, an empty or reversed range, no range ("" is the default split)
    "slices": ["x:0-1", "a:0-99", "a:2-2", "b:3-1", "a"],
    "spec": ["nope", "ffn,nope", "-5", "nan"],  # "" is a SPEC: none
    # column names: empty, or given for data without columns (the commands' digits)
    "column": ["", " ", "nope", "text"],
    "size": ["abc", "-5", "12XB", "nan", "inf", "1e400", "", "5 G B", "99999999999TB"],
    # MODEL=FOLDER: no '=', a bad model, a model of another architecture, a bad folder
    "also": ["nope", "=m", "zoo:vit-digits-s6-ft=", "f.txt=m", "zoo:nope=m",
             "zoo:gpt2-pystdlib-s0=m", "zoo:vit-digits-s6-ft=f.txt",
             "zoo:vit-digits-s6-ft=full", "zoo:vit-digits-s6-ft=o",
             "zoo:vit-digits-s6-ft=/proc/x/m", "zoo:vit-digits-s6-ft=link"],
}
KINDS = {
    ("match", "anchor"): "model", ("match", "source"): "model", ("match", "--out"): "out folder",
    ("match", "--report"): "out file", ("match", "--data"): "data",
    ("match", "--layers"): "layers", ("match", "--residual-group"): "name",
    ("match", "--device"): "name", ("match", "--max-memory"): "size",
    ("match", "--match"): "spec", ("match", "--also"): "also",
    ("eval", "model"): "model", ("eval", "--json"): "out file", ("eval", "--data"): "data",
    ("eval", "--split"): "name", ("eval", "--device"): "name",
    **{(n, "--out"): "out folder" for n, m in MEASURES.items() if m.writes_model},
    ("merge", "--method"): "name", ("teleport", "--group"): "name",
    **{(c, "--slices"): "slices" for c in ("merge", "merge_sweep", "fusion")},
    ("merge", "--stats-split"): "name", ("merge", "--base"): "model",
    ("merge", "--mergekit-config"): "out file",
    ("merge_sweep", "--stats-split"): "name", ("merge_sweep", "--base"): "model",
    ("many", "--stats-split"): "name", ("many", "--base"): "model",
    ("fusion", "--methods"): "name", ("fusion", "--base"): "model",
    ("fusion", "--stats-split"): "name",
    **{("merge", p.flag): "name" for p in all_params() if p.choices},
    **{(n, p.flag): "name" for n, m in MEASURES.items() for p in m.parameters() if p.choices},
    ("zoo build", "names"): "name", ("zoo build", "--out"): "zoo out",
    ("serve", "--roots"): "roots",
    ("figures", "--out"): "out folder", ("figures", "--only"): "name",
    ("figures", "--anchor"): "model", ("figures", "--source"): "model",
    ("figures", "--data"): "data", ("figures", "--device"): "name",
    **{(c, f): "column" for c in ("match", *MEASURES, "eval")
       for f in ("--text-column", "--pair-column", "--label-column", "--words-column",
                 "--tags-column")},
    **{(c, o): k for c in MEASURES
       for o, k in (("anchor", "model"), ("source", "model"), ("--data", "data"),
                    ("--json", "out file"), ("--figure", "figure"),
                    ("--animation", "animation"),
                    ("--layers", "layers"), ("--match", "spec"),
                    ("--split", "name"), ("--device", "name"), ("--max-memory", "size"),
                    ("model", "model"), ("--source", "model"))},  # one model (pair=False)
    **{(c, o): "series" for c, m in MEASURES.items() if m.inputs is not None
       for o, _ in m.inputs.args if o in SERIES},  # series and spawn folders (training, spawn)
    ("trajectory", "--with"): "series",  # its second series, an option
    ("teleport_train", "--group"): "name",  # a comma list of symmetry groups
    **{(c, m.inputs.args[-1][0]): "model" for c, m in MEASURES.items()
       if m.inputs is not None and m.inputs.least},  # N models (many): the first replaced
    ("taskvectors", "base"): "model",  # the base before its fine-tunes
}
FREE = {("serve", "--address"),  # any text is a host name for streamlit to bind
        ("taskvectors", "--skip")}  # any text is a comma list of name patterns


def _commands(parser: argparse.ArgumentParser, prefix: str = ""):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prefix} {name}".strip())
            return
    yield prefix, parser


def _options():
    """(command, option, action) for every option that takes a value."""
    for cmd, parser in _commands(build_parser()):
        for a in parser._actions:
            if a.nargs == 0 or isinstance(a, argparse._SubParsersAction):
                continue
            yield cmd, (a.option_strings[0] if a.option_strings else a.dest), a


# Every bad value of the options that all measurement commands share (models, data, outputs,
# columns, devices: one generator in rotviz.cli.measure) is fed to one command of each kind of
# input (a pair, one model, two series); the other measurement commands get the first bad
# value of each shared option, which shows that they take it through the same checks, and
# every bad value of their own record's parameters.
FULL = {"barrier", "hessian", "training"}
# The merge options (--method, --base and every merge method's parameters: one generator in
# rotviz.measures.merge) likewise get every bad value on `merge`, the first elsewhere.
MERGE_OPTIONS = {p.flag for p in MEASURES["merge"].parameters()}


def _own(cmd: str, opt: str) -> bool:
    """Whether `opt` is checked in full on `cmd`: not a measurement's shared option, or a
    command of FULL, or a parameter of the command's own record (the merge options: on
    merge only)."""
    if cmd == "figures" and opt in ("--anchor", "--source", "--data"):
        return False  # read by the same loaders as every measurement's (in full on FULL)
    m = MEASURES.get(cmd)
    if m is not None and cmd != "merge" and opt in MERGE_OPTIONS:
        return False
    return m is None or cmd in FULL or opt in {p.flag for p in m.parameters()}


def _cases():
    for cmd, opt, action in _options():
        bound = getattr(action.type, "bound", None)
        if bound is not None:
            bad = []
            for v in NUMBERS:
                try:
                    ok = math.isfinite(float(v)) and bound.lo <= float(v) <= bound.hi and (
                        not bound.integer or float(v).is_integer())
                except ValueError:
                    ok = False
                if not ok:
                    bad.append(v)
            if not _own(cmd, opt):
                bad = bad[:1]
            elif cmd not in FULL:
                bad = [v for v in bad if v in PER_OPTION]
            for v in bad:
                yield pytest.param(cmd, opt, v, id=f"{cmd}-{opt}-{v or 'empty'}")
        elif (cmd, opt) in KINDS:
            values = PATHS[KINDS[cmd, opt]]
            for v in values if _own(cmd, opt) else values[:1]:
                yield pytest.param(cmd, opt, v, id=f"{cmd}-{opt}-{v[:20] or 'empty'}")


def _argv(cmd: str, opt: str, value: str) -> list[str]:
    base = list(BASE[cmd])
    if not opt.startswith("--"):  # a positional: replace the model or the zoo name
        if cmd == "zoo build":
            return ["zoo", "build", value]
        i = {"anchor": 1, "source": 2, "model": 1, "series_a": 1, "series_b": 2,
             "spawn_dir": 1, "models": 1, "series": 1, "base": 1, "finetuned": 2}[opt]
        base[i] = value
        return base
    if opt in base:  # --out or --data: replace its value
        base[base.index(opt) + 1] = value
        return base + WITH.get((cmd, opt), [])
    return base + WITH.get((cmd, opt), []) + [f"{opt}={value}"]


def test_every_option_has_a_row():
    missing = [(c, o) for c, o, a in _options()
               if getattr(a.type, "bound", None) is None and (c, o) not in KINDS
               and (c, o) not in FREE]
    assert not missing, f"options without bad values in the table: {missing}"
    assert len(list(_cases())) > 200
    assert {c for c, _, _ in _options()} >= FULL


@pytest.fixture(scope="module")
def ws_full(tmp_path_factory):
    """conftest's `workspace` and zoofull/, made once for the module and the current folder
    while its tests run: each refusal checks that it wrote and removed nothing there, so
    every case meets the same workspace (one that changes it fails itself). A new one for
    each of the 1,600 cases cost about 4 ms of CPU each."""
    d = workspace(tmp_path_factory.mktemp("ws"))
    (d / "zoofull" / "vit-digits-ft-b").mkdir(parents=True)
    (d / "zoofull" / "vit-digits-ft-b" / "keep.txt").write_text("a user's file")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        yield d


@pytest.mark.parametrize(("cmd", "opt", "value"), list(_cases()))
def test_bad_value(ws_full, capfd, cmd, opt, value):
    refused(_argv(cmd, opt, value), capfd, ws_full)


@contextmanager
def _unimportable(*packages: str):
    """While inside, importing `packages` raises ImportError, even where an earlier test
    imported them (their modules are set aside, and put back after)."""

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in packages:
                raise ImportError(f"{name} imported")

    aside = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] in packages}
    refuse = Refuse()
    sys.meta_path.insert(0, refuse)
    try:
        yield
    finally:
        sys.meta_path.remove(refuse)
        sys.modules.update(aside)


def test_the_base_commands_are_valid(ws, capfd):
    """The rows above fail because of their one bad value: the same commands with good values
    pass (the cheap ones are run; the rest differ from them only in the option under test).
    On the default pair, matching (writing the matched model), a measurement and eval run
    without transformers (rotviz.sources.plain_torch, rotviz.sources.plain: seconds of start-up
    less)."""
    assert build_parser().parse_args(BASE["match"]).out == "o"
    from rotviz.cli import main

    assert main(BASE["serve"]) == 0
    with _unimportable("transformers"):
        assert main(["match", A, B, "--out", "o", "--no-attn", "--layers", "0-1",
                     "--report", "r.json"]) == 0
        assert main(["distances", A, B, "--layers", "0", "--json", "d.json"]) == 0
        assert main(["eval", A, "--data", "digits", "--json", "e.json",
                     "--batch-size", "65536"]) == 0
    assert Path("o/config.json").is_file() and Path("e.json").is_file()
    capfd.readouterr()

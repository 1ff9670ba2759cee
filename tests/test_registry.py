"""The symmetry registry is the one list: everything that used to keep its own list of
symmetries reads it, and every record's action, solver and draw exist."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest

from rotviz.app.specs import WHY_UNCHANGED
from rotviz.cli import build_parser
from rotviz.errors import RotvizError
from rotviz.match.options import MatchOptions
from rotviz.match.selection import Selection, parse_selection
from rotviz.plots.style import nice_label
from rotviz.symmetry.actions import random_transform
from rotviz.symmetry.registry import BY_NAME, SHORTHANDS, SYMMETRIES

HOMES = {"actions": "rotviz.symmetry.actions", "residual": "rotviz.symmetry.residual",
         "groups": "rotviz.groups", "layer_solvers": "rotviz.match.layer_solvers",
         "datamatch": "rotviz.match.datamatch", "learned": "rotviz.match.learned"}


def _resolve(ref: str):
    home, name = ref.split(".")
    return getattr(importlib.import_module(HOMES[home]), name)


@pytest.mark.parametrize("sym", SYMMETRIES, ids=lambda s: s.name)
def test_every_record_names_real_functions(sym):
    for ref in [r.strip() for r in f"{sym.action},{sym.solver}".split(",") if r.strip()]:
        assert callable(_resolve(ref)), ref
    assert sym.solver, "every symmetry has a solver"
    if sym.scope == "layer":
        assert sym.draw in inspect.signature(random_transform).parameters
    elif sym.draw:
        assert callable(_resolve(sym.draw))
    assert sym.scope in ("layer", "stream") and all(r in BY_NAME for r in sym.requires)
    assert sym.why.endswith(".") and "\n" not in sym.help


def test_match_options_selection_and_labels_come_from_the_registry():
    names = [s.name for s in SYMMETRIES]
    opts = {f.name: f for f in dataclasses.fields(MatchOptions)}
    assert names == list(opts)[: len(names)]
    assert {n: opts[n].default for n in names} == {s.name: s.default for s in SYMMETRIES}
    assert [f.name for f in dataclasses.fields(Selection)] == names
    assert set(WHY_UNCHANGED) == set(names)
    assert all(nice_label(s.name) == s.label for s in SYMMETRIES)
    assert MatchOptions().label == ",".join(SHORTHANDS["seed"])
    assert parse_selection("weight").flags == SHORTHANDS["weight"]
    with pytest.raises(TypeError):  # keyword-only: no positional flags
        MatchOptions(True)


def test_cli_has_one_flag_per_symmetry_with_its_default():
    """One --x flag per symmetry; without --match or the flag, the registry's default."""
    from rotviz.cli import _selected

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["match"]
    flags = {a.dest: a for a in sub._actions}
    args = parser.parse_args(["match", "a", "b", "--out", "o"])
    _selected(args)
    for s in SYMMETRIES:
        assert f"--{s.name}" in flags[s.name].option_strings
        assert getattr(args, s.name) == s.default


def test_match_takes_a_spec_and_the_flags_override_it():
    from rotviz.cli import _selected

    parser = build_parser()
    args = parser.parse_args(["match", "a", "b", "--out", "o", "--match", "weight",
                              "--no-residual", "--act"])
    _selected(args)
    on = {s.name for s in SYMMETRIES if getattr(args, s.name)}
    assert on == {"ffn", "attn", "rescale", "heads", "act"}
    with pytest.raises(RotvizError, match="--match none matches nothing"):
        _selected(parser.parse_args(["match", "a", "b", "--out", "o", "--match", "none"]))


@pytest.mark.parametrize("sym", [s for s in SYMMETRIES if s.requires], ids=lambda s: s.name)
def test_requirements_are_enforced(sym):
    for r in sym.requires:
        with pytest.raises(RotvizError, match=rf"\({sym.name}\) needs .* \({r}\)"):
            MatchOptions(**{sym.name: True, r: False})


def test_random_element_refuses_an_unknown_draw(loaded):
    from conftest import view_of

    dims = view_of(loaded("bert")).dims
    with pytest.raises(RotvizError, match="no random draw for bogus"):
        from rotviz.symmetry.actions import random_element

        random_element(dims, 0, bogus=True)

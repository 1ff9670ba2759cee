"""Matching strings (selections): parsing, canonical labels, later options, one-line errors."""

from __future__ import annotations

import dataclasses

import pytest

from rotviz.errors import RotvizError
from rotviz.match.options import MatchOptions
from rotviz.match.selection import (
    FLAGS,
    Selection,
    label_of,
    match_options,
    parse_selection,
    selection_of,
)
from rotviz.symmetry.registry import DATA_SOLVERS

OPTION_FIELDS = {f.name for f in dataclasses.fields(MatchOptions)}


@pytest.mark.parametrize("text", ["none", " none ", "NONE", None])
def test_none_means_no_matching(text):
    spec = parse_selection(text)
    assert spec.is_none and spec.label == "none" and spec.flags == ()
    assert match_options(text) is None


@pytest.mark.parametrize(
    "text, flags, label",
    [
        ("ffn", ("ffn",), "ffn"),
        ("attn", ("attn",), "attn"),
        ("ffn,attn", ("ffn", "attn"), "ffn,attn"),
        ("attn, FFN", ("ffn", "attn"), "ffn,attn"),  # order, case and spaces do not matter
        ("seed", ("ffn", "attn", "rescale"), "seed"),
        ("ffn,attn,rescale", ("ffn", "attn", "rescale"), "seed"),
        ("seed,rescale,ffn", ("ffn", "attn", "rescale"), "seed"),
        ("attn,rescale", ("attn", "rescale"), "attn,rescale"),
    ],
)
def test_parse_and_canonical_label(text, flags, label):
    spec = parse_selection(text)
    assert spec.flags == flags
    assert spec.label == label
    assert parse_selection(spec.label) == spec  # the label parses back to the same spec
    opts = spec.options()
    on = tuple(f in flags for f in ("ffn", "attn", "rescale"))
    assert (opts.ffn, opts.attn, opts.rescale) == on
    assert opts.layers is None


def test_options_carry_layers_and_round_trip():
    opts = match_options("seed", layers=(0, 2))
    assert opts == MatchOptions(ffn=True, attn=True, rescale=True, layers=(0, 2))
    assert selection_of(opts) == parse_selection("seed")
    assert label_of(opts) == "seed"
    assert label_of(MatchOptions(ffn=True, attn=False, rescale=False)) == "ffn"
    assert label_of(None) == "none"


@pytest.mark.parametrize("text", ["ffn,foo", "rotate", "ffn;attn", "none,ffn"])
def test_unknown_names_are_one_line_errors_listing_valid_ones(text):
    with pytest.raises(RotvizError) as e:
        parse_selection(text)
    msg = str(e.value)
    assert "\n" not in msg
    for name in ("ffn", "attn", "rescale", "seed", "none"):
        assert name in msg


@pytest.mark.parametrize("name", FLAGS)
def test_every_flag_reaches_match_options(name):
    spec = parse_selection(f"seed,{name}")
    assert getattr(spec, name) and spec.ffn and spec.attn and spec.rescale
    assert parse_selection(spec.label) == spec  # the canonical label reads back the same
    assert getattr(spec.options(), name) is True


def test_weight_is_everything_data_free():
    spec = parse_selection("weight")
    assert spec.flags == ("ffn", "attn", "rescale", "heads", "residual")
    assert spec.label == "weight"
    assert parse_selection("weight,learned").label == "weight,learned"
    assert parse_selection("seed,heads,residual").label == "weight"
    assert parse_selection("seed,residual").label == "seed,residual"


@pytest.mark.parametrize("name", DATA_SOLVERS)
def test_a_data_solver_alone_starts_from_weight_matching(name):
    """... and learned matching alone from activation matching (which starts from weight's
    maps): a third of weight matching's barrier on the default pair, at a tenth of its cost."""
    assert parse_selection(name).label == {"act": "weight,act",
                                           "learned": "weight,act,learned"}[name]
    assert parse_selection(f"seed,{name}").label == f"seed,{name}"  # a named start is kept
    assert selection_of(parse_selection(name).options()) == parse_selection(name)
    assert parse_selection(name).options().needs_data


def test_spec_fields_cover_every_flag():
    assert {f.name for f in dataclasses.fields(Selection)} == set(FLAGS)


def test_non_string_spec_is_an_error():
    with pytest.raises(RotvizError):
        parse_selection(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "  ", ",", " , "])
def test_an_empty_spec_is_refused_not_taken_as_none(text):
    """An empty SPEC was read as none, so a user who meant to match measured an unmatched
    pair; it is one line now, wherever a SPEC is parsed."""
    with pytest.raises(RotvizError, match=r"^empty matching SPEC '.*': use none, or a comma"):
        match_options(text)


def test_empty_match_and_sweeps_without_matching_are_refused_before_loading(capfd, ws):
    """Every command's --match goes through the one parser; sweeps, which varies the layers
    matched, refuses --match none through its record's match_check
    (models that do not exist: a refusal after loading would name them instead)."""
    from conftest import refused

    for argv in (["barrier", "nosuch-a", "nosuch-b", "--data", "digits"],
                 ["match", "nosuch-a", "nosuch-b", "--out", "never"]):
        refused([*argv, "--match", ""], capfd, ws, "empty matching SPEC ''")
    refused(["sweeps", "nosuch-a", "nosuch-b", "--data", "digits", "--match", "none"], capfd,
            ws, "sweeps varies which layers are matched, and --match none matches none")

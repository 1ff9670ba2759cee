"""Issue 43, deliverables 4 and 5: refusals that say what is actually wrong, and come before
any model or data is read. Each case is one line with exit 2 (conftest.refused: nothing
written); the early ones also assert, through the one reader's open (rotviz.confine), that
no weights file was opened and no split was read."""

from __future__ import annotations

import re

import pytest
from conftest import refused

from rotviz.cli import main

A, B, C = "zoo:vit-digits-s3", "zoo:vit-digits-s6", "zoo:vit-digits-s7"
FT_A, FT_B, BASE = "zoo:vit-digits-ft-a", "zoo:vit-digits-ft-b", "zoo:vit-digits-base"


@pytest.fixture
def reads(monkeypatch):
    """What the command read: every file opened through the one reader (by what it is
    called: "weights file", "config", ...) and every split loaded. Observed by wrapping
    the reader's own open, so no counter lives in rotviz itself."""
    import rotviz.data.split
    from rotviz.confine import Confined

    seen: dict[str, list] = {"opened": [], "splits": []}
    real_open, real_split = Confined.open, rotviz.data.split.load_split

    def open_(self, path, what="file"):
        seen["opened"].append(what)
        return real_open(self, path, what)

    def load_split(*a, **k):
        seen["splits"].append(a[0] if a else k.get("ref"))
        return real_split(*a, **k)

    monkeypatch.setattr(Confined, "open", open_)
    monkeypatch.setattr(rotviz.data.split, "load_split", load_split)
    return seen


def test_the_reads_fixture_sees_a_weights_file_opened(reads):
    """The observation itself works: loading a zoo model opens its weights through it."""
    from rotviz.sources.loading import load_model

    load_model(A)
    assert "weights file" in reads["opened"]


def _nothing_loaded(reads) -> None:
    assert "weights file" not in reads["opened"], reads["opened"]
    assert reads["splits"] == []


@pytest.mark.parametrize("argv, words", [
    (["rounds", A, B, "--data", "digits", "--animation", "x.avi"],
     "--animation x.avi: name the file .html, .gif or .mp4"),
    (["many", A, B, C, "--data", "digits", "--match", "none"],
     "aligning many models needs a matching: give a SPEC such as seed or weight, not none"),
    (["figures", "--out", "figs", "--data", "nosuch", "--no-png"], "unknown data 'nosuch'"),
    (["merge_sweep", FT_A, FT_B, "--data", "digits", "--method", "ties", "--base", BASE,
      "--param", "density", "--start", "-1"],
     "--start -1 is outside --density's range: sweeping density, --start and --stop must "
     "each be a number from 0 to 1 (see rotviz merge_sweep --help)"),
    (["merge_sweep", A, B, "--data", "digits", "--stop", "1.5"],
     "--stop 1.5 is outside --weight's range"),
    (["merge", A, B, "--data", "nosuch"], "unknown data 'nosuch'"),
    (["merge", A, B, "--data", "text:"], "'text:' names no path: write text:PATH"),
])
def test_refused_before_any_model_or_data_is_read(argv, words, reads, ws, capfd):
    refused(argv, capfd, ws, words)
    _nothing_loaded(reads)


def test_a_source_that_is_the_model_itself_is_named_so(reads, ws, capfd):
    """Not "add --source" when --source was given: the problem is that it is the model."""
    err = refused(["slice", A, "--source", A, "--directions", "toward", "--data", "digits"],
                  capfd, ws, f"--source '{A}' is the model itself; --directions toward needs "
                             "a different model of the same architecture")
    assert "add --source" not in err
    _nothing_loaded(reads)


def test_a_source_folder_that_resolves_to_the_model_is_the_model(reads, ws, capfd):
    from rotviz.sources.loading import resolve_ref

    (ws / "same").symlink_to(resolve_ref(A))
    refused(["slice", A, "--source", "same", "--around", "source", "--data", "digits"],
            capfd, ws, "--source 'same' is the model itself; --around source needs")
    _nothing_loaded(reads)


def test_many_offers_no_method_that_takes_two_models(reads, ws, capfd):
    """A method whose max_models is below the models many needs (slerp's 2) is not in many's
    --method choices (nor its help) and is refused at parse time, before any alignment."""
    from rotviz.match.many import MIN_MODELS
    from rotviz.measures.many import LEAST, MANY
    from rotviz.merging import methods

    assert LEAST == MIN_MODELS == MANY.inputs.least
    few = [m.name for m in methods() if m.max_models is not None and m.max_models < LEAST]
    assert "slerp" in few
    method = next(p for p in MANY.parameters() if p.name == "method")
    assert not set(few) & set(method.choices)
    assert "simple" in method.choices
    for name in few:
        err = refused(["many", A, B, C, "--data", "digits", "--method", name], capfd, ws,
                      f"unknown --method '{name}'")
        assert "(see rotviz many --help)" in err
    _nothing_loaded(reads)
    assert main(["many", "--help"]) == 0
    out = " ".join(capfd.readouterr().out.split())
    # slerp as a word: nuslerp (two models) is not offered either, multislerp (N) is
    assert "the curve's merge: simple," in out and not re.search(r"\b(nu)?slerp\b", out)
    assert "multislerp" in out


def test_an_output_on_a_device_is_not_called_a_file(ws, capfd):
    refused(["figures", "--out", "/dev/full", "--no-png"], capfd, ws,
            "--out '/dev/full' is a device, not a folder; give a folder path")
    refused(["eval", A, "--data", "digits", "--json", "/dev/full"], capfd, ws,
            "--json '/dev/full' is a device, not a regular file")


@pytest.mark.parametrize("argv, flag, path", [
    (["eval", A, "--data", "digits", "--json", "nod/x.json"], "--json", "nod/x.json"),
    (["rounds", A, B, "--data", "digits", "--animation", "nod/a.html"], "--animation",
     "nod/a.html"),
    (["merge", A, B, "--data", "digits", "--mergekit-config", "nod/deeper/mk.yaml"],
     "--mergekit-config", "nod/deeper/mk.yaml"),
])
def test_a_file_output_in_a_missing_folder_is_refused(argv, flag, path, reads, ws, capfd):
    """Not made without a word: a typo in the folder is refused, in one line, early."""
    refused(argv, capfd, ws, f"{flag} '{path}' lies in '", "which does not exist; create "
            "that folder first, or give a path in an existing one")
    assert not (ws / "nod").exists()
    _nothing_loaded(reads)


@pytest.mark.parametrize("name", ["mk.txt", "mk", "mk.yaml.bak", "mk.json"])
def test_a_mergekit_config_is_named_yml_or_yaml(name, reads, ws, capfd):
    refused(["merge", A, B, "--data", "digits", "--mergekit-config", name], capfd, ws,
            f"--mergekit-config {name}: name the file .yml or .yaml")
    _nothing_loaded(reads)





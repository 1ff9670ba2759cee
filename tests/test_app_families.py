"""The app on a random pair of each kind of family: a user's two folders under a model root
pass the app's model checks, and the Match and Spectra pages show what the library computes,
with the function check passed and the invariant circuits unchanged.

A kind is what the pages do differently: the inputs (tokens or pixels), the task the data is
scored on (text, masked, sequence classification, image) and the weight source (transformers
or timm). The pages call the same library functions for every family of a kind, and those are
tested on every family (tests/test_matching.py, tests/measures/test_spectra.py), so one family
per kind is run here: the first of each in `rotviz.arch.FAMILIES` (KINDS; a new family of a
new kind fails test_each_kind_is_run until it is added there).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import app_roots_with
from test_app import app, figures, numbers, texts
from test_tokens import _wordpiece

from rotviz.arch import FAMILIES, Sizes, family_module, spec_named
from rotviz.random_models import save_random

TINY = dict(layers=2, d=32, heads=4, ffn=64)
# text models read rotviz's built-in pystdlib data (64-character windows); image models digits
TEXT = dict(vocab=98)  # sizes; and the option below
POSITIONS = dict(positions=64)
IMAGE = dict(image=8, patch=2, channels=1, labels=10)


@pytest.fixture(scope="module")
def family_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    with app_roots_with(root):
        yield root


def _task(family: str, options: dict) -> str | None:
    from rotviz.data.tasks import task_of_config
    from rotviz.random_models import random_config

    return task_of_config(spec_named(family).inputs, random_config(family, Sizes(), **options))


def _pair(root, family: str) -> tuple[str, str, str]:
    """Two random models of `family` (seeds 0 and 1), with an output head of their own where the
    family can have one, so that every map the family admits is on offer; and data their head
    can be scored on: built-in pystdlib text for language models, digits for image models, a
    small labelled CSV (with a tokenizer trained in the test) for classifiers."""
    options = dict(family_module(family).UNTIED or {})
    image = spec_named(family).inputs == "pixels"
    sizes = dict(TINY) | (IMAGE if image else TEXT)
    options |= {} if image else POSITIONS
    task = _task(family, options)
    tokenizer = None
    if image:
        data = "digits"
    elif task in ("text", "masked"):
        data = "pystdlib"
    else:
        assert task == "seq-cls", task
        tokenizer = _wordpiece("[CLS]", "[SEP]")
        sizes["vocab"] = len(tokenizer)
        path = root / "data" / "labelled.csv"  # the sidebar finds data under the roots
        if not path.exists():
            path.parent.mkdir()
            words = ["def", "class", "alpha", "beta", "return", "yield", "x", "import"]
            rows = [" ".join(words[(i * k) % len(words)] for k in range(1, 2 + i % 6))
                    for i in range(60)]
            path.write_text("text,label\n" + "".join(f"{r},{i % 5}\n"
                                                     for i, r in enumerate(rows)))
        data = f"csv:{path}"
    out = []
    for seed in (0, 1):
        folder = root / f"{family}-s{seed}"
        if not folder.exists():
            save_random(family, folder, seed=seed, **sizes, **options)
            if tokenizer is not None:
                tokenizer.save_pretrained(folder)
        out.append(str(folder))
    return out[0], out[1], data


def _kind(family: str) -> tuple[str, str | None, str]:
    from rotviz.sources.adapters import source_of

    spec = spec_named(family)
    options = dict(family_module(family).UNTIED or {})
    options |= {} if spec.inputs == "pixels" else POSITIONS
    return spec.inputs, _task(family, options), type(source_of(spec)).__name__


def _one_of_each_kind(kind_of: dict[str, tuple]) -> list[str]:
    kinds: dict[tuple, str] = {}
    for family in FAMILIES:
        kinds.setdefault(kind_of[family], family)
    return list(kinds.values())


# The first family of each kind, written out: computing them builds a random config of every
# family (importing ~20 transformers modules), which at import time every xdist worker paid
# while collecting, running these tests or not. test_each_kind_is_run computes them and
# fails until this list is theirs.
KINDS = ["gpt2", "bert", "roberta", "vit", "timm-vit"]


def test_each_kind_is_run():
    kind_of = {f: _kind(f) for f in FAMILIES}
    assert KINDS == _one_of_each_kind(kind_of)
    assert set(kind_of.values()) == {kind_of[f] for f in KINDS}


@pytest.mark.parametrize("family", KINDS)
def test_match_and_spectra_pages_on_a_pair_of_each_kind(family, family_root):
    from rotviz.app import check_pair
    from rotviz.data.reading import split_for
    from rotviz.sources.loading import load_model

    a, b, data = _pair(family_root, family)
    anchor, source = load_model(a), load_model(b)
    check_pair(anchor, source, split_for(anchor, data, "test"))  # the app's model checks

    # built-in data by name; a user's file typed, as a user would (the picker lists what it
    # found under the roots a minute ago)
    given = {"data_path": data} if ":" in data else {"data": data}
    at = app("match", anchor_path=a, source_path=b, m_barrier="false", **given)
    assert not at.error, [e.value for e in at.error]
    figs = figures(at)
    before, after = (numbers(tr["y"]) for tr in figs["Distance to the anchor per layer"]["data"])
    assert sum(after) < sum(before) - 1e-3, (before, after)
    shown = texts(at)
    assert "function preserved" in shown and "not preserved" not in shown

    at = app("spectra", anchor_path=a, source_path=b, **given)
    assert not at.error, [e.value for e in at.error]
    figs = figures(at)
    for circuit in ("Q-K circuit", "V-O circuit"):
        fig = next(f for t, f in figs.items() if t.startswith(circuit))
        series = {tr["name"]: numbers(tr["y"]) for tr in fig["data"]}
        assert np.allclose(series["source"], series["matched source"], rtol=1e-4, atol=1e-6)
        assert not np.allclose(series["source"], series["anchor"], rtol=1e-2)
    assert "invariant circuits unchanged" in texts(at)

"""The app on checkpoints of every head: a MultiBERTs-shaped pair (two `BertForPreTraining`
models of different seeds, in a user's folder under the model roots) gets its masked-LM loss
barrier on the shipped text data, with and without matching, equal to the library's; a
headless pair gets cards that say what its head allows and no loss, the pages that read the
weights, and a one-line refusal from the pages that need a loss.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import app_roots_with
from test_app import LOSS_TITLE, N_EVAL, app, figures, numbers, texts

from rotviz.app import roots as app_roots
from rotviz.data.text import VOCAB_SIZE
from rotviz.random_models import save_random

# MultiBERTs-shaped, tiny: text read as rotviz's characters (vocab 98), 64-character windows
SIZES = dict(layers=2, d=32, heads=4, ffn=64, vocab=VOCAB_SIZE, positions=64)
SEED_PAPER = "FFN + attention + rescale (seed paper)"


@pytest.fixture(scope="module")
def head_root(tmp_path_factory):
    """A model root holding two seeds of a pre-training BERT and of a headless BERT."""
    root = tmp_path_factory.mktemp("heads")
    for head in ("BertForPreTraining", "BertModel"):
        for seed in (0, 1):
            save_random("bert", root / f"{head}-s{seed}", seed=seed, head=head, **SIZES)
    with app_roots_with(root):
        yield root


def _pair(root, head: str) -> tuple[str, str]:
    return str(root / f"{head}-s0"), str(root / f"{head}-s1")


def test_multiberts_pair_gives_the_librarys_masked_lm_barrier(head_root):
    """Two BertForPreTraining seeds: the Barrier page draws the masked-LM loss along the path
    without matching and with the seed paper's, each the library's curve on the test split
    the app reads (pystdlib as the anchor reads it, its first N_EVAL windows); weight
    matching is not offered (the tied MLM decoder refuses residual maps), and says why."""
    from rotviz import match_endpoints, measure
    from rotviz.data.reading import split_for
    from rotviz.sources.loading import load_model

    a, b = _pair(head_root, "BertForPreTraining")
    # "auto" data for a user's text folders is the shipped text data
    assert app_roots.auto_data(a) == ("pystdlib", "for a text model")
    at = app("barrier", anchor_path=a, source_path=b, data="pystdlib", b_points="5",
             b_specs=["no matching", SEED_PAPER])
    assert not at.error, [e.value for e in at.error]
    assert "Residual stream options are not offered for this pair: cls.predictions.decoder" \
        in "\n".join(c.value for c in at.caption)
    lines = {tr["name"].split(" (barrier")[0]: tr for tr in figures(at)[LOSS_TITLE]["data"]
             if tr.get("showlegend", True)}
    assert set(lines) == {"no matching", SEED_PAPER}
    anchor, source = load_model(a), load_model(b)
    split = split_for(anchor, "pystdlib", "test", 0).subset(N_EVAL)
    assert split.task == "masked"
    for spec, name in (("none", "no matching"), ("seed", SEED_PAPER)):
        want = measure("barrier", match_endpoints(anchor, source, spec), split, points=5)
        got = numbers(lines[name]["y"])
        assert np.allclose(got, want.loss, rtol=1e-6, atol=1e-8), (spec, got, want.loss)
        assert f"barrier {want.barrier:.3f}" in lines[name]["name"]
    captions = "\n".join(c.value for c in at.caption)
    assert "Test loss: **masked language modelling**, cross-entropy of the masked tokens" \
        in captions
    assert "function preserved" in texts(at)


def test_headless_pair_cards_say_what_the_head_allows(head_root):
    """Two headless BERTs: the Models page shows both cards (size, head class and words, what
    the head allows, the functional check on every output) with no loss evaluated and no
    error; the Spectra page reads the weights; the Barrier page refuses in one line."""
    a, b = _pair(head_root, "BertModel")
    at = app(anchor_path=a, source_path=b)  # data "auto": no data is read for these cards
    assert not at.error, [e.value for e in at.error]
    labels = [m.label for m in at.metric]
    assert labels == ["parameters", "parameters"]  # no test loss or accuracy
    body = texts(at)
    assert body.count("**Head**: `BertModel`, no head (it outputs the body's last hidden "
                      "state, and its pooler's)") == 2
    assert "Neither model has a head that a loss scores" in body
    assert "the Barrier, Landscape, Merge, Learn and Gallery pages refuse" in body
    assert body.count("**Works on** the Match and Spectra pages (and the Measure page's "
                      "distances and spectra) only: no loss scores this head") == 2
    assert "function preserved" in body and "function changed" not in body

    at = app("spectra", anchor_path=a, source_path=b)
    assert not at.error, [e.value for e in at.error]
    assert "invariant circuits unchanged" in texts(at)

    at = app("barrier", anchor_path=a, source_path=b)
    (error,) = at.error
    assert "has no head" in error.value and "\n" not in error.value
    assert "compare this pair by its weights" in texts(at) and not figures(at)


def test_one_body_under_two_heads_is_matched_not_scored(head_root):
    """A headless anchor and a pre-training source: the Models page says the pair is
    compared by its weights only; the Match page matches it from the weights (distances
    shrink, the function check passes); the Merge page refuses it in one line."""
    a = str(head_root / "BertModel-s0")
    b = str(head_root / "BertForPreTraining-s1")
    at = app(anchor_path=a, source_path=b, data="pystdlib")
    assert not at.error, [e.value for e in at.error]
    assert [m.label for m in at.metric] == ["parameters", "test accuracy", "test loss",
                                           "parameters"]
    assert "The anchor has no head that a loss scores" in texts(at)

    # the barriers of the ablation and matching from data (asked for in the URL) need a loss:
    # the page matches from the weights, and says so
    at = app("match", anchor_path=a, source_path=b, data="pystdlib", m_barrier="true",
             m_solver="activation matching")
    assert not at.error, [e.value for e in at.error]
    assert at.selectbox(key="m_solver").disabled
    assert any("Matching from data is not available" in w.value for w in at.warning)
    before, after = (numbers(tr["y"]) for tr in
                     figures(at)["Distance to the anchor per layer"]["data"])
    assert sum(after) < sum(before) - 1e-3
    assert "function preserved" in texts(at)
    assert any("No loss barriers here" in c.value for c in at.caption)

    at = app("merge", anchor_path=a, source_path=b, data="pystdlib")
    # one line: the anchor's missing head is found before the data is read
    assert at.error and all("\n" not in e.value and ("which no loss scores" in e.value or
                                                      "share a body under different heads"
                                                      in e.value) for e in at.error), \
        [e.value for e in at.error]

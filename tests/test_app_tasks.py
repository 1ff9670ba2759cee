"""The app on a user's own classifier pair and data file: the sidebar finds the
CSV under the model roots, the pages name the task, and the Models, Barrier and Merge pages
show F1, with the library's numbers."""

from __future__ import annotations

import pytest
import torch
from conftest import app_roots_with
from test_app import app, figures, numbers, texts
from test_tasks import _config, _head_class, _rows
from test_tokens import _wordpiece

from rotviz.app import roots as app_roots


@pytest.fixture(scope="module")
def user_roots(tmp_path_factory):
    """A model root holding a RoBERTa sequence-classifier pair (with its tokenizer) and a CSV."""
    import csv

    root = tmp_path_factory.mktemp("user")
    tok = _wordpiece("<s>", "</s>")
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = _head_class("roberta", "seq-cls")(_config("roberta", len(tok), "seq-cls"))
        model.eval().save_pretrained(root / f"cls-{seed}")
        tok.save_pretrained(root / f"cls-{seed}")
    (root / "data").mkdir()
    with open(root / "data" / "reviews.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["text", "label"])
        w.writeheader()
        w.writerows({"text": r["text"], "label": r["label"]} for r in _rows(120))
    with app_roots_with(root):
        yield root


def test_data_under_the_roots_is_found_and_data_outside_refused(user_roots, tmp_path):
    found = app_roots.discover_data([user_roots])
    assert found == [f"csv:{user_roots / 'data' / 'reviews.csv'}"]  # model folders skipped
    assert app_roots.resolve_data(found[0]) == found[0]
    (tmp_path / "x.csv").write_text("text,label\n")
    with pytest.raises(Exception, match="outside the roots"):
        app_roots.resolve_data(f"csv:{tmp_path / 'x.csv'}")


def _pages(user_roots, page: str, **params):
    data = f"csv:{user_roots / 'data' / 'reviews.csv'}"
    return app(page, anchor_path=str(user_roots / "cls-0"), source_path=str(user_roots / "cls-1"),
               data=data, n="0", **params)


def test_models_barrier_and_merge_pages_show_the_task_and_f1(user_roots, monkeypatch):
    """The Models page's warm-up (the Barrier page's default curves, weight matching among
    them, computed ahead in a thread) is left out: nothing here reads it (the Barrier page
    below draws other options), and tests/test_app.py tests it."""
    from rotviz.analysis.fusion import fusion_table
    from rotviz.data.reading import split_for
    from rotviz.evaluation import evaluate
    from rotviz.measures.barrier import interpolate
    from rotviz.sources.loading import load_model
    from rotviz.ui import run

    monkeypatch.setattr(run, "warm_up", lambda s: None)

    a, b = load_model(str(user_roots / "cls-0")), load_model(str(user_roots / "cls-1"))
    split = split_for(a, f"csv:{user_roots / 'data' / 'reviews.csv'}", "test")

    at = _pages(user_roots, "models")
    assert not at.exception and not at.error, [e.value for e in at.error]
    shown = [m.value for m in at.metric if m.label == "test macro-F1"]  # anchor, source
    assert shown == [f"{evaluate(m, split)['macro_f1']:.3f}" for m in (a, b)]
    assert "sequence classification" in "\n".join(c.value for c in at.caption)

    at = _pages(user_roots, "barrier", b_points="5", b_specs=["none", "seed"])
    assert not at.exception and not at.error, [e.value for e in at.error]
    loss = figures(at)["Loss along the straight path from anchor to source, with and without "
                       "matching"]
    lines = {tr["name"].split(" (barrier")[0]: tr for tr in loss["data"]
             if tr.get("showlegend", True)}
    ref = interpolate(a, b, split, "seed", points=5)
    seed = lines["FFN + attention + rescale (seed paper)"]
    assert numbers(seed["y"]) == pytest.approx(ref.loss, rel=1e-6, abs=1e-8)
    captions = "\n".join(c.value for c in at.caption)
    assert f"macro-F1 {ref.scores['macro_f1'][2]:.3f}" in captions  # at alpha 0.5

    # a method without statistics and one that reads them (every method's own numbers are
    # its module's tests'; the page's table of all of them, tests/test_app.py's)
    at = _pages(user_roots, "merge", g_specs=["none", "seed"],
                g_methods=["simple average", "RegMean"])
    assert not at.exception and not at.error, [e.value for e in at.error]
    f1 = figures(at)["Merged model macro-F1 per fusion method"]
    t = fusion_table(a, b, split, split.sibling("train"), methods=["simple", "regmean"],
                     specs=["none", "seed"])
    assert t.methods == ["simple", "regmean"]
    bars = {tr["name"]: numbers(tr["y"]) for tr in f1["data"] if tr["type"] == "bar"}
    assert bars["FFN + attention + rescale (seed paper)"] == pytest.approx(
        [t.scores[m]["seed"]["macro_f1"] for m in t.methods], abs=1e-9)
    assert "F1" in texts(at) or "F1" in "\n".join(c.value for c in at.caption)

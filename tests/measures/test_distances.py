"""The distances record (rotviz.measures.distances) and the seed paper's ablation of the
matching options beside it: each option moves only its own tensors, and its figures."""

from __future__ import annotations

import json

import pytest
from pairs import default_pair, digits
from test_plots import _check_frame

from rotviz.measures.barrier import interpolate
from rotviz.measures.distances import ablation_bars, distance_bars
from rotviz.plots import style


def test_ablation_rows_agree_with_curves_and_touch_only_their_modules():
    from rotviz.measures.distances import ABLATION_SPECS, ablation

    a, b = default_pair()
    split = digits().subset(150)
    ab = ablation(a, b, split, points=5)
    rows = {r.match: r for r in ab.rows}
    assert list(rows) == list(ABLATION_SPECS)
    none = rows["none"]
    assert none.distance == pytest.approx(ab.distance_none)
    assert rows["ffn"].distance < none.distance and rows["attn"].distance < none.distance
    assert rows["ffn,attn"].distance < min(rows["ffn"].distance, rows["attn"].distance)
    assert rows["seed"].distance <= rows["ffn,attn"].distance + 1e-9  # rescaling never adds
    # FFN matching moves only FFN tensors, attention matching only Q, K, V, O
    for kind in ("q", "k", "v", "o", "norms", "embeddings", "head"):
        assert rows["ffn"].per_kind[kind] == pytest.approx(none.per_kind[kind], rel=1e-9)
    for kind in ("ffn_in", "ffn_out", "norms", "embeddings", "head"):
        assert rows["attn"].per_kind[kind] == pytest.approx(none.per_kind[kind], rel=1e-9)
    for spec in ("none", "attn"):
        c = interpolate(a, b, split, spec, points=5)
        assert rows[spec].barrier == pytest.approx(c.barrier, abs=1e-9)
        assert rows[spec].loss == pytest.approx(c.loss, abs=1e-9)
    assert set(none.per_layer) == {"0", "1", "2", "3", "rest"}
    json.dumps(ab.to_dict())

def test_distance_bars_order_layers_and_keep_values():
    before = {"1": 3.0, "rest": 5.0, "0": 2.0, "10": 1.0}
    after = {"0": 1.0, "1": 2.5, "10": 0.5, "rest": 5.0}
    fig = distance_bars(before, after)
    _check_frame(fig, "per layer")
    assert list(fig.data[0].x) == ["0", "1", "10", "rest"]
    assert list(fig.data[0].y) == [2.0, 3.0, 1.0, 5.0]
    assert list(fig.data[1].y) == [1.0, 2.5, 0.5, 5.0]
    assert fig.layout.yaxis.title.text == style.DISTANCE
    kinds = distance_bars({"q": 1.0, "ffn_in": 2.0}, {"q": 0.5, "ffn_in": 1.0}, by="kind")
    assert list(kinds.data[0].x) == ["W_Q", "FFN in"]


def test_ablation_bars_show_distance_and_barrier():
    rows = [{"match": "none", "distance": 26.8, "barrier": 2.12},
            {"match": "ffn,attn", "distance": 24.6, "barrier": 1.64}]
    fig = ablation_bars(rows)
    _check_frame(fig, "matching option")
    assert list(fig.data[0].x) == [26.8, 24.6] and list(fig.data[1].x) == [2.12, 1.64]
    assert list(fig.data[0].y) == ["no matching", "FFN permutation + attention rotation"]
    assert "nats" in fig.layout.xaxis2.title.text and "L2" in fig.layout.xaxis.title.text
    only = ablation_bars([{"match": "none", "distance": 1.0}])
    assert len(only.data) == 1


def test_the_record_draws_in_the_hosts_style():
    """The distances take a log axis and the page's font size when the host asks; by
    default a linear axis, font 14."""
    from rotviz.measures import measurement
    from rotviz.plots.figure_style import Style

    d = {"before": {"per_layer": {"0": 2.0, "rest": 5.0}},
         "after": {"per_layer": {"0": 1.0, "rest": 5.0}}}
    rec = measurement("distances")
    plain = rec.plot(d, Style())
    assert plain.layout.yaxis.type is None and plain.layout.font.size == 14
    logged = rec.plot(d, Style(log=True, font_size=16))
    assert logged.layout.yaxis.type == "log" and logged.layout.font.size == 16
    assert list(logged.data[0].y) == [2.0, 5.0]

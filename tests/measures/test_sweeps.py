"""The sweeps record (rotviz.measures.sweeps, the seed paper's Figure 6): single and tail
layer subsets, the record equal to the library call, its rows and figure."""

from __future__ import annotations

import json

import pytest
from pairs import default_pair, digits

from rotviz.data.split import load_split
from rotviz.match.endpoints import match_endpoints
from rotviz.measures.barrier import interpolate
from rotviz.plots.figure_style import Style
from rotviz.sources.loading import load_model

A, B = "zoo:vit-digits-s3", "zoo:vit-digits-s6"


def test_layer_sweeps_cover_single_and_tail_subsets():
    from rotviz.measures.sweeps import layer_sweeps

    a, b = default_pair()
    split = digits().subset(150)
    calls = []
    sw = layer_sweeps(a, b, split, "seed", points=3, progress=lambda d, t, m: calls.append(d))
    assert sw.n_layers == 4 and sw.match == "seed"
    assert [p.layers for p in sw.single] == [[0], [1], [2], [3]]
    assert [p.layers for p in sw.tail] == [[3], [2, 3], [1, 2, 3], [0, 1, 2, 3]]
    assert sw.tail[0] == sw.single[3] and sw.tail[-1] == sw.all
    assert sw.none.layers == [] and sw.all.layers == [0, 1, 2, 3]
    full = interpolate(a, b, split, "seed", points=3)
    assert sw.all.distance == pytest.approx(full.distance_after)
    assert sw.all.mid_loss == pytest.approx(full.mid_loss, abs=1e-9)
    assert sw.none.distance == pytest.approx(full.distance_before)
    assert all(sw.all.distance < p.distance < sw.none.distance for p in sw.single)
    # tail distances shrink as more layers are matched
    d = [p.distance for p in sw.tail]
    assert all(x > y for x, y in zip(d, d[1:], strict=False))
    assert calls and max(calls) == 9  # none, 4 single, 4 tail (tail[0] and tail[-1] reused)
    json.dumps(sw.to_dict())

@pytest.fixture(scope="module")
def matched():
    """The default pair, matched (seed) once, and its test split."""

    ends = match_endpoints(load_model(A), load_model(B), "seed")
    return ends, load_split("digits", "test", 0)


def test_layer_sweeps_record_equals_the_library(matched, tmp_path, capsys):
    """`rotviz sweeps` (the seed paper's Figure 6) is rotviz.measures.sweeps.layer_sweeps
    on the pair, with the endpoints' matching; its plot and table come from its record."""
    from rotviz import measure
    from rotviz.measures import measurement
    from rotviz.measures.sweeps import layer_sweeps

    ends, split = matched
    small = split.subset(120)
    want = layer_sweeps(ends.anchor, ends.source, small, "seed", points=3)
    got = measure("sweeps", ends, small, points=3)
    assert got.match == want.match == "seed" and got.n_layers == want.n_layers
    for a, b in zip(got.single + got.tail, want.single + want.tail, strict=True):
        assert (a.layers, a.distance, a.mid_loss, a.barrier) == \
            (b.layers, b.distance, b.mid_loss, b.barrier)
    d = got.to_dict()
    rows = measurement("sweeps").rows(d)
    assert len(rows) == 2 + 2 * got.n_layers and rows[0]["matched"] == "none"
    fig = measurement("sweeps").plot(d, Style())
    assert measurement("sweeps").plot(d, Style(font_size=19)).layout.font.size == 19
    assert fig.layout.title.text.startswith("Which layers must be matched")
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    assert {t.name for t in fig.data} >= {"only layer i", "layers i to the last"}

"""Curved paths (issue 27 item 3, Garipov et al. 2018): a Bezier curve and a polygonal chain
with one trained bend between the anchor and the matched source (rotviz.measures.bend,
record `bend`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pairs import default_pair, digits, synthetic_split

from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.match.endpoints import match_endpoints, unmatched
from rotviz.measures.bend import (
    bend_in_plane,
    bend_on,
    curve_point,
    midpoint,
    projected_path,
    train_bend,
)
from rotviz.plots.figure_style import Style


@pytest.fixture(scope="module")
def tiny(loaded):
    """Two tiny random ViTs, their parameter sets on one module, and a synthetic split."""
    a, b = loaded("vit", 0), loaded("vit", 1)
    split = synthetic_split(a, 48, seed=3)
    ev = Evaluator(a, split)
    return a, b, ev, ev.params(a.state), ev.params(b.state)


def _random_like(p: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in p.items()}


@pytest.mark.parametrize("kind", ["bezier", "chain"])
def test_the_curve_ends_are_a_and_b_exactly(tiny, kind):
    _, _, _, pa, pb = tiny
    c = _random_like(pa, 7)  # a bend far from the midpoint
    at0, at1 = curve_point(pa, c, pb, 0.0, kind), curve_point(pa, c, pb, 1.0, kind)
    assert all(torch.equal(at0[k], pa[k]) for k in pa)
    assert all(torch.equal(at1[k], pb[k]) for k in pa)
    # the chain passes through the bend at t = 0.5
    if kind == "chain":
        mid = curve_point(pa, c, pb, 0.5, kind)
        assert all(torch.equal(mid[k], c[k]) for k in pa)
    # the bend pulls the inside of the curve away from the line
    inside = curve_point(pa, c, pb, 0.3, kind)
    line = {k: torch.lerp(pa[k], pb[k], 0.3) for k in pa}
    assert max(float((inside[k] - line[k]).abs().max()) for k in pa) > 0.1


@pytest.mark.parametrize("kind", ["bezier", "chain"])
def test_with_the_bend_at_the_midpoint_the_curve_is_the_straight_line(tiny, kind):
    _, _, _, pa, pb = tiny
    c = midpoint(pa, pb)
    worst = 0.0
    for t in np.linspace(0.0, 1.0, 11):
        on = curve_point(pa, c, pb, float(t), kind)
        worst = max(worst, max(float((on[k] - (pa[k] + float(t) * (pb[k] - pa[k]))).abs().max())
                               for k in pa))
    assert worst < 1e-6


def test_training_is_seeded_and_leaves_the_ends_alone(tiny):
    _, _, ev, pa, pb = tiny
    before = {k: v.clone() for k, v in pa.items()}
    c1, i1 = train_bend(ev, pa, pb, "bezier", steps=6, lr=1e-2, seed=4, batch_size=16)
    c2, i2 = train_bend(ev, pa, pb, "bezier", steps=6, lr=1e-2, seed=4, batch_size=16)
    c3, _ = train_bend(ev, pa, pb, "bezier", steps=6, lr=1e-2, seed=5, batch_size=16)
    assert all(torch.equal(c1[k], c2[k]) for k in c1)
    assert [h["loss"] for h in i1.history] == [h["loss"] for h in i2.history]
    assert [h["t"] for h in i1.history] == [h["t"] for h in i2.history]
    assert any(not torch.equal(c1[k], c3[k]) for k in c1)  # another seed, another bend
    assert all(torch.equal(pa[k], before[k]) for k in pa)
    mid = midpoint(pa, pb)
    assert any(not torch.equal(c1[k], mid[k]) for k in c1)  # it trained
    stop = iter([False, False, True])
    _, i4 = train_bend(ev, pa, pb, "chain", steps=6, lr=1e-2, seed=4, batch_size=16,
                       cancel=lambda: next(stop))
    assert i4.stopped == "cancelled" and i4.steps == 2


def test_the_bend_in_the_plane_frame_against_least_squares(tiny):
    """x, y and the distance off the plane against numpy's least-squares projection of C - A
    on span(B - A, B' - A), with B' a planted point off the A-B line."""
    _, _, _, pa, pb = tiny
    bm = {k: pb[k] + 0.3 * v for k, v in _random_like(pa, 11).items()}
    c = {k: 0.5 * (pa[k] + bm[k]) + 0.2 * v for k, v in _random_like(pa, 12).items()}
    got = bend_in_plane(pa, pb, bm, c)

    def flat(d):
        return torch.cat([d[k].double().flatten() for k in pa]).numpy()

    A, B, Bm, C = flat(pa), flat(pb), flat(bm), flat(c)
    basis = np.stack([B - A, Bm - A], 1)
    coef, *_ = np.linalg.lstsq(basis, C - A, rcond=None)
    inplane = basis @ coef
    u1 = (B - A) / np.linalg.norm(B - A)
    assert got["x"] == pytest.approx(float(inplane @ u1), rel=1e-9)
    assert abs(got["y"]) == pytest.approx(float(np.sqrt(inplane @ inplane - (inplane @ u1) ** 2)),
                                          rel=1e-6)
    assert got["off_plane"] == pytest.approx(float(np.linalg.norm(C - A - inplane)), rel=1e-6)
    assert got["off_plane"] > 1.0 and not got["degenerate"]
    assert got["points"]["B"] == [pytest.approx(float(np.linalg.norm(B - A)), rel=1e-9), 0.0]
    # the projection of the curve starts at A, ends at B' and passes the bend's image
    xy = projected_path("chain", got["points"]["A"], [got["x"], got["y"]],
                        got["points"]["B'"], [0.0, 0.5, 1.0])
    assert xy[0] == [0.0, 0.0] and xy[1] == pytest.approx([got["x"], got["y"]])
    assert xy[2] == pytest.approx(got["points"]["B'"])


def test_the_trained_bezier_curve_has_a_lower_barrier_on_the_default_pair():
    """Garipov et al.'s finding on the zoo's pair: the straight line A -> B' rises by more than
    1 nat; 100 Adam steps of the bend bring the curve's barrier under a third of it."""
    a, b = default_pair()
    ends = match_endpoints(a, b, "seed")
    test = digits("test").subset(200)
    r = bend_on(ends, test, "bezier", steps=100, lr=1e-2, points=11, seed=0, batch_size=64,
                train=digits("train"))
    assert r.loss[0] == pytest.approx(r.line_loss[0], abs=1e-6)  # the same ends
    assert r.loss[-1] == pytest.approx(r.line_loss[-1], abs=1e-6)
    assert r.line_barrier > 1.0
    assert r.barrier < r.line_barrier / 3
    assert r.steps == 100 and r.stopped == "steps" and len(r.train_loss) == 100
    assert r.off_plane > 0.1 and r.n == 200 and r.n_train == digits("train").n
    d = json.loads(json.dumps(r.to_dict()))
    from rotviz.measures import measurement

    m = measurement("bend")
    rows = m.rows(d)
    assert len(rows) == 11 and rows[0]["t"] == 0.0 and rows[-1]["loss"] == r.loss[-1]
    fig = m.plot(d, Style())
    assert m.plot(d, Style(font_size=19)).layout.font.size == 19 != fig.layout.font.size
    assert fig.layout.title.text and fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    assert "barrier" in fig.data[0].name and len(fig.data) == 4
    import plotly.graph_objects as go

    from rotviz.measures.bend import bend_on_plane

    over = bend_on_plane(go.Figure(), d)  # the overlay on the A/B/B' plane's figure
    assert len(over.data) == 2 and f"{r.off_plane:.3f} off the plane" in over.data[1].name
    assert list(over.data[0].x)[0] == 0.0 and list(over.data[0].x)[-1] == d["points"]["B'"][0]


def test_the_record_refuses_at_size_and_bad_values_in_one_line():
    from rotviz import measure
    from rotviz.measures import measurement

    m = measurement("bend")
    why = m.why_not_at_size()
    assert why and "\n" not in why and "whole model" in why
    assert not m.parameters()[0].choices or m.parameters()[0].choices == ("bezier", "chain")
    a, b = default_pair()
    ends = unmatched(a, b)
    for bad, words in (({"kind": "spline"}, "unknown --kind 'spline'"),
                       ({"lr": 5.0}, "--lr must be a number"),
                       ({"steps": 0}, "--steps must be an integer")):
        with pytest.raises(RotvizError, match=words) as e:
            measure("bend", ends, digits("test").subset(20), **bad)
        assert "\n" not in str(e.value)
    # without matching the plane is the A-B line: y is 0 and the curve goes A -> B
    r = measure("bend", ends, digits("test").subset(40), steps=3, points=3)
    assert r.degenerate and r.bend_y == 0.0 and r.match == "none" and len(r.loss) == 3


def test_the_app_runs_the_record_and_exports_its_table():
    """The generated app dispatch: `app.run('bend', ...)` on the default pair, its CSV and
    figure in the export; the app's numbers are the library's on the same split."""
    import io
    import zipfile

    from rotviz import app
    from rotviz.app.export import measurement_zip

    base = {"anchor": "zoo:vit-digits-s3", "source": "zoo:vit-digits-s6", "data": "digits",
            "seed": 0, "n_eval": 0, "device": "cpu"}
    cfg = app.measure_cfg(base, "seed", steps=5, points=3)
    r = app.run("bend", app.Resources(), cfg)
    assert "bend" in app.kinds() and r["steps"] == 5 and r["preserved"]
    a, b = default_pair()
    lib = bend_on(match_endpoints(a, b, "seed"), digits("test"), steps=5, points=3)
    assert r["barrier"] == pytest.approx(lib.barrier, rel=1e-6)
    assert r["line_barrier"] == pytest.approx(lib.line_barrier, rel=1e-6)
    with zipfile.ZipFile(io.BytesIO(measurement_zip("bend", cfg, r, images=False))) as z:
        rows = z.read("tables/bend.csv").decode().splitlines()
        assert "figures/bend.html" in z.namelist()
    assert rows[0] == "t,loss,acc,line_loss,line_acc,x,y" and len(rows) == 4

"""The plane record (rotviz.measures.plane): the grid agrees with the path and the distances,
a pair without matching is drawn degenerate, identical models are refused, the CLI's JSON,
and its figure."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from pairs import default_pair, default_pair_refs, digits
from test_plots import _check_frame

from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.match.endpoints import match_endpoints
from rotviz.measures.barrier import interpolate
from rotviz.measures.plane import loss_plane, plane_figure


def test_plane_agrees_with_interpolation_and_distances():
    a, b = default_pair()
    split = digits().subset(200)
    plane = loss_plane(a, b, split, "seed", grid=7)
    none = interpolate(a, b, split, None, points=3)
    matched = interpolate(a, b, split, "seed", points=3)
    pts = plane.points
    assert pts["A"] == [0.0, 0.0] and pts["B"][1] == 0.0
    assert pts["B"][0] == pytest.approx(none.distance_before, rel=1e-6)
    assert math.hypot(*pts["B'"]) == pytest.approx(matched.distance_after, rel=1e-6)
    assert pts["AB"] == pytest.approx([pts["B"][0] / 2, 0.0])
    assert pts["AB'"] == pytest.approx([pts["B'"][0] / 2, pts["B'"][1] / 2])
    # |B - B'| from the plane's coordinates equals the true distance between the two sources
    ev = Evaluator(a, split)
    pb, pc = ev.params(b.state), ev.params(match_endpoints(a, b, "seed").matched)
    true_bb = math.sqrt(sum(float(((pb[k] - pc[k]).double() ** 2).sum()) for k in pb))
    assert math.dist(pts["B"], pts["B'"]) == pytest.approx(true_bb, rel=1e-5)
    # the named points equal the interpolation values
    for name, value in (("A", none.loss[0]), ("B", none.loss[-1]), ("AB", none.loss[1]),
                        ("B'", matched.loss[-1]), ("AB'", matched.loss[1])):
        assert plane.point_loss[name] == pytest.approx(value, abs=1e-5), name
    # the grid covers every point, and its row y = 0 is the unmatched path with A and B on nodes
    xs, ys = np.array(plane.xs), np.array(plane.ys)
    for x, y in pts.values():
        assert xs[0] < x < xs[-1] and ys[0] < y < ys[-1]
    iy = int(np.argmin(np.abs(ys)))
    assert abs(ys[iy]) < 1e-9
    ia, ib = int(np.argmin(np.abs(xs))), int(np.argmin(np.abs(xs - pts["B"][0])))
    assert abs(xs[ia]) < 1e-9 and abs(xs[ib] - pts["B"][0]) < 1e-6 and ib > ia
    on_line = interpolate(a, b, split, None, points=ib - ia + 1)
    row = plane.loss[iy][ia : ib + 1]
    np.testing.assert_allclose(row, on_line.loss, atol=1e-5)
    np.testing.assert_allclose(plane.acc[iy][ia : ib + 1], on_line.acc, atol=1e-9)
    assert len(plane.loss) == len(plane.acc) == 7 and all(len(r) == 7 for r in plane.loss)
    json.dumps(plane.to_dict())


def test_plane_without_matching_is_degenerate_but_drawn():
    a, b = default_pair()
    plane = loss_plane(a, b, digits().subset(50), None, grid=3)
    assert plane.degenerate
    assert plane.points["B'"] == pytest.approx(plane.points["B"])
    assert plane.point_loss["B'"] == plane.point_loss["B"]


def test_plane_of_identical_models_is_an_error():
    a, _ = default_pair()
    with pytest.raises(RotvizError, match="identical"):
        loss_plane(a, a, digits().subset(20), None, grid=3)


def test_cli_plane_writes_json(tmp_path, capsys):
    a, b = default_pair_refs()
    out = tmp_path / "plane.json"
    assert main(["plane", a, b, "--data", "digits", "--grid", "3", "--json", str(out),
                 "--device", "cpu"]) == 0
    d = json.loads(out.read_text())
    assert {"xs", "ys", "loss", "acc", "points", "point_loss", "point_acc"} <= set(d)
    assert set(d["points"]) == {"A", "B", "B'", "AB", "AB'"}
    assert "plane [seed]" in capsys.readouterr().out

def test_loss_plane_marks_every_model():
    xs, ys = np.linspace(-1, 2, 7), np.linspace(-1, 1, 5)
    z = np.add.outer(ys**2, (xs - 0.5) ** 2)
    pts = {"A": (0.0, 0.0), "B": (1.0, 0.0), "B'": (0.8, 0.5), "AB": (0.5, 0.0), "AB'": (0.4, 0.25)}
    fig = plane_figure(xs, ys, z, pts)
    _check_frame(fig, "plane")
    contour = fig.data[0]
    assert np.allclose(np.asarray(contour.z), z)
    marks = {tr.text[0]: (tr.x[0], tr.y[0]) for tr in fig.data[1:]}
    assert marks == pts
    assert "Euclidean" in fig.layout.xaxis.title.text


def test_the_record_draws_in_the_hosts_style():
    """The plane's figure takes the page's font size and its shared colour range; by
    default it is drawn as the CLI's --figure draws it (its own range, font 14)."""
    from rotviz.measures import measurement
    from rotviz.plots.figure_style import Style

    xs, ys = [0.0, 1.0, 2.0], [-1.0, 0.0, 1.0]
    z = [[1.0, 2.0, 3.0], [2.0, 3.0, 4.0], [3.0, 4.0, 9.0]]
    pts = {"A": [0.0, 0.0], "B": [2.0, 0.0]}
    d = {"xs": xs, "ys": ys, "loss": z, "points": pts}
    rec = measurement("plane")
    plain = rec.plot(d, Style())
    assert plain.to_dict() == plane_figure(xs, ys, z, pts).to_dict()
    assert plain.data[0].zmin == 1.0 and plain.layout.font.size == 14
    shared = rec.plot(d, Style(font_size=20, colour_range=(0.5, 12.0)))
    assert (shared.data[0].zmin, shared.data[0].zmax) == (0.5, 12.0)
    assert shared.layout.font.size == 20

"""rotviz.plots: every figure carries its data unchanged, a title, labelled axes with units,
a legend and only colour-blind-safe colours."""

from __future__ import annotations

import numpy as np
import pytest

from rotviz.measures import barrier, distances, merge, spectra
from rotviz.measures import plane as barrier_plane
from rotviz.plots import learn, matching, style
from rotviz.plots import paths as barrier_paths

SAFE = {c.lower() for c in style.OKABE_ITO} | {style.GREY.lower()}


def _colors(fig) -> set[str]:
    out = set()
    for tr in fig.data:
        for part in ("line", "marker"):
            obj = getattr(tr, part, None)
            c = getattr(obj, "color", None) if obj is not None else None
            if isinstance(c, str):
                out.add(c.lower())
    return out


def _check_frame(fig, title_part: str):
    lay = fig.layout
    assert title_part.lower() in lay.title.text.lower()
    assert lay.xaxis.title.text and lay.yaxis.title.text
    assert "(" in lay.yaxis.title.text  # a unit or scale in brackets
    if any(tr.type in ("heatmap", "contour") for tr in fig.data):
        scales = [tr for tr in fig.data if tr.type in ("heatmap", "contour") and tr.showscale
                  is not False]
        assert scales and all("(" in tr.colorbar.title.text for tr in scales)  # with units
    else:
        assert lay.showlegend is True
    assert any(tr.name for tr in fig.data)
    assert _colors(fig) <= SAFE, _colors(fig) - SAFE


CURVES = [
    {"match": "none", "alphas": [0, 0.25, 0.5, 0.75, 1], "loss": [0.2, 1.0, 2.3, 0.9, 0.3],
     "acc": [0.95, 0.7, 0.3, 0.7, 0.94]},
    {"match": "seed", "alphas": [0, 0.25, 0.5, 0.75, 1], "loss": [0.2, 0.5, 0.9, 0.5, 0.3],
     "acc": [0.95, 0.85, 0.6, 0.86, 0.94]},
]


def test_barrier_point_is_the_largest_rise_above_the_chord():
    a = [0.0, 0.5, 1.0]
    am, top, base = barrier_paths.barrier_point(a, [1.0, 4.0, 3.0])
    assert am == 0.5 and top == 4.0 and base == pytest.approx(2.0)
    # a convex-down curve: the barrier is 0 at an end point
    am, top, base = barrier_paths.barrier_point(a, [1.0, 1.5, 3.0])
    assert top - base == pytest.approx(0.0)


def test_barrier_curves_carry_the_data_and_annotate_the_barrier():
    fig = barrier.barrier_curves(CURVES)
    _check_frame(fig, "loss along")
    assert fig.layout.xaxis.title.text == style.ALPHA
    assert fig.layout.yaxis.title.text == style.LOSS
    lines = [tr for tr in fig.data if tr.showlegend is not False]
    assert [list(tr.y) for tr in lines] == [c["loss"] for c in CURVES]
    assert "no matching" in lines[0].name and "barrier 2.050" in lines[0].name
    assert "seed paper" in lines[1].name and "barrier 0.650" in lines[1].name
    marks = [tr for tr in fig.data if tr.showlegend is False]
    assert [tuple(m.y) for m in marks] == [(0.25, 2.3), (0.25, 0.9)]
    assert lines[0].line.color != lines[1].line.color and lines[0].line.dash != lines[1].line.dash
    acc = barrier.barrier_curves(CURVES, metric="acc")
    _check_frame(acc, "accuracy")
    assert [list(tr.y) for tr in acc.data] == [c["acc"] for c in CURVES]
    # titles true of every curve: the path ends at the matched source only when all matched
    assert fig.layout.title.text == ("Loss along the straight path from anchor to source, "
                                     "with and without matching")
    assert barrier.barrier_curves(CURVES[1:]).layout.title.text == \
        "Loss along the straight path from anchor to matched source"
    assert acc.layout.title.text.startswith("Accuracy along the straight path from anchor to "
                                            "source, with")
    assert "no matching" in barrier.barrier_curves(CURVES[:1], "acc").layout.title.text
    # the accuracy axis follows the data (0.3..0.95, padded by 5 % of the span), or 0-1
    assert list(acc.layout.yaxis.range) == pytest.approx([0.3 - 0.0325, 0.95 + 0.0325])
    low = [{**c, "acc": [0.12, 0.15, 0.18, 0.14, 0.13]} for c in CURVES]
    assert list(barrier.barrier_curves(low, "acc").layout.yaxis.range) == pytest.approx(
        [0.11, 0.19])  # a 0.06 span: the 0.01 floor of the padding
    fixed = barrier.barrier_curves(low, "acc", acc_range=style.ACC_FIXED)
    assert list(fixed.layout.yaxis.range) == [0.0, 1.02]
    assert style.acc_range([0.99, 1.0]) == pytest.approx([0.98, 1.01])
    assert style.acc_range([float("nan")]) == [0.0, 1.02]


def test_loss_plane_marks_every_model():
    xs, ys = np.linspace(-1, 2, 7), np.linspace(-1, 1, 5)
    z = np.add.outer(ys**2, (xs - 0.5) ** 2)
    pts = {"A": (0.0, 0.0), "B": (1.0, 0.0), "B'": (0.8, 0.5), "AB": (0.5, 0.0), "AB'": (0.4, 0.25)}
    fig = barrier_plane.plane_figure(xs, ys, z, pts)
    _check_frame(fig, "plane")
    contour = fig.data[0]
    assert np.allclose(np.asarray(contour.z), z)
    marks = {tr.text[0]: (tr.x[0], tr.y[0]) for tr in fig.data[1:]}
    assert marks == pts
    assert "Euclidean" in fig.layout.xaxis.title.text


def test_distance_bars_order_layers_and_keep_values():
    before = {"1": 3.0, "rest": 5.0, "0": 2.0, "10": 1.0}
    after = {"0": 1.0, "1": 2.5, "10": 0.5, "rest": 5.0}
    fig = distances.distance_bars(before, after)
    _check_frame(fig, "per layer")
    assert list(fig.data[0].x) == ["0", "1", "10", "rest"]
    assert list(fig.data[0].y) == [2.0, 3.0, 1.0, 5.0]
    assert list(fig.data[1].y) == [1.0, 2.5, 0.5, 5.0]
    assert fig.layout.yaxis.title.text == style.DISTANCE
    kinds = distances.distance_bars({"q": 1.0, "ffn_in": 2.0}, {"q": 0.5, "ffn_in": 1.0}, by="kind")
    assert list(kinds.data[0].x) == ["W_Q", "FFN in"]


def test_ablation_bars_show_distance_and_barrier():
    rows = [{"match": "none", "distance": 26.8, "barrier": 2.12},
            {"match": "ffn,attn", "distance": 24.6, "barrier": 1.64}]
    fig = distances.ablation_bars(rows)
    _check_frame(fig, "matching option")
    assert list(fig.data[0].x) == [26.8, 24.6] and list(fig.data[1].x) == [2.12, 1.64]
    assert list(fig.data[0].y) == ["no matching", "FFN permutation + attention rotation"]
    assert "nats" in fig.layout.xaxis2.title.text and "L2" in fig.layout.xaxis.title.text
    only = distances.ablation_bars([{"match": "none", "distance": 1.0}])
    assert len(only.data) == 1


LAYER = {
    "layer": 2,
    "qk_singular": [[3.0, 2.0, 1.0], [2.5, 1.5, 0.1]],
    "vo_singular": [[1.0, 0.5, 0.2], [0.9, 0.4, 0.3]],
    "qk_angles": [[170.0, 170.0, 0.0], [30.0, 30.0, 0.0]],
    "vo_angles": [[90.0, 90.0, 0.0], [10.0, 10.0, 180.0]],
    "qk_det": [1.0, 1.0],
    "vo_det": [1.0, -1.0],
}


def test_singular_values_and_angles_per_head():
    fig = spectra.singular_values(LAYER)
    _check_frame(fig, "layer 2")
    assert [list(tr.y) for tr in fig.data] == LAYER["qk_singular"] + LAYER["vo_singular"]
    assert fig.layout.xaxis2.title.text and fig.layout.yaxis2.title.text
    ang = spectra.rotation_angles(LAYER)
    _check_frame(ang, "rotation angles")
    vo_head1 = ang.data[3]
    assert list(vo_head1.y) == LAYER["vo_angles"][1] and vo_head1.marker.symbol == "x"
    over = spectra.angle_overview([LAYER, {**LAYER, "layer": 3}])
    _check_frame(over, "mean")
    assert np.allclose(np.asarray(over.data[0].z)[0], [np.mean(a) for a in LAYER["qk_angles"]])


def test_circuit_spectra_log_scale():
    series = {"anchor": [3.0, 1.0], "source": [2.0, 0.5], "matched source": [2.0, 0.5]}
    fig = spectra.circuit_spectra(series, "Q-K circuit, layer 0 head 1")
    _check_frame(fig, "circuit")
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.dtick == 1
    assert [list(tr.y) for tr in fig.data] == list(series.values())


def test_fusion_chart_groups_methods():
    rows = [
        {"method": "average", "matching": "none", "acc": 0.3},
        {"method": "average", "matching": "seed", "acc": 0.5},
        {"method": "fisher", "matching": "none", "acc": 0.35},
        {"method": "fisher", "matching": "seed", "acc": 0.6},
    ]
    fig = merge.fusion_chart(rows, references={"anchor": 0.95, "source": 0.94})
    _check_frame(fig, "accuracy")
    assert list(fig.data[0].x) == ["average", "fisher"]
    assert list(fig.data[0].y) == [0.3, 0.35] and list(fig.data[1].y) == [0.5, 0.6]
    assert list(fig.data[2].y) == [0.95, 0.95]
    # bars start at 0 and the axis ends just above the highest bar or line: 0.95 + 5 % of
    # 0.95 - 0.3; the 0-1 scale on request; a shared range as given
    assert list(fig.layout.yaxis.range) == pytest.approx([0.0, 0.95 + 0.0325])
    assert merge.bar_range([0.3, 0.6], fixed=True) == [0.0, 1.02]
    shared = merge.fusion_chart(rows, "acc", y_range=[0.0, 0.8])
    assert list(shared.layout.yaxis.range) == [0.0, 0.8]


def test_learn_figures():
    w = np.arange(12.0).reshape(3, 4) - 6
    fig = learn.weight_heatmaps({"original": w, "scrambled": -w}, "W_Q of head 0")
    _check_frame(fig, "W_Q")
    assert fig.data[0].zmin == -6 and fig.data[0].zmax == 6
    assert np.allclose(np.asarray(fig.data[1].z), -w)
    a = np.array([[1.0, 2.0], [3.0, -1.0]])
    sc = learn.logit_scatter(a, a + 1e-6)
    _check_frame(sc, "outputs")
    assert "1.0e-06" in sc.data[1].name
    st = learn.stage_distances([("original", 0.0), ("scrambled", 45.6), ("matched back", 1e-5)])
    _check_frame(st, "moved")
    assert [tr.y[0] for tr in st.data] == [0.0, 45.6, 1e-5]


def test_matching_figures():
    from rotviz.app import summaries

    summary = {"report": {"options": {"ffn": True, "attn": True, "rescale": True},
                          "residual": {"objective": [10.0, 7.0, 6.5, 6.4, 6.4]}}}
    rows = summaries.objective_rows(summary)
    assert [r["after"] for r in rows[1:]] == ["per-layer maps (FFN, heads)", "residual map"] * 2
    assert [r["round"] for r in rows] == [0, 1, 1, 2, 2]
    assert summaries.never_increases([r["objective"] for r in rows])
    assert not summaries.never_increases([3.0, 2.0, 2.5])
    fig = matching.objective_history(rows)
    _check_frame(fig, "never goes up")
    assert fig.layout.yaxis.title.text.startswith("squared distance to anchor (canonical")
    assert fig.layout.xaxis.title.text.startswith("step")
    assert list(fig.data[0].y) == [10.0, 7.0, 6.5, 6.4, 6.4]
    assert [tr.name for tr in fig.data[1:]] == [
        "start (canonical forms)", "after per-layer maps (FFN, heads)", "after residual map"]
    assert list(fig.data[3].x) == [2, 4]

    ang = matching.angle_spectrum({"residual map": [180.0, 90.0, 90.0, 0.0]})
    _check_frame(ang, "eigen-angle")
    assert ang.layout.yaxis.title.text == style.ANGLE and list(ang.data[0].y)[0] == 180.0

    hist = [{"step": 0, "train_loss": None, "val_barrier": 1.6},
            {"step": 20, "train_loss": 0.6, "val_barrier": 0.25},
            {"step": 40, "train_loss": 0.3, "val_barrier": 0.3}]
    lh = matching.learn_history(hist, best_step=20)
    _check_frame(lh, "validation barrier")
    assert "nats" in lh.layout.yaxis.title.text
    assert list(lh.data[0].y) == [1.6, 0.25, 0.3] and list(lh.data[1].x) == [20, 40]
    assert lh.data[2].name == "kept: step 20" and list(lh.data[2].y) == [0.25]
    assert "steps" in summaries.stop_reason({"stopped": "steps", "steps": 40})
    assert "8 checks" in summaries.stop_reason({"stopped": "patience", "steps": 180})

    corr = matching.ffn_correlation([0.1, 0.2], [0.6, 0.7])
    _check_frame(corr, "activation matching")
    assert [list(tr.y) for tr in corr.data] == [[0.1, 0.2], [0.6, 0.7]]


def test_palette_is_okabe_ito():
    assert style.OKABE_ITO[:3] == ("#E69F00", "#56B4E9", "#009E73")
    assert len({style.color(i) for i in range(7)}) == 7
    assert style.nice_label("ffn,attn") == "FFN permutation + attention rotation"

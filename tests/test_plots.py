"""rotviz.plots: every figure carries its data unchanged, a title, labelled axes with units,
a legend and only colour-blind-safe colours."""

from __future__ import annotations

import numpy as np

from rotviz.plots import learn, matching, style

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

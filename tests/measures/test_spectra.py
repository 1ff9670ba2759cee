"""The spectra record (rotviz.measures.spectra): exact circuit singular values, their
invariance under the symmetry (and only under it), cross-matrix spectra and rotation angles
of a planted rotation, and its figures."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import view_of
from pairs import default_pair
from test_plots import _check_frame

from rotviz.groups import rotation_angles
from rotviz.match.pipeline import match_models
from rotviz.measures import measurement
from rotviz.measures.spectra import (
    angle_overview,
    circuit_spectra,
    qk_circuit,
    singular_values,
    spectra,
    vo_circuit,
)
from rotviz.measures.spectra import rotation_angles as angles_figure
from rotviz.plots.figure_style import Style
from rotviz.symmetry.actions import apply, random_element
from rotviz.symmetry.view import read_view


def brute_force(x: torch.Tensor, y: torch.Tensor, d_h: int) -> torch.Tensor:
    """Top d_h singular values of the full d x d product x[h]^T y[h]."""
    full = x.double().transpose(-1, -2) @ y.double()
    return torch.linalg.svdvals(full)[..., :d_h]


def test_circuit_spectra_equal_the_full_svd(family, loaded):
    view = view_of(loaded(family))
    dh, size = view.dims.d_head, view.dims.group_size

    def per_head(t):  # each query head reads its key/value group's K and V
        return t.repeat_interleave(size, 0)

    for blk in view.blocks:
        a = blk.attn
        torch.testing.assert_close(qk_circuit(a), brute_force(a.wq, per_head(a.wk), dh),
                                   rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(vo_circuit(a),
                                   brute_force(per_head(a.wv), a.wo.transpose(-1, -2), dh),
                                   rtol=1e-9, atol=1e-12)
        assert qk_circuit(a).shape == (view.dims.n_heads, dh)


def test_circuits_are_invariant_under_the_group_and_only_under_it(family, loaded):
    view = view_of(loaded(family)).to(dtype=torch.float64)
    moved = apply(view, random_element(view.dims, seed=5, ffn=True, attn=True, rescale=True))
    s = spectra(view, view, moved)
    assert s.max_circuit_change < 1e-10
    # head permutations too: the heads are compared as a set (matched head k is some source
    # head), not position by position (where a permutation alone moved them by 0.1 to 0.35)
    permuted = apply(view, random_element(view.dims, seed=5, heads=True))
    assert spectra(view, view, permuted).max_circuit_change < 1e-10
    a0, a1 = view.blocks[0].attn, moved.blocks[0].attn
    assert (a1.wq - a0.wq).abs().max() > 0.1  # the weights did move
    # a change outside the group (mixing two heads' query rows) changes the circuit spectra
    wq = a0.wq.clone()
    wq[0, 0] += wq[1, 0]
    mixed = view.with_block(0, type(view.blocks[0])(
        type(a0)(wq, *(getattr(a0, f) for f in ("wk", "wv", "wo", "bq", "bk", "bv", "bo"))),
        view.blocks[0].ffn, view.blocks[0].norms))
    assert spectra(view, view, mixed).max_circuit_change > 1e-3


def test_invariant_spectra_survive_matching_on_the_default_pair():
    a, b = default_pair()
    out = match_models(a, b)
    matched = read_view(b.spec, b.config, out.state)
    s = spectra(a, b, matched)
    assert s.max_circuit_change < 1e-5
    for lay in s.layers:
        np.testing.assert_allclose(lay.matched_qk, lay.source_qk, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(lay.matched_vo, lay.source_vo, rtol=1e-5, atol=1e-7)
        assert not np.allclose(lay.anchor_qk, lay.source_qk, rtol=1e-2)  # models do differ
    src, mt = view_of(b).blocks[0].attn, matched.blocks[0].attn
    assert float((src.wq - mt.wq).abs().max()) > 0.05  # while the weights moved
    d = s.to_dict()
    json.dumps(d)
    assert len(d["layers"]) == 4 and len(d["layers"][0]["qk_cross"]) == s.n_heads


def test_cross_spectra_and_angles_of_a_planted_rotation(family, loaded):
    anchor = view_of(loaded(family)).to(dtype=torch.float64)
    planted = random_element(anchor.dims, seed=11, ffn=False, attn=True, rescale=False)
    source = apply(anchor, planted)
    s = spectra(anchor, source, layers=[1])
    assert [lay.layer for lay in s.layers] == [1]
    lay, a = s.layers[0], anchor.blocks[1].attn
    # the rotation that undoes R has R's eigen-angles (angles of eigenvalues +-1 of a
    # reflection are sensitive at the 1e-6 degree level)
    want, det = rotation_angles(planted[1].qk)
    np.testing.assert_allclose(lay.qk_angles, want.numpy(), atol=1e-4)
    np.testing.assert_allclose(lay.qk_det, det.numpy(), atol=1e-9)
    want_vo, _ = rotation_angles(planted[1].vo)
    np.testing.assert_allclose(lay.vo_angles, want_vo.numpy(), atol=1e-4)
    # after the best rotation the alignment is the anchor's own squared norm, per map (per key/
    # value group: its query heads and its K; per head without grouped-query attention)
    size = anchor.dims.group_size

    def group_sum(x):
        return x.reshape(-1, size).sum(1)

    own = group_sum((a.wq**2).sum((1, 2))) + (a.wk**2).sum((1, 2))
    if a.bq is not None:
        own = own + group_sum((a.bq**2).sum(1)) + (a.bk**2).sum(1)
    np.testing.assert_allclose(np.sum(lay.qk_cross, axis=1), own.numpy(), rtol=1e-9)
    # before rotating, the alignment tr(M) is smaller: the planted rotation misaligned the heads
    assert all(t < s_ for t, s_ in zip(lay.qk_trace, np.sum(lay.qk_cross, axis=1), strict=True))


def test_spectra_accepts_loaded_models_and_needs_no_matched_view():
    a, b = default_pair()
    s = spectra(a, b)
    assert s.max_circuit_change is None
    assert s.layers[0].matched_qk == [] and len(s.layers) == 4
    assert s.d_head == 16 and s.n_heads == 4
    sv = np.array(s.layers[2].qk_cross)
    assert (np.diff(sv, axis=1) <= 1e-12).all()  # descending per head
    assert pytest.approx(sum(s.layers[2].qk_trace)) != sv.sum()


def test_circuit_spectra_of_grouped_query_attention_are_invariant(saved):
    """Under GQA each query head reads its group's K and V: the circuits of a tiny LLaMA
    (4 query heads, 2 KV heads) keep their spectra under a random element of its group."""
    from rotviz.sources.loading import load_model

    model = load_model(saved("llama", 0, kv_heads=2))
    view = view_of(model)
    moved = apply(view, random_element(view.dims, 3))
    for blk, mb in zip(view.blocks, moved.blocks, strict=True):
        assert qk_circuit(blk.attn).shape[0] == 4
        for fn in (qk_circuit, vo_circuit):
            a, b = fn(blk.attn), fn(mb.attn)
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


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
    fig = singular_values(LAYER)
    _check_frame(fig, "layer 2")
    assert [list(tr.y) for tr in fig.data] == LAYER["qk_singular"] + LAYER["vo_singular"]
    assert fig.layout.xaxis2.title.text and fig.layout.yaxis2.title.text
    ang = angles_figure(LAYER)
    _check_frame(ang, "rotation angles")
    vo_head1 = ang.data[3]
    assert list(vo_head1.y) == LAYER["vo_angles"][1] and vo_head1.marker.symbol == "x"
    over = angle_overview([LAYER, {**LAYER, "layer": 3}])
    rec = measurement("spectra").plot({"layers": [LAYER, {**LAYER, "layer": 3}]}, Style())
    assert rec.to_dict() == over.to_dict()
    big = measurement("spectra").plot({"layers": [LAYER]}, Style(font_size=19))
    assert big.layout.font.size == 19
    _check_frame(over, "mean")
    assert np.allclose(np.asarray(over.data[0].z)[0], [np.mean(a) for a in LAYER["qk_angles"]])


def test_circuit_spectra_log_scale():
    series = {"anchor": [3.0, 1.0], "source": [2.0, 0.5], "matched source": [2.0, 0.5]}
    fig = circuit_spectra(series, "Q-K circuit, layer 0 head 1")
    _check_frame(fig, "circuit")
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.dtick == 1
    assert [list(tr.y) for tr in fig.data] == list(series.values())

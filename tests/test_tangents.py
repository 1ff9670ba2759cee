"""The tangent geometry of the continuous symmetries (rotviz.analysis.tangents): the tangents
of the continuous group against central finite differences of the action itself, their
number against the group dimension derived by hand, gauge fixing (dense and block by block)
and a gauge-fixed plane. The `flat` record that checks the loss along them:
tests/measures/test_flat.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pairs import synthetic_split

from rotviz.analysis.hvp import math_attention
from rotviz.analysis.tangents import (
    f64_view,
    gauge_fixed,
    generators,
    group_dimension,
    tangents,
)
from rotviz.sources.loading import Loaded
from rotviz.symmetry.actions import LayerTransform, apply_layer
from rotviz.symmetry.view import write_state

SMALL = dict(layers=1, d=8, heads=2, ffn=16)  # d_h = 4: 2 * 2 * 4^2 = 64 tangents
F64 = torch.float64


@pytest.fixture(scope="module")
def tiny(saved) -> Loaded:
    from rotviz.sources.loading import load_model

    return load_model(saved("vit", 0, **SMALL))


def f64_loss(model: Loaded, split):
    """The split's mean cross-entropy in float64 as a function of the parameter dict, through
    a plain torch.func.functional_call (independent of rotviz's loss code)."""
    buffers = {n: b.to(F64) for n, b in model.model.named_buffers()}
    x, y = split.inputs.to(F64), split.labels

    def loss(params: dict) -> torch.Tensor:
        with math_attention():
            out = torch.func.functional_call(model.model, {**buffers, **params}, (x,))
        logits = out.logits if hasattr(out, "logits") else out[0]
        return F.cross_entropy(logits.to(F64), y)

    return loss


def pdict(model: Loaded, state: dict, names: list[str]) -> dict:
    return {n: state[n].to(F64) for n in names}


def test_count_equals_the_group_dimension(tiny, loaded):
    # plain attention, H = H_kv = 2, d_h = 4, GELU FFN (no unit scales): 2 * H_kv * d_h^2;
    # pre-norm LayerNorm with a classifier head: the stream's centred map, (d-1)(d-2)/2 = 21
    names, t, gens = tangents(tiny)
    assert t.shape == (64 + 21, sum(tiny.state[n].numel() for n in names)) == (85, 845)
    assert group_dimension(f64_view(tiny, None)) == [
        {"layer": 0, "qk": 32, "vo": 32, "ffn": 0, "total": 64},
        {"layer": "residual", "qk": 0, "vo": 0, "ffn": 0, "residual": 21, "total": 21,
         "group": "centred", "why": None}]
    # llama (TINY: d 32, 4 heads, d_h 8, rotary on all dims, gated FFN of 64 units): per
    # block, H_kv * d_h (a scale and a rotation per frequency pair) + H_kv * d_h^2 + 64
    ll = loaded("llama")
    view = f64_view(ll, None)
    h_kv, dh = view.dims.n_kv_heads, view.dims.d_head
    assert view.dims.rope is not None and view.dims.gated
    want = h_kv * dh + h_kv * dh * dh + view.dims.d_ffn
    d = view.dims.d_model
    assert [r["total"] for r in group_dimension(view)] == [want] * view.dims.n_layers + [
        d * (d - 1) // 2]  # RMSNorm: all of O(d) on the stream, once for the model
    per = {}
    for g in generators(view):
        per[g.layer] = per.get(g.layer, 0) + 1
    assert per == {**dict.fromkeys(range(view.dims.n_layers), want), -1: d * (d - 1) // 2}


def test_tangents_are_the_actions_derivatives(tiny, loaded):
    """Each row of T equals a central finite difference (float64) of the action itself,
    A = I +- eps E applied by rotviz.symmetry.actions and written by write_state."""
    for model in (tiny, loaded("llama")):
        view = f64_view(model, None)
        names, t, gens = tangents(model, gens=generators(view, residual=False))
        eps = 1e-5
        for row in range(0, len(gens), max(1, len(gens) // 12)):
            g = gens[row]
            blk = view.blocks[g.layer]

            def moved(s, g=g, blk=blk, view=view, names=names):
                if g.kind == "ffn":
                    sc = torch.ones(blk.ffn.w_in.shape[0], dtype=F64)
                    sc[g.group] += s
                    tr = LayerTransform(ffn_scale=sc)
                else:
                    m = torch.eye(blk.attn.wq.shape[1], dtype=F64).repeat(
                        blk.attn.n_kv_heads, 1, 1)
                    m[g.group] += s * g.e
                    tr = LayerTransform(qk=m) if g.kind == "qk" else LayerTransform(vo=m)
                st = write_state(apply_layer(view, g.layer, tr))
                return torch.cat([st[n].reshape(-1) for n in names])

            fd = (moved(eps) - moved(-eps)) / (2 * eps)
            assert float((fd - t[row]).norm()) <= 1e-6 * float(t[row].norm()), g.label




def test_gauge_fixed_directions_are_orthogonal_to_every_tangent(tiny):
    names, t, _ = tangents(tiny)
    d = torch.randn(3, t.shape[1], generator=torch.Generator().manual_seed(0), dtype=F64)
    before = d.clone()
    g = gauge_fixed(d, t)
    assert torch.equal(d, before)  # the caller's directions are not touched
    cos = (g @ t.T).abs() / (g.norm(dim=1, keepdim=True) * t.norm(dim=1))
    assert float(cos.max()) <= 1e-6
    # it removed only span(T): 85 of 845 dimensions, so most of each direction remains
    assert float((g.norm(dim=1) / d.norm(dim=1)).min()) > 0.5
    # idempotent, and a direction inside span(T) is removed entirely
    assert float((gauge_fixed(g, t) - g).abs().max()) <= 1e-10
    inside = torch.randn(85, dtype=F64, generator=torch.Generator().manual_seed(2)) @ t
    assert float(gauge_fixed(inside, t).norm()) <= 1e-10 * float(inside.norm())
    raw = (d @ t.T).abs() / (d.norm(dim=1, keepdim=True) * t.norm(dim=1))
    assert float(raw.max()) > 1e-3  # the random directions were not orthogonal before






def test_a_gauge_fixed_plane(tiny):
    """Gauge-fixed random directions feed a slice: orthogonal to every tangent (1e-6, in
    the parameters' float32), the plane's centre is the model's own loss, and the directions
    differ from the plain random ones only by their part along the tangents."""
    from rotviz.analysis.directions import gauge_fixed_directions, random_directions
    from rotviz.analysis.loss_grid import slice_at
    from rotviz.analysis.tangents import parameter_names
    from rotviz.evaluation import Evaluator

    split = synthetic_split(tiny, 12)
    # the blocks' tangents: gauge fixing leaves the stream's map (it moves every block)
    names, t, _ = tangents(tiny, gens=generators(f64_view(tiny, None), residual=False))
    ds = gauge_fixed_directions(tiny, None, 2, seed=3)
    raw = random_directions({n: tiny.state[n] for n in names}, set(names), 2, 3, "filter")
    assert parameter_names(tiny) == names
    for d, r in zip(ds, raw, strict=True):
        v = torch.cat([d[n].to(F64).reshape(-1) for n in names])
        w = torch.cat([r[n].to(F64).reshape(-1) for n in names])
        assert float(((t @ v).abs() / (t.norm(dim=1) * v.norm())).max()) <= 1e-6
        assert float(((t @ w).abs() / (t.norm(dim=1) * w.norm())).max()) > 1e-3
        # the removed part lies in span(T): projecting it again removes all of it
        gone = (w - v).to(F64)
        assert float(gauge_fixed(gone, t).norm()) <= 1e-5 * float(gone.norm())
    s = slice_at(tiny, split, dims=2, grid=3, span=0.5, given=ds)
    loss, _ = Evaluator(tiny, split).evaluate(tiny.state)
    assert s.loss[1][1] == pytest.approx(loss, abs=1e-12) == s.centre_loss




def test_blockwise_gauge_fixing_equals_the_dense_one(tiny, loaded):
    """The tangents split into pieces on disjoint coordinates (per block, kind, KV group or
    FFN unit); projecting piece by piece equals the dense QR projection (1e-10), and the
    pieces hold every tangent."""
    from rotviz.analysis.tangents import gauge_fixed_blockwise, tangent_blocks

    for model in (tiny, loaded("llama")):
        names, t, gens = tangents(model, gens=generators(f64_view(model, None), False))
        blocks = tangent_blocks(model)
        assert sum(b.t.shape[0] for b in blocks) == len(gens)
        d = torch.randn(2, t.shape[1], generator=torch.Generator().manual_seed(5), dtype=F64)
        dense, piecewise = gauge_fixed(d, t), gauge_fixed_blockwise(d, blocks)
        assert float((dense - piecewise).abs().max()) <= 1e-10 * float(d.abs().max())
        assert float((gauge_fixed_blockwise(d[0], blocks) - piecewise[0]).abs().max()) <= 1e-12







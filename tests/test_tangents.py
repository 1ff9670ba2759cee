"""Symmetry's flat directions (rotviz.analysis.tangents, the `flat` record): the tangents of
the continuous group against central finite differences of the action itself, their number
against the group dimension derived by hand, the loss along each orbit and the gradient's
cosine with each tangent (by rotviz's code and by an independent float64 loss through
torch.func), gauge fixing, a random direction as the negative control, a RoPE family
(llama) and q/k norms (qwen3), and the record (CLI JSON, plot, refusal at size)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import clone_state
from test_landscape import assert_unchanged, synthetic_split

from rotviz.analysis.hessian import math_attention
from rotviz.analysis.tangents import (
    f64_view,
    flat,
    gauge_fixed,
    generators,
    group_dimension,
    moved_state,
    tangents,
)
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.models import Loaded
from rotviz.symmetry.actions import LayerTransform, apply_layer
from rotviz.symmetry.view import write_state

SMALL = dict(layers=1, d=8, heads=2, ffn=16)  # d_h = 4: 2 * 2 * 4^2 = 64 tangents
F64 = torch.float64


@pytest.fixture(scope="module")
def tiny(saved) -> Loaded:
    from rotviz.models import load_model

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
    # plain attention, H = H_kv = 2, d_h = 4, GELU FFN (no unit scales): 2 * H_kv * d_h^2
    names, t, gens = tangents(tiny)
    assert t.shape == (64, sum(tiny.state[n].numel() for n in names)) == (64, 845)
    assert group_dimension(f64_view(tiny, None)) == [
        {"layer": 0, "qk": 32, "vo": 32, "ffn": 0, "total": 64}]
    # llama (TINY: d 32, 4 heads, d_h 8, rotary on all dims, gated FFN of 64 units): per
    # block, H_kv * d_h (a scale and a rotation per frequency pair) + H_kv * d_h^2 + 64
    ll = loaded("llama")
    view = f64_view(ll, None)
    h_kv, dh = view.dims.n_kv_heads, view.dims.d_head
    assert view.dims.rope is not None and view.dims.gated
    want = h_kv * dh + h_kv * dh * dh + view.dims.d_ffn
    assert [r["total"] for r in group_dimension(view)] == [want] * view.dims.n_layers
    per = {}
    for g in generators(view):
        per[g.layer] = per.get(g.layer, 0) + 1
    assert per == dict.fromkeys(range(view.dims.n_layers), want)


def test_tangents_are_the_actions_derivatives(tiny, loaded):
    """Each row of T equals a central finite difference (float64) of the action itself,
    A = I +- eps E applied by rotviz.symmetry.actions and written by write_state."""
    for model in (tiny, loaded("llama")):
        view = f64_view(model, None)
        names, t, gens = tangents(model)
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


def test_orbits_are_flat_and_the_gradient_is_orthogonal(tiny):
    split = synthetic_split(tiny, 12)
    before = clone_state(tiny.state)
    r = flat(tiny, None, split, per_layer=64, steps=(-0.5, 0.5))
    assert len(r.rows) == 64 and r.dimension[0]["tangents"] == 64
    assert max(x.loss_change for x in r.rows) <= 1e-6
    assert max(x.cosine for x in r.rows) <= 1e-5
    assert r.control_cosine > 1e-3  # a random direction is not orthogonal to the gradient
    assert_unchanged(tiny, before)

    # independently: a float64 loss through torch.func, its gradient by torch.func.grad
    names, t, gens = tangents(tiny)
    loss = f64_loss(tiny, split)
    base = pdict(tiny, tiny.state, names)
    l0 = float(loss(base))
    view = f64_view(tiny, None)
    for g in gens[::7]:
        for s in (-0.5, 0.5):
            moved = pdict(tiny, moved_state(view, g, s), names)
            assert abs(float(loss(moved)) - l0) <= 1e-10 * l0, g.label
    grad = torch.func.grad(loss)(base)
    gflat = torch.cat([grad[n].reshape(-1) for n in names])
    cos = (t @ gflat).abs() / (t.norm(dim=1) * gflat.norm())
    assert float(cos.max()) <= 1e-5
    # negative controls: a random direction, and a Q-K map applied to W_Q alone
    rnd = torch.randn(t.shape[1], generator=torch.Generator().manual_seed(1), dtype=F64)
    assert abs(float(rnd @ gflat)) / float(rnd.norm() * gflat.norm()) > 1e-3
    blk = view.blocks[0]
    half = replace(blk.attn, wq=blk.attn.wq * 1.5)
    broken = write_state(view.with_block(0, replace(blk, attn=half)))
    assert abs(float(loss(pdict(tiny, broken, names))) - l0) > 1e-4 * l0


def test_gauge_fixed_directions_are_orthogonal_to_every_tangent(tiny):
    names, t, _ = tangents(tiny)
    d = torch.randn(3, t.shape[1], generator=torch.Generator().manual_seed(0), dtype=F64)
    before = d.clone()
    g = gauge_fixed(d, t)
    assert torch.equal(d, before)  # the caller's directions are not touched
    cos = (g @ t.T).abs() / (g.norm(dim=1, keepdim=True) * t.norm(dim=1))
    assert float(cos.max()) <= 1e-6
    # it removed only span(T): 64 of 845 dimensions, so most of each direction remains
    assert float((g.norm(dim=1) / d.norm(dim=1)).min()) > 0.5
    # idempotent, and a direction inside span(T) is removed entirely
    assert float((gauge_fixed(g, t) - g).abs().max()) <= 1e-10
    inside = torch.randn(64, dtype=F64, generator=torch.Generator().manual_seed(2)) @ t
    assert float(gauge_fixed(inside, t).norm()) <= 1e-10 * float(inside.norm())
    raw = (d @ t.T).abs() / (d.norm(dim=1, keepdim=True) * t.norm(dim=1))
    assert float(raw.max()) > 1e-3  # the random directions were not orthogonal before


def test_rope_and_qk_norm_families(loaded):
    """llama (rotary, gated FFN: Q-K scale-rotations per frequency pair, unit scales) and
    qwen3 (q/k norms: only rotations of the pairs whose gains are equal; at its random gains
    none are, so its Q-K group is discrete; with all-ones gains every pair turns)."""
    ll = loaded("llama")
    r = flat(ll, None, synthetic_split(ll, 6), per_layer=6, curvature=False)
    assert {x.kind for x in r.rows} == {"qk", "vo", "ffn"}
    assert max(x.loss_change for x in r.rows) <= 1e-6
    assert max(x.cosine for x in r.rows) <= 1e-5 < r.control_cosine
    qw = loaded("qwen3")
    view = f64_view(qw, None)
    assert view.dims.qk_norm and all(d["qk"] == 0 for d in group_dimension(view))
    ones = {k: (torch.ones_like(v) if k.endswith(("q_norm.weight", "k_norm.weight")) else v)
            for k, v in qw.state.items()}
    view = f64_view(qw, ones)
    h_kv, dh = view.dims.n_kv_heads, view.dims.d_head
    assert [d["qk"] for d in group_dimension(view)] == [h_kv * dh // 2] * view.dims.n_layers
    gens = [g for g in generators(view) if g.kind == "qk"]
    assert len(gens) == view.dims.n_layers * h_kv * dh // 2
    assert all(torch.equal(g.e, -g.e.T) for g in gens)  # rotations only, no scales
    r = flat(qw, ones, synthetic_split(qw, 6), per_layer=6, curvature=False)
    assert {x.kind for x in r.rows} == {"qk", "vo", "ffn"}
    assert max(x.loss_change for x in r.rows) <= 1e-6
    assert max(x.cosine for x in r.rows) <= 1e-5 < r.control_cosine


def test_the_record_cli_plot_and_refusal(tmp_path, capsys, tiny):
    from types import SimpleNamespace

    from rotviz.measures import measure, measurement

    js = tmp_path / "f.json"
    rc = main(["flat", "zoo:vit-digits-s3", "--data", "digits", "--per-layer", "2",
               "--examples", "16", "--json", str(js), "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("flat on cpu"), out
    d = json.loads(js.read_text())
    assert {"rows", "dimension", "control_cosine", "loss", "steps"} <= set(d)
    assert max(x["loss_change"] for x in d["rows"]) <= 1e-6
    assert max(x["cosine"] for x in d["rows"]) <= 1e-5 < d["control_cosine"]
    fig = measurement("flat").plot(d)
    assert fig.layout.title.text and fig.layout.xaxis.title.text and \
        fig.layout.yaxis.title.text and fig.layout.legend.title.text
    assert fig.layout.yaxis.type == "log" and len(fig.data) == 4
    with pytest.raises(RotvizError, match="read block by block, and the gradient"):
        measure("flat", SimpleNamespace(at_size=True), synthetic_split(tiny, 4))
    rc = main(["flat", "zoo:vit-digits-s3", "--data", "digits", "--per-layer", "0"])
    err = capsys.readouterr().err
    assert rc != 0 and "--per-layer" in err and err.count("\n") == 1


def test_a_gauge_fixed_plane(tiny):
    """Gauge-fixed random directions feed a slice: orthogonal to every tangent (1e-6, in
    the parameters' float32), the plane's centre is the model's own loss, and the directions
    differ from the plain random ones only by their part along the tangents."""
    from rotviz.analysis.slices import random_directions, slice_at
    from rotviz.analysis.tangents import gauge_fixed_directions, parameter_names
    from rotviz.evaluation import Evaluator

    split = synthetic_split(tiny, 12)
    names, t, _ = tangents(tiny)
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


def test_curvature_along_tangents_equals_the_dense_hessian(tiny):
    """t^T H t / |t|^2 from Hessian-vector products against the exact dense Hessian of an
    independent float64 loss (torch.autograd.functional.hessian), 1e-4 relative."""
    split = synthetic_split(tiny, 12)
    r = flat(tiny, None, split, per_layer=4, steps=(0.1,))
    names, t, _ = tangents(tiny)
    by_label = {g.label: i for i, g in enumerate(tangents(tiny)[2])}
    loss = f64_loss(tiny, split)
    shapes = [tiny.state[n].shape for n in names]
    sizes = [tiny.state[n].numel() for n in names]

    def flat_loss(v: torch.Tensor) -> torch.Tensor:
        parts = torch.split(v, sizes)
        return loss({n: p.reshape(s) for n, p, s in zip(names, parts, shapes, strict=True)})

    theta = torch.cat([tiny.state[n].to(F64).reshape(-1) for n in names])
    h = torch.autograd.functional.hessian(flat_loss, theta)
    scale = float(torch.linalg.eigvalsh((h + h.T) / 2).abs().max())
    for row in r.rows:
        v = t[by_label[row.label]]
        exact = float(v @ h @ v) / float(v @ v)
        assert row.curvature == pytest.approx(exact, rel=1e-4, abs=1e-6 * scale), row.label
    assert any(abs(row.curvature) > 1e-4 * scale for row in r.rows)  # not all trivially 0


def test_blockwise_gauge_fixing_equals_the_dense_one(tiny, loaded):
    """The tangents split into pieces on disjoint coordinates (per block, kind, KV group or
    FFN unit); projecting piece by piece equals the dense QR projection (1e-10), and the
    pieces hold every tangent."""
    from rotviz.analysis.tangents import gauge_fixed_blockwise, tangent_blocks

    for model in (tiny, loaded("llama")):
        names, t, gens = tangents(model)
        blocks = tangent_blocks(model)
        assert sum(b.t.shape[0] for b in blocks) == len(gens)
        d = torch.randn(2, t.shape[1], generator=torch.Generator().manual_seed(5), dtype=F64)
        dense, piecewise = gauge_fixed(d, t), gauge_fixed_blockwise(d, blocks)
        assert float((dense - piecewise).abs().max()) <= 1e-10 * float(d.abs().max())
        assert float((gauge_fixed_blockwise(d[0], blocks) - piecewise[0]).abs().max()) <= 1e-12

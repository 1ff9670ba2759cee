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
from rotviz.plots.figure_style import Style
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


def test_orbits_are_flat_and_the_gradient_is_orthogonal(tiny):
    split = synthetic_split(tiny, 12)
    before = clone_state(tiny.state)
    r = flat(tiny, None, split, per_layer=64, steps=(-0.5, 0.5), nullity=None)
    assert len(r.rows) == 64 + 21 and r.dimension[0]["tangents"] == 64
    assert r.dimension[1]["tangents"] == 21 == sum(x.kind == "residual" for x in r.rows)
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
    # it removed only span(T): 85 of 845 dimensions, so most of each direction remains
    assert float((g.norm(dim=1) / d.norm(dim=1)).min()) > 0.5
    # idempotent, and a direction inside span(T) is removed entirely
    assert float((gauge_fixed(g, t) - g).abs().max()) <= 1e-10
    inside = torch.randn(85, dtype=F64, generator=torch.Generator().manual_seed(2)) @ t
    assert float(gauge_fixed(inside, t).norm()) <= 1e-10 * float(inside.norm())
    raw = (d @ t.T).abs() / (d.norm(dim=1, keepdim=True) * t.norm(dim=1))
    assert float(raw.max()) > 1e-3  # the random directions were not orthogonal before


def test_rope_and_qk_norm_families(loaded):
    """llama (rotary, gated FFN: Q-K scale-rotations per frequency pair, unit scales) and
    qwen3 (q/k norms: only rotations of the pairs whose gains are equal; at its random gains
    none are, so its Q-K group is discrete; with all-ones gains every pair turns)."""
    ll = loaded("llama")
    r = flat(ll, None, synthetic_split(ll, 6), per_layer=6, curvature=False)
    assert {x.kind for x in r.rows} == {"qk", "vo", "ffn", "residual"}
    assert max(x.loss_change for x in r.rows) <= 1e-6
    assert max(x.cosine for x in r.rows) <= 1e-5 < r.control_cosine
    qw = loaded("qwen3")
    view = f64_view(qw, None)
    assert view.dims.qk_norm and all(d["qk"] == 0 for d in group_dimension(view))
    ones = {k: (torch.ones_like(v) if k.endswith(("q_norm.weight", "k_norm.weight")) else v)
            for k, v in qw.state.items()}
    view = f64_view(qw, ones)
    h_kv, dh = view.dims.n_kv_heads, view.dims.d_head
    assert [d["qk"] for d in group_dimension(view)][:-1] == [h_kv * dh // 2] * view.dims.n_layers
    gens = [g for g in generators(view) if g.kind == "qk"]
    assert len(gens) == view.dims.n_layers * h_kv * dh // 2
    assert all(torch.equal(g.e, -g.e.T) for g in gens)  # rotations only, no scales
    r = flat(qw, ones, synthetic_split(qw, 6), per_layer=6, curvature=False)
    # (its head is tied to the embedding: no residual map, see the next tests)
    assert {x.kind for x in r.rows} == {"qk", "vo", "ffn"}
    assert max(x.loss_change for x in r.rows) <= 1e-6
    assert max(x.cosine for x in r.rows) <= 1e-5 < r.control_cosine


def test_the_record_cli_plot_and_refusal(tmp_path, capsys, tiny):
    from types import SimpleNamespace

    from rotviz.measures import measurement
    from rotviz.runner import measure

    js = tmp_path / "f.json"
    rc = main(["flat", "zoo:vit-digits-s3", "--data", "digits", "--per-layer", "2",
               "--examples", "16", "--json", str(js), "--device", "cpu", "--nullity", "no"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("flat on cpu"), out
    d = json.loads(js.read_text())
    assert {"rows", "dimension", "control_cosine", "loss", "steps"} <= set(d)
    assert d["nullity"] == [] and "residual" in {x["kind"] for x in d["rows"]}
    assert max(x["loss_change"] for x in d["rows"]) <= 1e-6
    assert max(x["cosine"] for x in d["rows"]) <= 1e-5 < d["control_cosine"]
    fig = measurement("flat").plot(d, Style())
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


def test_curvature_along_tangents_equals_the_dense_hessian(tiny):
    """t^T H t / |t|^2 from Hessian-vector products against the exact dense Hessian of an
    independent float64 loss (torch.autograd.functional.hessian), 1e-4 relative."""
    split = synthetic_split(tiny, 12)
    r = flat(tiny, None, split, per_layer=4, steps=(0.1,))
    assert sum(x.kind == "residual" for x in r.rows) == 4  # the stream's centred map too
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
        names, t, gens = tangents(model, gens=generators(f64_view(model, None), False))
        blocks = tangent_blocks(model)
        assert sum(b.t.shape[0] for b in blocks) == len(gens)
        d = torch.randn(2, t.shape[1], generator=torch.Generator().manual_seed(5), dtype=F64)
        dense, piecewise = gauge_fixed(d, t), gauge_fixed_blockwise(d, blocks)
        assert float((dense - piecewise).abs().max()) <= 1e-10 * float(d.abs().max())
        assert float((gauge_fixed_blockwise(d[0], blocks) - piecewise[0]).abs().max()) <= 1e-12


def test_residual_tangents_of_an_rmsnorm_family(saved):
    """llama (pre-norm RMSNorm, untied head): the stream's map is all of O(d), d(d-1)/2 = 28
    tangents once for the model. At the model's own gains it acts conjugated by the folding:
    a writer W -> Q^T W (rows E -> E Q), a reader W -> W diag(g) Q diag(1/g); each tangent
    equals a central difference of that finite action (1e-6) and, independently, those
    formulas; the loss is flat along each orbit, the gradient orthogonal, and the curvature
    equals the dense Hessian's quadratic form (1e-4). Turning the stream without the
    folding changes the function (the negative control)."""
    from rotviz.analysis.tangents import ResidualFrame, residual_matrix
    from rotviz.models import load_model
    from rotviz.symmetry.residual import apply_residual

    ll = load_model(saved("llama", 0, layers=1, d=8, heads=2, ffn=8))
    view = f64_view(ll, None)
    res = [g for g in generators(view) if g.kind == "residual"]
    assert len(res) == 28 and group_dimension(view)[-1]["group"] == "orthogonal"
    names, t, gens = tangents(ll, gens=res)
    frame = ResidualFrame.of(view)
    gain = view.other["model.norm.weight"]
    for row, g in enumerate(gens):
        e = residual_matrix(view, g)
        assert torch.equal(e, -e.T)
        eps = 1e-5
        up, down = (frame.at(torch.linalg.matrix_exp(s * e)) for s in (eps, -eps))
        fd = torch.cat([((up[n] - down[n]) / (2 * eps)).reshape(-1) for n in names])
        assert float((fd - t[row]).norm()) <= 1e-6 * float(t[row].norm()), g.label
        part = dict(zip(names, torch.split(t[row], [ll.state[n].numel() for n in names]),
                        strict=True))
        emb = view.other["model.embed_tokens.weight"]
        assert torch.allclose(part["model.embed_tokens.weight"].reshape(emb.shape), emb @ e,
                              rtol=0, atol=1e-12)
        head = view.other["lm_head.weight"]
        want = head * gain @ e / gain
        assert torch.allclose(part["lm_head.weight"].reshape(head.shape), want, rtol=0,
                              atol=1e-12)
        assert float(part["model.norm.weight"].abs().max()) == 0.0  # gains stay

    split = synthetic_split(ll, 6)
    r = flat(ll, None, split, per_layer=28, steps=(-0.5, 0.5))
    rr = [x for x in r.rows if x.kind == "residual"]
    assert len(rr) == 28 and r.dimension[-1]["tangents"] == 28
    assert max(x.loss_change for x in rr) <= 1e-6
    assert max(x.cosine for x in rr) <= 1e-5 < r.control_cosine
    # the curvature along each against the dense Hessian of an independent float64 loss
    buffers = {n: b.to(F64) if b.is_floating_point() else b for n, b in ll.model.named_buffers()}
    sizes = [ll.state[n].numel() for n in names]

    def flat_loss(v: torch.Tensor) -> torch.Tensor:
        params = {n: p.reshape(ll.state[n].shape)
                  for n, p in zip(names, torch.split(v, sizes), strict=True)}
        with math_attention():
            lg = torch.func.functional_call(ll.model, {**buffers, **params},
                                            (split.inputs,)).logits
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]).to(F64), split.labels.reshape(-1))

    theta = torch.cat([ll.state[n].to(F64).reshape(-1) for n in names])
    assert float(flat_loss(theta)) == pytest.approx(r.loss, rel=1e-12)
    h = torch.autograd.functional.hessian(flat_loss, theta, vectorize=True)
    by_label = {g.label: i for i, g in enumerate(gens)}
    for x in rr:
        v = t[by_label[x.label]]
        assert x.curvature == pytest.approx(float(v @ h @ v) / float(v @ v), rel=1e-4)
    assert min(abs(x.curvature) for x in rr) > 1e-5  # a random point: not a critical one
    # negative control: the stream turned with the gains left in the norms
    q = torch.linalg.matrix_exp(0.5 * residual_matrix(view, gens[0]))
    raw = write_state(apply_residual(view, q, check=False))
    moved = torch.cat([raw[n].reshape(-1) for n in names])
    assert abs(float(flat_loss(moved)) - r.loss) > 1e-4 * r.loss


def test_no_residual_tangents_where_the_family_has_no_continuous_map(loaded):
    """gpt2 (LayerNorm, head tied to the embedding: the final gain cannot be folded) and
    bert (post-norm: permutations only) get no residual tangents, and the record says why."""
    for fam, words in (("gpt2", "tied to the embedding"), ("bert", "discrete group")):
        model = loaded(fam)
        view = f64_view(model, None)
        row = group_dimension(view)[-1]
        assert row["layer"] == "residual" and row["total"] == 0 and row["group"] is None
        assert words in row["why"], row["why"]
        assert not [g for g in generators(view) if g.kind == "residual"]
        r = flat(model, None, synthetic_split(model, 4), per_layer=1, curvature=False)
        assert "residual" not in {x.kind for x in r.rows}
        assert r.dimension[-1]["why"] == row["why"]


@pytest.mark.parametrize("option", [("--nullity-tol", "0.1"), ("--nullity-exact", "100"),
                                    ("--nullity-probes", "2"), ("--nullity-steps", "10")])
def test_nullity_settings_need_the_nullity_count(option, capfd, ws):
    """The nullity count's settings were accepted and ignored without --nullity yes (after
    minutes of work); each is declared to need it (Param.needs) and refused in one line
    before any model loads
    (models that do not exist: a refusal after loading would name them instead)."""
    from conftest import refused

    flag, value = option
    refused(["flat", "nosuch", "--data", "digits", flag, value], capfd, ws,
            f"{flag} needs --nullity yes: add it, or drop {flag}")
    refused(["flat", "nosuch", "--data", "digits", flag, value, "--nullity", "no"], capfd, ws,
            f"{flag} needs --nullity yes")

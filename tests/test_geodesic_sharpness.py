"""Geodesic sharpness (rotviz.analysis.geodesic_sharpness; Hide & Seek, da Silva, Dangel and
Oore, ICML 2025): unchanged by a planted symmetry element that more than doubles the top
Hessian eigenvalue (a plain ViT and a RoPE, gated, grouped-query Llama); its horizontal
projection equals the metric's least-squares projection off the group's tangents computed
here from rotviz.analysis.tangents; its second-order geodesic term equals the metric's
Euler-Lagrange acceleration computed here by autograd."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import clone_state
from pairs import assert_unchanged, synthetic_split

from rotviz.analysis import geodesic_sharpness as gs
from rotviz.analysis.tangents import f64_view, generators, parameter_names, tangents
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.groups import rope_pairs
from rotviz.measures.hessian import hessian
from rotviz.sources.loading import Loaded, load_model
from rotviz.symmetry.actions import LayerTransform, apply, random_element
from rotviz.symmetry.view import read_view, write_state

F64 = torch.float64
SMALL = dict(layers=1, d=8, heads=2, ffn=16)


@pytest.fixture(scope="module", params=["vit", "llama"])
def tiny(request, saved) -> Loaded:
    return load_model(saved(request.param, 0, **SMALL), dtype=F64)


def planted(view) -> dict[int, LayerTransform]:
    """Far from orthogonal: Q-K scales of 4 on half the directions (per RoPE pair a scale of
    3, so it commutes with the rotations), a V-O map with scales 3 and 1/3 and a shear, FFN
    unit scales of 3 where they are a symmetry (gated or ReLU FFNs)."""
    d = view.dims
    dh, n = d.d_head, d.n_kv_heads
    out = {}
    for i in range(d.n_layers):
        if d.rope:
            a = torch.eye(dh, dtype=F64)
            first, second = rope_pairs(dh, d.rope)
            for p, (u, v) in enumerate(zip(first.tolist(), second.tolist(), strict=True)):
                if p % 2 == 0:
                    a[u, u] = a[v, v] = 3.0
        else:
            a = torch.diag(torch.tensor([4.0 if k % 2 == 0 else 1.0 for k in range(dh)],
                                        dtype=F64))
            a[0, 1] = 1.0
        b = torch.diag(torch.tensor([3.0 if k % 3 == 0 else 1 / 3 for k in range(dh)],
                                    dtype=F64))
        b[1, 0] = 0.5
        s = None
        if d.gated or d.activation == "relu":
            s = torch.tensor([3.0 if k % 2 == 0 else 1.0 for k in range(d.d_ffn)], dtype=F64)
        out[i] = LayerTransform(qk=a.expand(n, dh, dh).clone(), vo=b.expand(n, dh, dh).clone(),
                                ffn_scale=s)
    return out


def test_a_planted_element_doubles_the_top_eigenvalue_and_keeps_geodesic_sharpness(tiny):
    split = synthetic_split(tiny, 12)
    view = read_view(tiny.spec, tiny.config, tiny.state)
    before = clone_state(tiny.state)
    moved = write_state(apply(view, planted(view)))
    ev = Evaluator(tiny, split)
    x = ev.batches[0][0]
    diff = (ev.logits(ev.params(moved), x) - ev.logits(ev.params(tiny.state), x)).abs().max()
    assert float(diff) <= 1e-5
    top0 = hessian(tiny, None, split, top=1, dtype=F64).eigenvalues[0]
    top1 = hessian(tiny, moved, split, top=1, dtype=F64).eigenvalues[0]
    assert top1 >= 2 * top0 > 0
    for kind in gs.KINDS:
        g0 = gs.geodesic_sharpness(tiny, None, split, kind=kind, dtype=F64)
        g1 = gs.geodesic_sharpness(tiny, moved, split, kind=kind, dtype=F64)
        assert abs(g0["value"]) > 1e-3
        assert abs(g1["value"] - g0["value"]) <= 1e-4 * abs(g0["value"])
        if kind == "average":  # the first-order value, on the same directions, too
            assert g1["first_order"] == pytest.approx(g0["first_order"], rel=1e-4)
            assert g0["first_order"] != pytest.approx(g0["value"], rel=1e-3)
        else:  # the ascent climbs
            assert g0["rises"][-1] > g0["rises"][0]
    # discrete permutations and orthogonal maps too (FFN units, heads, Q-K and V-O rotations)
    dims = view.dims
    turned = write_state(apply(view, random_element(dims, 2, rescale=False)))
    for kind in gs.KINDS:
        g0 = gs.geodesic_sharpness(tiny, None, split, kind=kind, dtype=F64)
        g2 = gs.geodesic_sharpness(tiny, turned, split, kind=kind, dtype=F64)
        assert g2["value"] == pytest.approx(g0["value"], rel=1e-6)
    assert_unchanged(tiny, before)
    # the plain (Euclidean, first-order) rise along the same seeded draw is not invariant:
    # what the quotient removes is real
    land0, land1 = gs.Landscape(tiny, None, split), gs.Landscape(tiny, moved, split)
    xi0 = gs.draw(land0.fs, land0.chunk, torch.Generator().manual_seed(0))
    flat = {k: 0.1 * v / float(gs.norm(land0.fs, {k2: torch.eye(v.shape[-1], dtype=F64)
                                                  .expand(v.shape[0], -1, -1)
                                                  for k2, v in land0.fs.items()
                                                  if k2.startswith("m:")}, xi0)) for k, v
            in xi0.items()}
    r0 = land0.loss({k: land0.fs[k] + flat[k] for k in flat}) - land0.base
    r1 = land1.loss({k: land1.fs[k] + flat[k] for k in flat}) - land1.base
    assert abs(r1 - r0) > 1e-3 * abs(r0)


def _factors_of_flat(model: Loaded, row: torch.Tensor) -> dict[str, torch.Tensor]:
    """A flat parameter vector (tangents' coordinates) as the factors of its view."""
    names = parameter_names(model)
    st = {k: torch.zeros_like(v, dtype=F64) if v.is_floating_point() else v
          for k, v in model.state.items()}
    start = 0
    for n in names:
        size = st[n].numel()
        st[n] = row[start:start + size].reshape(st[n].shape)
        start += size
    view = read_view(model.spec, model.config, st).to(F64)
    return gs.factors(view, set(names))[0]


def test_the_horizontal_projection_is_the_metric_projection_off_the_group_tangents(tiny):
    """Written here: the Gram matrix of the group's tangents (rotviz.analysis.tangents, its
    own code) in the metric g, the least-squares vertical part, its removal."""
    split = synthetic_split(tiny, 4)
    land = gs.Landscape(tiny, None, split, dtype=F64)
    xi = gs.draw(land.fs, land.chunk, torch.Generator().manual_seed(3))
    # the group of rotviz.symmetry.actions (the residual stream's rotations are another's)
    _, t, _ = tangents(tiny, gens=generators(f64_view(tiny, None), residual=False))
    tf = [_factors_of_flat(tiny, row) for row in t]
    # g is symmetric (P = (F^T F)^-1 is): each pair's inner product once, mirrored (the
    # Gram matrix was most of this test's time: 64 tangents on vit)
    gram = torch.zeros(len(tf), len(tf), dtype=F64)
    for i, a in enumerate(tf):
        for j in range(i, len(tf)):
            gram[i, j] = gram[j, i] = float(gs.inner(land.fs, land.p, a, tf[j]))
    rhs = torch.tensor([float(gs.inner(land.fs, land.p, a, xi)) for a in tf], dtype=F64)
    c = torch.linalg.lstsq(gram, rhs[:, None]).solution[:, 0]
    expect = {k: v - sum(float(ci) * f[k] for ci, f in zip(c, tf, strict=True))
              for k, v in xi.items()}
    got = gs.horizontal(land.view, land.fs, land.p, xi)
    scale = float(gs.norm(land.fs, land.p, xi))
    err = float(gs.norm(land.fs, land.p, {k: got[k] - expect[k] for k in xi}))
    assert err <= 1e-6 * scale
    # horizontal: g-orthogonal to every tangent; projecting twice changes nothing
    for f in tf:
        assert abs(float(gs.inner(land.fs, land.p, got, f))) <= 1e-9 * scale * float(
            gs.norm(land.fs, land.p, f))
    again = gs.horizontal(land.view, land.fs, land.p, got)
    assert float(gs.norm(land.fs, land.p, {k: again[k] - got[k] for k in got})) <= 1e-9 * scale


def _euler_lagrange(f: torch.Tensor, xi: torch.Tensor) -> torch.Tensor:
    """x'' at x = F, x' = xi of the geodesic of 1/2 tr(v (x^T x)^-1 v^T), by autograd."""
    n, h = f.shape

    def lag(x, v):
        x, v = x.reshape(n, h), v.reshape(n, h)
        return 0.5 * torch.trace(v @ torch.linalg.inv(x.t() @ x) @ v.t())

    x0, v0 = f.reshape(-1), xi.reshape(-1)
    m = torch.autograd.functional.hessian(lambda v: lag(x0, v), v0)
    dldx = torch.autograd.functional.jacobian(lambda x: lag(x, v0), x0)
    mixed = torch.autograd.functional.jacobian(
        lambda x: torch.autograd.functional.jacobian(lambda v: lag(x, v), v0,
                                                     create_graph=True), x0)
    return torch.linalg.solve(m, dldx - mixed @ v0)


def test_the_second_order_term_is_the_metrics_geodesic_acceleration():
    """Euler-Lagrange of the Lagrangian 1/2 tr(v (F^T F)^-1 v^T), by autograd: M(x) x'' =
    dL/dx - d/dx(dL/dv) v; and per number the exact geodesic w exp(t xi / w)."""
    gen = torch.Generator().manual_seed(0)
    f = torch.randn(2, 6, 3, generator=gen, dtype=F64)
    xi = torch.randn(2, 6, 3, generator=gen, dtype=F64)
    got = gs.acceleration({"m:x": f}, gs._inv_gram({"m:x": f}), {"m:x": xi})["m:x"]
    for b in range(2):
        torch.testing.assert_close(got[b].reshape(-1), _euler_lagrange(f[b], xi[b]),
                                   atol=1e-10, rtol=1e-10)
    w = torch.tensor([0.5, -2.0, 3.0], dtype=F64)
    z = torch.tensor([0.1, 0.3, -0.2], dtype=F64)
    exact = w * torch.exp(z / w)  # the geodesic of (xi / w)^2 at t = 1
    second = gs.geodesic_point({"e:w": w}, {}, {"e:w": z})["e:w"]
    assert float((second - exact).abs().max()) <= 2e-3  # third-order remainder
    acc = gs.acceleration({"e:w": w}, {}, {"e:w": z})["e:w"]
    torch.testing.assert_close(acc, z * z / w, atol=1e-15, rtol=0)  # (w e^{tz/w})'' at 0


def test_seeded_and_refuses_an_unknown_kind_and_a_dead_unit(tiny):
    split = synthetic_split(tiny, 4)
    a = gs.geodesic_sharpness(tiny, None, split, samples=2, seed=5, dtype=F64)
    b = gs.geodesic_sharpness(tiny, None, split, samples=2, seed=5, dtype=F64)
    c = gs.geodesic_sharpness(tiny, None, split, samples=2, seed=6, dtype=F64)
    assert a["rises"] == b["rises"] != c["rises"] and len(a["rises"]) == 2
    with pytest.raises(RotvizError, match="use average or worst"):
        gs.geodesic_sharpness(tiny, None, split, kind="best")
    dead = clone_state(tiny.state)
    view = read_view(tiny.spec, tiny.config, dead)
    w_in = view.blocks[0].ffn.w_in.clone()
    w_in[0] = 0
    b_in = view.blocks[0].ffn.b_in
    ffn = replace(view.blocks[0].ffn, w_in=w_in,
                  b_in=None if b_in is None else torch.cat([b_in.new_zeros(1), b_in[1:]]))
    dead = write_state(view.with_block(0, replace(view.blocks[0], ffn=ffn)))
    with pytest.raises(RotvizError, match="rank-deficient"):
        gs.geodesic_sharpness(tiny, dead, split, dtype=F64)


def test_second_order_is_the_riemannian_hessian_quadratic_form(saved):
    """Along the second-order geodesic f(t) = L(theta + t xi + t^2 a / 2), f''(0) is the
    quadratic form of the Riemannian Hessian on the horizontal space, xi^T H xi + grad . a
    (H, grad: the Euclidean Hessian and gradient, by rotviz.analysis.hvp here); f''(0) by a
    central difference of the measure's own losses. On the ViT: the Llama's rotary tables
    are float32 even in a float64 model, too coarse for a second difference."""
    tiny = load_model(saved("vit", 0, **SMALL), dtype=F64)
    split = synthetic_split(tiny, 6)
    land = gs.Landscape(tiny, None, split, dtype=F64)
    xi = land.direction(torch.Generator().manual_seed(1), 1.0, sphere=True)
    acc = gs.acceleration(land.fs, land.p, xi)
    cur = land.cur

    def flat(fs) -> torch.Tensor:
        zero = {k: torch.zeros_like(v) for k, v in land.fs.items()}
        st = write_state(gs.rebuild(land.view, {**zero, **fs}))
        return cur.flat([st[n].to(F64) for n in cur.names])

    v, a = flat(xi), flat(acc)
    direct = float(v @ cur.hvp(v) + cur.gradient() @ a)
    h = 1e-4

    def f(t: float) -> float:
        return land.loss({k: land.fs[k] + t * xi[k] + 0.5 * t * t * acc[k] for k in xi})

    second = (f(h) - 2 * f(0.0) + f(-h)) / h ** 2
    assert second == pytest.approx(direct, rel=1e-6, abs=1e-9)
    # and it is not the Euclidean quadratic form alone: the Christoffel term counts
    assert abs(direct - float(v @ cur.hvp(v))) > 1e-3 * abs(direct)


def test_conjugate_gradients_give_the_direct_projection(tiny, monkeypatch):
    """Heads wider than gs.DIRECT solve the Gram system by conjugate gradients: the same
    projection as the direct solve."""
    land = gs.Landscape(tiny, None, synthetic_split(tiny, 4), dtype=F64)
    xi = gs.draw(land.fs, land.chunk, torch.Generator().manual_seed(2))
    direct = gs.horizontal(land.view, land.fs, land.p, xi)
    monkeypatch.setattr(gs, "DIRECT", 0)
    cg = gs.horizontal(land.view, land.fs, land.p, xi)
    err = float(gs.norm(land.fs, land.p, {k: cg[k] - direct[k] for k in xi}))
    assert err <= 1e-8 * float(gs.norm(land.fs, land.p, xi))

"""Slices around any point of a pair, with every direction kind and the symmetry-aware
`unit` normalisation (rotviz.analysis.directions: slice_around, slice_with):
each centre's loss against the point evaluated by an independent float64 forward pass, the
toward direction reaching B' at x = 1, gauge-fixed directions orthogonal to every tangent
(the dense tangent matrix), the loss along a tangent even in x (no first-order term) beside
a random direction's slope, unit norms per FFN unit and per head (read off the ViT's tensor
names, and through the view for gpt2 and llama), unit normalisation commuting with a planted
permutation and rotation where filter normalisation does not, and the CLI's --source."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_landscape import synthetic_split
from test_slices import _moved
from test_tangents import f64_loss

from rotviz.analysis.directions import (
    drawn,
    normalise_all,
    random_directions,
    symmetry_directions,
    unit_normalise,
)
from rotviz.analysis.loss_grid import slice_at
from rotviz.analysis.tangents import (
    f64_view,
    gauge_fixed,
    generators,
    parameter_names,
    tangents,
)
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.match.endpoints import match_endpoints
from rotviz.measures.slice import slice_around, slice_with
from rotviz.models import Loaded, load_model
from rotviz.symmetry.actions import random_element
from rotviz.symmetry.view import read_view

SMALL = dict(layers=1, d=8, heads=2, ffn=16)  # d_h = 4; llama: one KV group of two heads
F64 = torch.float64


@pytest.fixture(scope="module")
def small(saved):
    """`small(family, seed)`: a float64 SMALL model (cached for this module)."""
    cache: dict[tuple, Loaded] = {}

    def get(fam: str, seed: int = 0) -> Loaded:
        if (fam, seed) not in cache:
            cache[fam, seed] = load_model(saved(fam, seed, **SMALL), dtype=F64)
        return cache[fam, seed]

    return get


def direct_loss(model: Loaded, state: dict, split) -> float:
    """The split's mean loss at `state`, by a plain float64 forward pass (test_tangents)."""
    names = [n for n, _ in model.model.named_parameters()]
    return float(f64_loss(model, split)({n: state[n].to(F64) for n in names}))


def _movable(model: Loaded) -> set[str]:
    return {n for n, _ in model.model.named_parameters()}


def test_each_centre_is_that_point(small):
    """anchor, source, matched, path and merged: the slice's centre loss equals the point's
    own loss by an independent forward pass (1e-6), and the grid's middle is that point."""
    a, b = small("vit", 0), small("vit", 1)
    split = synthetic_split(a, n=12)
    ends = match_endpoints(a, b, "seed")
    moved = max(float((ends.matched[k] - b.state[k]).abs().max()) for k in b.state)
    assert moved > 0.05  # B' is not B: the matched centre is another point
    mix = {k: (0.7 * v.double() + 0.3 * ends.matched[k].double()).to(v.dtype)
           for k, v in a.state.items()}
    half = {k: (0.5 * v.double() + 0.5 * ends.matched[k].double()).to(v.dtype)
            for k, v in a.state.items()}
    want = {"anchor": a.state, "source": b.state, "matched": ends.matched, "path": mix,
            "merged": half}
    losses = {}
    for around, state in want.items():
        alpha = 0.3 if around == "path" else 0.5
        s = slice_around(ends, split, around, alpha, directions="random", dims=1, grid=3,
                         span=0.5, seed=2)
        direct = direct_loss(a, state, split)
        assert s.centre_loss == pytest.approx(direct, rel=1e-6, abs=1e-6), around
        assert s.loss[1] == s.centre_loss and s.around == around
        assert (s.source == b.ref) == (around != "anchor")
        losses[around] = direct
    # matching keeps the function: B and B' have one loss; the path's middle does not
    assert losses["matched"] == pytest.approx(losses["source"], rel=1e-9)
    assert abs(losses["path"] - losses["anchor"]) > 1e-3
    one = match_endpoints(a, a, None)
    with pytest.raises(RotvizError, match="--around matched needs a second model"):
        slice_around(one, split, "matched")
    with pytest.raises(RotvizError, match="unknown --around 'middle'"):
        slice_around(ends, split, "middle")


def test_toward_reaches_the_target_at_one(small):
    """--directions toward, --norm none, biases kept: x = 1 is B' (or B with toward source),
    its loss equal to the target's own (1e-6); in 2D the second axis is orthogonal."""
    a, b = small("vit", 0), small("vit", 1)
    split = synthetic_split(a, n=12)
    ends = match_endpoints(a, b, "seed")
    kw = dict(directions="toward", norm="none", keep_1d=True, grid=3, span=1.0)
    for toward, state in (("matched", ends.matched), ("source", b.state)):
        s = slice_around(ends, split, toward=toward, dims=1, **kw)
        direct = direct_loss(a, state, split)
        assert s.loss[2] == pytest.approx(direct, rel=1e-6, abs=1e-6), toward
        assert s.target_loss == pytest.approx(direct, rel=1e-6) and s.target_x == 1.0
        assert s.direction_norms[0] == pytest.approx(float(sum(
            (state[k].double() - a.state[k].double()).pow(2).sum() for k in _movable(a)) ** 0.5),
            rel=1e-9)
    # from a point of the path, x = 1 is still B'
    s = slice_around(ends, split, "path", 0.4, dims=1, **kw)
    assert s.loss[2] == pytest.approx(direct_loss(a, ends.matched, split), rel=1e-6, abs=1e-6)
    plane = slice_around(ends, split, dims=2, **{**kw, "norm": "filter"})
    assert abs(plane.cosine) <= 1e-9 and plane.target_x is None
    (r,) = random_directions(Evaluator(a, split).params(a.state), _movable(a), 1, 0, "filter",
                             True)
    length = float(sum(v.double().pow(2).sum() for v in r.values())) ** 0.5
    assert plane.direction_norms[1] == pytest.approx(length, rel=1e-6)  # d2 keeps its length
    with pytest.raises(RotvizError, match="--directions toward needs a second model"):
        slice_around(match_endpoints(a, a, None), split, directions="toward")


@pytest.mark.parametrize("fam", ["vit", "llama"])
def test_gauge_directions_are_orthogonal_to_every_tangent(small, fam):
    """Each gauge direction's inner product with every block tangent of the dense tangent
    matrix (the blocks' Q-K, V-O and FFN maps; the residual stream's map, which moves every
    block at once, is not projected out: docs/landscape.md) is at most 1e-6 of |d| |t|,
    under filter and unit normalisation, biases zeroed or kept;
    with biases zeroed it stays zero on them. A random direction is the negative control, and
    a tangent direction lies in the tangents' span."""
    model = small(fam)
    theta = Evaluator(model, synthetic_split(model, n=4)).params(model.state)
    names, t, _ = tangents(model, model.state,
                           generators(f64_view(model, model.state), residual=False))
    tn = t.norm(dim=1)

    def worst(d: dict) -> float:
        v = torch.cat([d[n].to(F64).reshape(-1) for n in names])
        return float(((t @ v).abs() / (tn * v.norm())).max())

    for norm in ("filter", "unit"):
        for keep in (False, True):
            ds, reported = symmetry_directions(model, theta, _movable(model), 2, 3, norm, keep,
                                               "gauge")
            for d in ds:
                assert worst(d) <= 1e-6, (norm, keep)
                if not keep:
                    assert all(bool((d[n] == 0).all()) for n in names if d[n].dim() == 1)
            assert reported <= 1e-6
            (r,) = drawn(model, theta, _movable(model), 1, 3, norm, keep)
            assert worst(r) > 1e-3  # the same draw before gauge fixing
    (tg,), _ = symmetry_directions(model, theta, _movable(model), 1, 3, "filter", False,
                                   "tangent")
    v = torch.cat([tg[n].to(F64).reshape(-1) for n in names])
    assert float(gauge_fixed(v, t).norm()) <= 1e-8 * float(v.norm())  # inside span(T)


def test_the_loss_along_a_tangent_has_no_first_order_term(small):
    """Along a tangent direction the 1D slice is flat to second order at 0: the line through
    the centre changes the products of the maps only by -x^2 E^2, so L(x) = L(-x) (1e-10)
    and L(2h) - L(0) = 4 (L(h) - L(0)) to 2 %, while a random direction of the same length
    has a clear slope."""
    model = small("vit")
    split = synthetic_split(model, n=12)
    ev = Evaluator(model, split)
    h = 0.02
    kw = dict(dims=1, grid=5, span=2 * h, seed=4, evaluator=ev)
    tan = np.asarray(slice_with(model, split, directions="tangent", **kw).loss)
    rnd = np.asarray(slice_with(model, split, directions="random", **kw).loss)
    assert abs(tan[3] - tan[1]) <= 1e-10 * tan[2] and abs(tan[4] - tan[0]) <= 1e-10 * tan[2]
    assert (tan[4] - tan[2]) == pytest.approx(4 * (tan[3] - tan[2]), rel=0.02)
    assert abs(tan[3] - tan[2]) > 1e-9  # not a degenerate (zero) direction
    slope = abs(rnd[3] - rnd[1]) / (2 * h)
    assert slope > 1e-3 and slope > 100 * abs(tan[3] - tan[1]) / (2 * h)


def _vit_groups(model: Loaded, d: dict) -> list[float]:
    """Per-head and per-unit norms of the tiny ViT, read off its tensor names."""
    p = "vit.layers.0."
    dims = read_view(model.spec, model.config, model.state).dims
    dh = dims.d_head
    q, k, v, o = (d[f"{p}attention.{r}_proj.weight"] for r in "qkvo")
    out = []
    for h in range(dims.n_heads):
        rows = slice(h * dh, (h + 1) * dh)
        out.append(float(sum(x[rows].double().pow(2).sum() for x in (q, k, v))
                         + o[:, rows].double().pow(2).sum()) ** 0.5)
    fc1, fc2 = d[f"{p}mlp.fc1.weight"], d[f"{p}mlp.fc2.weight"]
    for u in range(fc1.shape[0]):
        out.append(float(fc1[u].double().pow(2).sum() + fc2[:, u].double().pow(2).sum()) ** 0.5)
    return out


def _view_groups(model: Loaded, d: dict) -> list[float]:
    """Per KV group and per FFN unit norms through the canonical view (gated: gate row)."""
    view = read_view(model.spec, model.config, {**model.state, **d})
    out = []
    for blk in view.blocks:
        a, f = blk.attn, blk.ffn
        r = a.n_heads // a.n_kv_heads
        for g in range(a.n_kv_heads):
            hs = slice(g * r, (g + 1) * r)
            out.append(float(sum(x.double().pow(2).sum() for x in
                                 (a.wq[hs], a.wk[g], a.wv[g], a.wo[hs]))) ** 0.5)
        for u in range(f.w_in.shape[0]):
            parts = [f.w_in[u], f.w_out[:, u]] + ([f.w_gate[u]] if f.w_gate is not None else [])
            out.append(float(sum(x.double().pow(2).sum() for x in parts)) ** 0.5)
    return out


@pytest.mark.parametrize("fam", ["vit", "gpt2", "llama"])
def test_unit_normalisation_gives_each_unit_and_head_its_weights_norm(small, fam):
    """--norm unit: every head's (KV group's) Q, K, V rows and O columns together, and every
    FFN unit's rows and column together, have the norm of the same weights (1e-6); the
    other tensors are filter normalised (row norms), 1-D tensors zeroed."""
    model = small(fam)
    theta = Evaluator(model, synthetic_split(model, n=4)).params(model.state)
    (d,) = drawn(model, theta, _movable(model), 1, 5, "unit", False)
    groups = _vit_groups if fam == "vit" else _view_groups
    got, want = groups(model, d), groups(model, model.state)
    assert len(got) >= 17  # heads (KV groups) and units
    np.testing.assert_allclose(got, want, rtol=1e-6)
    (f,) = random_directions(theta, _movable(model), 1, 5, "filter")
    assert np.abs(np.asarray(groups(model, f)) / np.asarray(want) - 1).max() > 1e-2
    view = read_view(model.spec, model.config, model.state)
    blocks = set()
    for i in range(view.dims.n_layers):
        prefix = view.layout.blocks[i]
        blocks |= {k for k in theta if k.startswith(prefix)}
    for k, w in theta.items():
        if w.dim() == 1:
            assert bool((d[k] == 0).all()), k
        elif k not in blocks and k in _movable(model):  # embeddings, head: filter rows
            rows = d[k].reshape(w.shape[0], -1).norm(dim=1)
            torch.testing.assert_close(rows, w.reshape(w.shape[0], -1).norm(dim=1),
                                       rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("fam", ["vit", "llama"])
def test_unit_normalisation_commutes_with_permutations_and_rotations(small, fam):
    """Normalising the moved draw at the moved weights equals moving the normalised draw
    (1e-10), so the slice of a permuted and rotated copy with its own unit-normalised
    directions equals the original's (1e-5). Filter normalisation mixes a head's rows under
    a rotation: its slice of the copy differs (the negative control)."""
    model = small(fam)
    split = synthetic_split(model, n=12)
    ev = Evaluator(model, split)
    theta = ev.params(model.state)
    element = random_element(read_view(model.spec, model.config, model.state).dims, 5,
                             ffn=True, attn=True, rescale=False)
    raw = random_directions(theta, _movable(model), 2, 6, "none", True)
    moved_theta = ev.params(_moved(model, model.state, element))
    moved_raw = [ev.params(_moved(model, r, element)) for r in raw]
    mv = _movable(model)
    unit = [normalise_all(model, r, theta, "unit", False, mv) for r in raw]
    unit_moved = [normalise_all(model, r, moved_theta, "unit", False, mv) for r in moved_raw]
    for u, um in zip(unit, unit_moved, strict=True):
        want = ev.params(_moved(model, u, element))
        assert max(float((um[k] - want[k]).abs().max()) for k in want) <= 1e-10
    kw = dict(dims=2, grid=5, span=0.8, evaluator=ev)
    s = np.asarray(slice_at(model, split, given=unit, **kw).loss)
    t = np.asarray(slice_at(model, split, point=moved_theta, given=unit_moved, **kw).loss)
    assert s.max() - s.min() > 0.01
    np.testing.assert_allclose(t, s, rtol=1e-5, atol=1e-5)
    filt = [normalise_all(model, r, theta, "filter", False, mv) for r in raw]
    filt_moved = [normalise_all(model, r, moved_theta, "filter", False, mv) for r in moved_raw]
    fs = np.asarray(slice_at(model, split, given=filt, **kw).loss)
    ft = np.asarray(slice_at(model, split, point=moved_theta, given=filt_moved, **kw).loss)
    assert np.abs(ft - fs).max() > 1e-4
    # one seed, one draw: outside the blocks (embeddings, head) unit is filter, bit for bit
    u0 = unit_normalise(model, raw[0], theta)
    outside = [n for n in parameter_names(model) if theta[n].dim() > 1 and
               not n.startswith(read_view(model.spec, model.config, model.state).layout.blocks)]
    assert outside and all(torch.equal(u0[n], filt[0][n]) for n in outside)


def test_the_cli_slices_around_the_matched_source(tmp_path, capsys):
    """`rotviz slice MODEL --source B --around matched`: the JSON says where it is centred;
    options that need a second model without one, and one that nothing uses, are refused
    in one line before any model is loaded."""
    a, b = "zoo:vit-digits-s3", "zoo:vit-digits-s6"
    js = tmp_path / "s.json"
    rc = main(["slice", a, "--source", b, "--around", "matched", "--match", "seed", "--data",
               "digits", "--dims", "1", "--grid", "3", "--device", "cpu", "--json", str(js)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0 and last.startswith(f"slice of {a} around {b} matched onto it (seed)")
    got = json.loads(js.read_text())
    assert (got["around"], got["source"], got["match"], got["alpha"]) == \
        ("matched", b, "seed", None)
    for argv, msg in (
            (["--around", "matched"], "--around matched needs a second model: add --source"),
            (["--directions", "toward"], "--directions toward needs a second model"),
            (["--source", b], "--source is used only with --around source, matched, path"),
            (["--alpha", "0.3"], "--alpha needs --around path or merged"),
            (["--match", "seed"], "--match matches a second model: add --source"),
            (["--source", b, "--toward", "source"], "--toward needs --directions toward")):
        assert main(["slice", a, "--data", "digits", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and msg in err, (argv, err)


def test_hessian_directions_under_unit_normalisation(small):
    """--directions hessian --norm unit: the eigenvectors of the same Lanczos run (equal
    eigenvalues), each then unit normalised: the groups and the filter rows partition the
    moved entries, so |d| is the norm of the 2-D (and larger) weights (1e-6)."""
    model = small("vit")
    split = synthetic_split(model, n=12)
    ev = Evaluator(model, split)
    kw = dict(dims=1, grid=3, span=0.5, directions="hessian", steps=20, evaluator=ev)
    s = slice_with(model, split, norm="unit", **kw)
    ref = slice_with(model, split, norm="none", **kw)
    assert (s.directions, s.norm) == ("hessian", "unit")
    assert s.eigenvalues == pytest.approx(ref.eigenvalues, rel=1e-9)
    weights = float(sum(w.double().pow(2).sum() for n, w in model.state.items()
                        if n in _movable(model) and w.dim() > 1)) ** 0.5
    assert s.direction_norms[0] == pytest.approx(weights, rel=1e-6)
    assert ref.direction_norms[0] == pytest.approx(1.0, rel=1e-6)  # a unit eigenvector
    with pytest.raises(RotvizError, match="unknown --norm 'rows': use one of filter, layer, "
                                          "unit, none"):
        slice_with(model, split, norm="rows")

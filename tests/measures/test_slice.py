"""The slice record (rotviz.measures.slice; its grid rotviz.analysis.loss_grid, its directions
rotviz.analysis.directions): filter normalisation row by row, 1-D tensors zeroed or kept,
the centre is the model's own loss, a slice is equivariant under a planted permutation and
rotation, seeded, random directions drawn tensor by tensor (the order the tensors are read
in does not change them), and the CLI writes its JSON.

Slices around any point of a pair, with every direction kind and the symmetry-aware `unit`
normalisation (slice_around, slice_with): each centre's loss against the point evaluated by
an independent float64 forward pass, the toward direction reaching B' at x = 1, gauge-fixed
directions orthogonal to every tangent (the dense tangent matrix), the loss along a tangent
even in x (no first-order term) beside a random direction's slope, unit norms per FFN unit
and per head (read off the ViT's tensor names, and through the view for gpt2 and llama),
unit normalisation commuting with a planted permutation and rotation where filter
normalisation does not, and the CLI's --source.

At size (rotviz.atsize.slice): on endpoints streamed from checkpoint folders, each point built
block by block, the slice gives the in-memory results; Hessian directions are refused there
in one line, from the library and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import clone_state, view_of
from pairs import assert_close, default_pair_refs, synthetic_split
from test_plots import _check_frame
from test_tangents import f64_loss

from rotviz import measure
from rotviz.analysis.directions import (
    drawn,
    normalise,
    normalise_all,
    random_directions,
    symmetry_directions,
    unit_normalise,
)
from rotviz.analysis.loss_grid import slice_at, slice_with
from rotviz.analysis.tangents import (
    f64_view,
    gauge_fixed,
    generators,
    parameter_names,
    tangents,
)
from rotviz.atsize.blocks import open_streamed
from rotviz.atsize.endpoints import streamed_endpoints
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.match.endpoints import match_endpoints
from rotviz.measures.slice import slice_around
from rotviz.sources.loading import Loaded, load_model
from rotviz.symmetry.actions import apply, random_element
from rotviz.symmetry.view import read_view, write_state


def _movable(model) -> set[str]:
    return {n for n, _ in model.model.named_parameters()}


def _params(model) -> dict[str, torch.Tensor]:
    return {n: model.state[n] for n in _movable(model)}


@pytest.mark.parametrize("keep", [False, True])
def test_filter_normalised_rows_have_the_weights_row_norms(loaded, keep):
    model = loaded("vit", dtype=torch.float64)
    before = clone_state(model.state)
    params = _params(model)
    (d,) = random_directions(params, _movable(model), 1, seed=3, norm="filter", keep_1d=keep)
    n_rows = n_one = 0
    for k, w in params.items():
        if w.dim() >= 2:
            rows_d = d[k].reshape(w.shape[0], -1).norm(dim=1)
            rows_w = w.reshape(w.shape[0], -1).norm(dim=1)
            torch.testing.assert_close(rows_d, rows_w, rtol=1e-6, atol=1e-6)
            n_rows += w.shape[0]
        else:  # biases, norm gains: zeroed (biasbn off), or kept with each entry's size
            n_one += 1
            if keep:
                torch.testing.assert_close(d[k].abs(), w.abs(), rtol=1e-6, atol=1e-6)
                assert bool((d[k] != 0).any()) or not bool((w != 0).any()), k
            else:
                assert bool((d[k] == 0).all()), k
    assert n_rows > 100 and n_one > 5  # the tiny ViT has both kinds
    for k in before:  # the loaded model is untouched
        assert torch.equal(before[k], model.state[k]), k


def test_layer_and_none_normalisation():
    gen = torch.Generator().manual_seed(0)
    w, d = torch.randn(6, 5, generator=gen), torch.randn(6, 5, generator=gen)
    assert float(normalise(d, w, "layer").norm()) == pytest.approx(float(w.norm()), rel=1e-6)
    assert torch.equal(normalise(d, w, "none"), d)
    b = torch.randn(6, generator=gen)
    assert bool((normalise(b, b, "layer") == 0).all())  # a 1-D tensor is zeroed by default
    assert float(normalise(d[0], b, "layer", keep_1d=True).norm()) == pytest.approx(
        float(b.norm()), rel=1e-6)
    with pytest.raises(RotvizError, match="unknown --norm 'rows'"):
        normalise(d, w, "rows")


def test_the_centre_is_the_models_own_loss(loaded):
    model = loaded("vit")
    split = synthetic_split(model, n=12)
    s = slice_at(model, split, dims=2, grid=5, span=0.5, seed=1)
    # an independent computation: the model's own forward pass and cross-entropy
    with torch.no_grad():
        logits = model.model(pixel_values=split.inputs).logits
    want = float(F.cross_entropy(logits.double(), split.labels))
    assert s.loss[2][2] == s.centre_loss  # x = y = 0 is the point itself
    assert s.centre_loss == pytest.approx(want, rel=1e-6, abs=1e-6)
    assert s.centre_acc == pytest.approx(float((logits.argmax(-1) == split.labels)
                                               .double().mean()), abs=1e-12)
    z = np.asarray(s.loss)
    assert z.shape == (5, 5) and np.isfinite(z).all() and z.max() > z[2, 2] + 1e-3
    assert s.xs == pytest.approx([-0.5, -0.25, 0.0, 0.25, 0.5])
    line = slice_at(model, split, dims=1, grid=3, span=0.5, seed=1)
    assert len(line.loss) == 3 and line.ys == [] and line.loss[1] == pytest.approx(want,
                                                                                   rel=1e-6)


def _moved(model, state: dict[str, torch.Tensor], element) -> dict[str, torch.Tensor]:
    """`state` (the model's keys; a direction filled with the model's other tensors) moved
    by a symmetry element; the element is linear in each tensor, so directions move alike."""
    full = {k: state.get(k, v) for k, v in model.state.items()}
    return write_state(apply(read_view(model.spec, model.config, full), element))


def test_a_slice_is_equivariant_under_a_planted_permutation_and_rotation(loaded):
    model = loaded("vit", dtype=torch.float64)
    split = synthetic_split(model, n=12)
    ev = Evaluator(model, split)
    element = random_element(view_of(model).dims, 5, ffn=True, attn=True, rescale=False)
    ds = random_directions(ev.params(model.state), _movable(model), 2, seed=2)
    point = _moved(model, model.state, element)
    moved_ds = [_moved(model, d, element) for d in ds]
    assert max(float((point[k] - model.state[k]).abs().max()) for k in point) > 0.1  # it moved
    assert max(float((moved_ds[0][k] - ds[0][k]).abs().max()) for k in ds[0]) > 0.1
    kw = dict(dims=2, grid=5, span=0.8, evaluator=ev)
    s = slice_at(model, split, given=ds, **kw)
    t = slice_at(model, split, point=point, given=moved_ds, **kw)
    a, b = np.asarray(s.loss), np.asarray(t.loss)
    assert a.max() - a.min() > 0.05  # a slice with relief, not a flat one
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(t.acc), np.asarray(s.acc), atol=1e-12)
    # the seeded slice is the slice along exactly these directions
    seeded = slice_at(model, split, seed=2, **kw)
    assert seeded.loss == s.loss
    # negative control: the moved point along the unmoved directions is another slice
    other = np.asarray(slice_at(model, split, point=point, given=ds, **kw).loss)
    assert np.abs(other - a).max() > 1e-3


def test_slices_are_seeded(loaded):
    model = loaded("vit")
    split = synthetic_split(model, n=12)
    ev = Evaluator(model, split)
    one = slice_at(model, split, dims=1, grid=5, seed=7, evaluator=ev)
    two = slice_at(model, split, dims=1, grid=5, seed=7, evaluator=ev)
    three = slice_at(model, split, dims=1, grid=5, seed=8, evaluator=ev)
    assert one.loss == two.loss and one.direction_norms == two.direction_norms
    assert np.abs(np.asarray(three.loss) - np.asarray(one.loss)).max() > 1e-4
    p = _params(model)
    d7, d7b = (random_directions(p, _movable(model), 2, 7) for _ in range(2))
    assert all(torch.equal(d7[i][k], d7b[i][k]) for i in range(2) for k in p)
    with pytest.raises(RotvizError, match="--span must be"):
        slice_at(model, split, span=0.0)
    with pytest.raises(RotvizError, match="needs 2 directions, got 1"):
        slice_at(model, split, given=d7[:1])


def test_the_cli_writes_the_slice_json(tmp_path, capsys):
    from rotviz.measures import measurement
    from rotviz.measures.slice import slice_figure
    from rotviz.plots.surface import loss_surface, slice_panels

    js = tmp_path / "s.json"
    rc = main(["slice", "zoo:vit-digits-s3", "--data", "digits", "--dims", "1", "--grid", "3",
               "--span", "0.5", "--norm", "layer", "--biases", "keep", "--seed", "4",
               "--device", "cpu", "--json", str(js)])
    last = capsys.readouterr().out.strip().splitlines()[-1]  # after the progress counter
    assert rc == 0 and last.startswith("slice of zoo:vit-digits-s3, 3-point line on cpu")
    got = json.loads(js.read_text())
    assert {"dims", "xs", "ys", "loss", "acc", "centre_loss", "centre_acc", "directions",
            "norm", "keep_1d", "grid", "span", "seed", "data", "split", "n", "model",
            "direction_norms"} <= set(got)
    assert (got["dims"], got["norm"], got["keep_1d"], got["seed"], got["grid"]) == \
        (1, "layer", True, 4, 3)
    assert got["xs"] == [-0.5, 0.0, 0.5] and got["loss"][1] == got["centre_loss"]
    m = measurement("slice")
    assert not m.pair and m.at_size is not None and m.why_not_at_size() is None  # runs at size
    assert m.rows(got)[1] == {"x": 0.0, "loss": got["loss"][1], "acc": got["acc"][1]}
    assert main(["slice", "zoo:vit-digits-s3", "--data", "digits", "--norm", "rows"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown --norm 'rows': use one of filter, layer" in err
    # the figures: a line in 1D; a contour and a 3D surface in 2D on one colour scale
    _check_frame(slice_figure(got), "Test loss on a random line")
    _check_frame(slice_figure(got, log=True), "Test loss on a random line")
    flat = {**got, "dims": 2, "ys": got["xs"], "loss": [[1.0, 2.0, 3.0]] * 3,
            "acc": [[0.5] * 3] * 3}
    fig = slice_figure(flat, log=True, zmin=0.1, zmax=10.0)
    _check_frame(fig, "Test loss on a random plane")
    kinds = [t.type for t in fig.data]
    assert "contour" in kinds and "surface" in kinds
    contour = next(t for t in fig.data if t.type == "contour")
    surface = next(t for t in fig.data if t.type == "surface")
    assert (contour.zmin, contour.zmax) == (-1.0, 1.0) == (surface.cmin, surface.cmax)
    panels = slice_panels([flat, {**flat, "loss": [[4.0] * 3] * 3}], ["A", "B'"])
    assert {(t.zmin, t.zmax) for t in panels.data} == {(1.0, 4.0)}
    _check_frame(panels, "one colour scale")
    plane = {"xs": [0.0, 1.0], "ys": [0.0, 1.0], "loss": [[1.0, 2.0], [3.0, 4.0]],
             "points": {"A": [0.0, 0.0], "B": [1.0, 0.0], "B'": [0.5, 1.0]},
             "point_loss": {"A": 1.0, "B": 2.0, "B'": 1.5}}
    surf = loss_surface(plane)
    _check_frame(surf, "surface on the plane through A, B and B'")
    marks = [t for t in surf.data if t.type == "scatter3d"]
    assert [t.text[0] for t in marks] == ["A", "B", "B'"] and marks[2].z[0] == 1.5
    assert surf.layout.title.text and surf.layout.xaxis.title.text


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


def test_random_directions_do_not_depend_on_the_order_of_the_tensors(loaded):
    model = loaded("vit")
    params = {n: model.state[n] for n, _ in model.model.named_parameters()}
    movable = set(params)
    fwd = random_directions(params, movable, 2, seed=5)
    rev = random_directions(dict(reversed(params.items())), movable, 2, seed=5)
    half = random_directions({k: params[k] for k in list(params)[::2]}, movable, 2, seed=5)
    for i in range(2):
        assert all(torch.equal(fwd[i][k], rev[i][k]) for k in params)
        assert all(torch.equal(fwd[i][k], half[i][k]) for k in half[i])
    assert not torch.equal(fwd[0][next(iter(params))], fwd[1][next(iter(params))])
    other = random_directions(params, movable, 2, seed=6)
    big = [k for k, w in params.items() if w.dim() > 1]
    assert all(not torch.equal(fwd[0][k], other[0][k]) for k in big)


@pytest.mark.parametrize("fam", ["vit", "gpt2"])
def test_streamed_slice_equals_in_memory(fam, saved):
    """Loss and accuracy at every grid point to 1e-5 (relative), a plane with filter norms
    and biases zeroed, a line with layer norms and biases kept; GPT-2's head is tied."""
    path = str(saved(fam, 0))
    model = load_model(path)
    split = synthetic_split(model, 8)
    held = match_endpoints(model, model, None)
    with streamed_endpoints(open_streamed(path), open_streamed(path), None, "cpu") as ends:
        assert ends.at_size
        for opts in ({"dims": 2, "grid": 3, "seed": 3},
                     {"dims": 1, "grid": 5, "norm": "layer", "biases": "keep", "span": 0.5}):
            want = measure("slice", held, split, **opts)
            got = measure("slice", ends, split, **opts)
            for k in ("loss", "acc", "centre_loss", "centre_acc"):
                assert_close(getattr(want, k), getattr(got, k), k)
            assert_close(want.direction_norms, got.direction_norms, "direction norms")
            assert (want.cosine is None) == (got.cosine is None)
            assert want.xs == got.xs and want.ys == got.ys and got.model == path
            spread = np.ptp(np.asarray(got.loss))
            assert spread > 1e-3  # the points really moved
        with pytest.raises(RotvizError, match="--directions hessian are built from the whole") as e:
            measure("slice", ends, split, dims=1, directions="hessian")
        assert "\n" not in str(e.value)


def test_cli_slice_at_size_refuses_hessian_directions(capsys):
    """Hessian directions need the whole model: refused at size in one line. (At size
    equals in memory for the slice: tests/measures/test_every_record.py.)"""
    args = ["slice", default_pair_refs()[0], "--data", "digits", "--dims", "1", "--grid", "3",
            "--device", "cpu"]
    assert main([*args, "--directions", "hessian", "--max-memory", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--directions hessian" in err and "--max-memory" in err

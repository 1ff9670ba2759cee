"""Slices around a point (rotviz.analysis.loss_grid, the `slice` record): filter normalisation
row by row, 1-D tensors zeroed or kept, the centre is the model's own loss, a slice is
equivariant under a planted permutation and rotation, seeded, and the CLI writes its JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import clone_state, view_of
from test_landscape import synthetic_split
from test_plots import _check_frame

from rotviz.analysis.directions import normalise, random_directions
from rotviz.analysis.loss_grid import slice_at
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
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
    from rotviz.measures.slice import slice_figure, slice_panels
    from rotviz.plots.surface import loss_surface

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

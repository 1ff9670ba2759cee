"""Slices and layer-wise barriers at size (rotviz.stream.slices, rotviz.stream.layerwise):
on endpoints streamed from checkpoint folders, each point built block by block, they give the
in-memory results, in the library and through `--max-memory 0`; a slice's random directions
are drawn tensor by tensor, so the order the tensors are read in does not change them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_landscape import default_pair_refs, synthetic_split

from rotviz import measure
from rotviz.analysis.slices import random_directions
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.match.endpoints import match_endpoints
from rotviz.match.selection import match_options
from rotviz.models import load_model
from rotviz.stream.blocks import open_streamed
from rotviz.stream.endpoints import streamed_endpoints

REL = 1e-5


def _close(want, got, what: str) -> None:
    x, y = np.asarray(want, dtype=float), np.asarray(got, dtype=float)
    assert x.shape == y.shape, what
    assert np.abs(x - y).max() <= REL * max(1.0, np.abs(x).max()), what


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
                _close(getattr(want, k), getattr(got, k), k)
            _close(want.direction_norms, got.direction_norms, "direction norms")
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


@pytest.fixture(scope="module")
def streamed_pairs(saved):
    """Tiny pairs (ViT: separate Q/K/V; GPT-2: fused Q/K/V and a tied head), loaded and
    as folders."""
    out = {}
    for fam in ("vit", "gpt2"):
        paths = [str(saved(fam, s)) for s in (0, 1)]
        a, b = load_model(paths[0]), load_model(paths[1])
        out[fam] = (paths, a, b, synthetic_split(a, 8))
    return out


@pytest.mark.parametrize("fam,by,match,compare", [
    ("vit", "block", "seed", "yes"), ("vit", "kind", "seed", "no"),
    ("gpt2", "kind", "seed", "yes"), ("gpt2", "block", "none", "yes")])
def test_streamed_layerwise_equals_in_memory(streamed_pairs, fam, by, match, compare):
    """Every group's and every cumulative step's losses and accuracies, the barriers and
    rises, matched and unmatched, to 1e-5 (the streamed match writes float32 files, so the
    matched source agrees with the held one to about 1e-7, not bit for bit)."""
    paths, a, b, split = streamed_pairs[fam]
    held = match_endpoints(a, b, match_options(match))
    want = measure("layerwise", held, split, points=3, by=by, compare=compare)
    with streamed_endpoints(open_streamed(paths[0]), open_streamed(paths[1]),
                            match_options(match), "cpu") as ends:
        got = measure("layerwise", ends, split, points=3, by=by, compare=compare)
    w, g = want.to_dict(), got.to_dict()
    for k in ("seconds", "device"):
        w.pop(k), g.pop(k)
    assert set(w) == set(g)
    for k, v in w.items():
        if v is None or isinstance(v, str) or (isinstance(v, list) and isinstance(v[0], str)):
            assert v == g[k], k
        elif k in ("anchor", "source", "layers", "n", "match"):
            assert v == g[k], k
        else:
            _close(v, g[k], k)
    assert (got.barrier_unmatched is None) == (compare == "no" or match == "none")
    assert max(got.barrier) > 1e-3 and got.groups[-1] in ("rest", "embeddings", "head")

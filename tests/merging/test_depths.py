"""Merging models of different depths (rotviz.analysis.depths, the merge record's
--depth-pairing and --depth-route): a deeper model made from a shallower one by inserting
identity blocks merges back to the shallower model's function, by similarity pairing and by
expansion; the pairing recovers a planted pairing; bad pairs get one line, exit 2."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import refused
from pairs import digits

from rotviz.analysis.depths import (
    block_similarity,
    groups_of,
    grown,
    pair_by_position,
    pair_by_similarity,
    same_depth,
    writes,
)
from rotviz.cli import main
from rotviz.measures.merge import merge
from rotviz.sources.loading import Loaded, load_model
from rotviz.sources.running import forward, probe_inputs
from rotviz.sources.stacking import block_state, depth, stacked
from rotviz.sources.writing import write_model
from rotviz.symmetry.view import resolve_layout

REAL = (0, 2, 3)  # where the shallow model's three blocks sit in the deep one (5 blocks)


def _silenced(model: Loaded, i: int) -> dict[str, torch.Tensor]:
    """Block i with its attention and FFN output projections zeroed (weights and biases),
    written here from the definition: the residual write is zero, the block the identity."""
    roles = resolve_layout(model.spec, model.state).roles
    outs = (roles["o"], roles["ffn_out"])
    return {k: torch.zeros_like(v) if k.rsplit(".", 1)[0] in outs else v.clone()
            for k, v in block_state(model, i).items()}


@pytest.fixture(scope="module")
def pair(saved, tmp_path_factory):
    """(shallow: a random 3-block ViT reading digits, deep: it with identity blocks at 1 and
    4 (copies of the block before, outputs silenced), both saved as model folders)."""
    a = load_model(saved("vit", 0, layers=3, labels=10))
    blocks = [block_state(a, 0), _silenced(a, 0), block_state(a, 1), block_state(a, 2),
              _silenced(a, 2)]
    b = stacked(a, blocks, "deep")
    folder = tmp_path_factory.mktemp("deep") / "deep"
    folder.mkdir()
    write_model(b, b.state, folder)
    return a, load_model(folder)


def test_the_deep_model_is_the_shallow_one(pair):
    a, b = pair
    x = probe_inputs(a, 6, 0)
    assert depth(a) == 3 and depth(b) == 5
    assert (forward(a, x) - forward(b, x)).abs().max() < 1e-5
    assert [w == 0 for w in writes(b)] == [False, True, False, False, True]


def test_pairing_recovers_a_planted_pairing(pair):
    """On a similarity matrix with a planted increasing map (1 there, noise below 0.9
    elsewhere) the dynamic programme finds it; on the planted pair of models the similarity
    of block outputs puts each real block in its own group, and expansion puts the shallow
    model's blocks exactly where they were planted."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        na, nb = 4, 9
        planted = sorted(torch.randperm(nb, generator=gen)[:na].tolist())
        sim = 0.9 * torch.rand(na, nb, generator=gen)
        for i, j in enumerate(planted):
            sim[i, j] = 1.0
        assert pair_by_similarity(sim.tolist()) == tuple(planted)
    assert pair_by_position(3, 5) == (1, 2, 4) and pair_by_position(2, 2) == (0, 1)
    assert groups_of((0, 2, 3), 5) == ((0,), (1, 2), (3, 4))

    a, b = pair
    sim = block_similarity(a, b, digits("train").subset(64))
    assert all(sim[i][j] == pytest.approx(1.0, abs=1e-9) for i, j in enumerate(REAL))
    p = pair_by_similarity(sim)
    groups = groups_of(p, 5)
    assert all(REAL[i] in g for i, g in enumerate(groups)), groups
    expanded, deep, info = same_depth(a, b, "similarity", "expand", digits("train").subset(64))
    assert info.slots == REAL and deep is b and depth(expanded) == 5


@pytest.mark.parametrize("route", ["groups", "expand"])
def test_identity_blocks_merge_back_to_the_shallow_function(pair, route):
    """Similarity pairing, weight matching, the simple average: the merged model computes
    the shallow model's function (1e-4), by collapsing the groups and by expansion."""
    a, b = pair
    test = digits("test").subset(96)
    r = merge(a, b, "simple", "seed", test, depth_route=route)
    d = r.depths
    assert d["blocks"] == [3, 5] and d["route"] == route and d["pairing"] == "similarity"
    shape = a if route == "groups" else b  # the merged model's depth
    x = probe_inputs(a, 8, 1)
    want = forward(a, x)
    got = forward(shape, x, r.state)
    assert (got - want).abs().max() < 1e-4
    assert r.acc == pytest.approx(d["shallow_acc"], abs=1e-12)
    assert d["shallow_acc"] == pytest.approx(d["deep_acc"], abs=1e-12)
    if route == "groups":
        assert all(w[g.index(j)] == 1.0 for w, g, j in zip(d["weights"], d["groups"], REAL,
                                                             strict=True))


def test_growing_keeps_the_function(pair):
    a, _ = pair
    g = grown(a, (0, 2, 4), "grown")
    x = probe_inputs(a, 4, 2)
    assert depth(g) == 5 and (forward(g, x) - forward(a, x)).abs().max() < 1e-5
    with pytest.raises(Exception, match="increasing slots"):
        grown(a, (0, 2, 2), "bad")


def test_cli_merges_two_depths_and_refuses_bad_pairs(pair, saved, capfd, ws):
    """The CLI reports the pairing and both models' accuracy; a pair of other widths or
    families, a deeper anchor, a method with a base, a record that measures one depth, at
    size and a mergekit file each get one line, exit 2, nothing written."""
    a, b = pair
    out = ws / "m.json"
    assert main(["merge", str(a.path), str(b.path), "--data", "digits", "--depth-pairing",
                 "position", "--json", str(out)]) == 0
    line = capfd.readouterr().out
    assert "depths 3 and 5 blocks by groups paired by position" in line and "deeper" in line
    d = json.loads(out.read_text())["depths"]
    assert d["paired"] == [1, 2, 4] and d["groups"] == [[0, 1], [2], [3, 4]]
    out.unlink()
    wide = saved("vit", 1, layers=5, labels=10, d=48)
    refused(["merge", str(a.path), str(wide), "--data", "digits"], capfd, ws, "differ")
    refused(["merge", str(a.path), str(saved("gpt2", 0)), "--data", "digits"], capfd, ws,
            "architectures")
    refused(["merge", str(b.path), str(a.path), "--data", "digits"], capfd, ws,
            "shallower model first")
    refused(["merge", str(a.path), str(b.path), "--data", "digits", "--method",
             "task_arithmetic", "--base", str(a.path)], capfd, ws, "3 blocks", "--base")
    refused(["distances", str(a.path), str(b.path)], capfd, ws, "one depth", "merge")
    refused(["merge", str(a.path), str(b.path), "--data", "digits", "--max-memory", "1KB"],
            capfd, ws, "in memory only")
    refused(["merge", str(a.path), str(b.path), "--data", "digits", "--depth-pairing",
             "position", "--mergekit-config", "m.yaml"], capfd, ws, "one depth")

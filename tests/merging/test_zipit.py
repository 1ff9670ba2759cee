"""ZipIt!: on a planted pair (a tiny ViT and a copy with its stream, FFN units and heads
permuted) the zip finds the planted correspondence and the full zip is the model (1e-4), and
so is a partial zip (the unmerge into each model's later blocks); a zip of no block is the
two models' ensemble (their mean logits); the greedy zip merges within a model when that is
the most correlated pair and beta allows it; bad input gets one line."""

from __future__ import annotations

import pytest
import torch

from rotviz.errors import RotvizError
from rotviz.merging import method
from rotviz.merging.combine import merge_many
from rotviz.merging.zipit import (
    STREAM,
    Zip,
    features,
    zip_groups,
    zip_models,
    zipped_logits,
)
from rotviz.sources.running import forward, probe_inputs
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import apply, random_element
from rotviz.symmetry.view import read_view, write_state
from tests.pairs import synthetic_split

TOL = 1e-4


@pytest.fixture(scope="module")
def planted(loaded):
    """(model, the planted copy's state, the stream permutation, the per-block transforms,
    both models' features on one synthetic split)."""
    a = loaded("vit")
    view, _ = rs.canonicalise(read_view(a.spec, a.config, a.state))
    perm = torch.randperm(view.dims.d_model, generator=torch.Generator().manual_seed(3))
    p = torch.eye(view.dims.d_model, dtype=view.blocks[0].attn.wq.dtype)[perm]  # x -> x P
    moves = random_element(view.dims, 5, ffn=True, attn=False, rescale=False, heads=True)
    copy = write_state(apply(rs.apply_residual(view, p, check=False), moves))
    split = synthetic_split(a, 48)
    stats = [features(a, s, split, "cpu", batches=2, batch_size=24) for s in (a.state, copy)]
    return a, copy, perm, moves, stats


def _inputs(a):
    return probe_inputs(a, 6, 1)


def test_the_planted_correspondence_is_recovered_and_the_zip_is_the_model(planted):
    a, copy, perm, moves, stats = planted
    z = zip_models(a, [a.state, copy], stats)
    # anchor stream feature i is source feature perm[i] (x_B = x_A P); all merges are across
    assert torch.equal(z.stream.across(), perm)
    for i, t in moves.items():
        assert torch.equal(z.ffn[i].across(), torch.argsort(t.perm))  # unit k of B: A's perm[k]
        assert torch.equal(t.heads[z.heads[i]], torch.arange(len(z.heads[i])))
    x = _inputs(a)
    want = forward(a, x)
    assert (forward(a, x, z.state()) - want).abs().max() < TOL
    # the same through the registry (merge_many -> the method's whole-model merge)
    merged = merge_many(a, "zipit", [a.state, copy], stats=stats)
    assert (forward(a, x, merged) - want).abs().max() < TOL
    # a partial zip: the merged stream unmerged into each model's own second block and head
    half = zip_models(a, [a.state, copy], stats, zip_layers=1)
    got = zipped_logits(a, half, next(iter(x.values())), "cpu")
    assert (got - want).abs().max() < TOL
    with pytest.raises(RotvizError, match="no single model"):
        half.state()


def test_no_block_zipped_is_the_ensemble(loaded, planted):
    a, b = loaded("vit"), loaded("vit", 1)
    split = synthetic_split(a, 48)
    stats = [features(a, s, split, "cpu", batches=2, batch_size=24) for s in (a.state, b.state)]
    assert stats[0][STREAM].shape == (48 * 17 * 3, 32)  # 17 tokens at 3 sites (2 blocks + end)
    z = zip_models(a, [a.state, b.state], stats, zip_layers=0)
    x = _inputs(a)
    want = (forward(a, x) + forward(a, x, b.state)) / 2
    got = zipped_logits(a, z, next(iter(x.values())), "cpu")
    assert (got - want).abs().max() < 1e-5  # float32 logits of two runs
    with pytest.raises(RotvizError, match=r"--zip-layers must be -1 \(all\) or from 0 to 2"):
        zip_models(a, [a.state, b.state], stats, zip_layers=3)


def test_the_greedy_zip_merges_within_a_model_when_beta_allows():
    # features A0 A1 | B0 B1; A0 and A1 are the most correlated pair
    corr = torch.tensor([[1.0, 0.9, 0.8, 0.2],
                         [0.9, 1.0, 0.3, 0.5],
                         [0.8, 0.3, 1.0, 0.1],
                         [0.2, 0.5, 0.1, 1.0]], dtype=torch.float64)
    # beta 1: one within merge per model; A0+A1 first, then its similarities are the smaller
    # of its members' times alpha (0.09, 0.06), so B0+B1 (0.1) is next
    assert zip_groups(corr, alpha=0.3, beta=1.0) == [[0, 1], [2, 3]]
    # beta 0: across only, greedily: A0-B0 (0.8), then A1-B1 (0.5)
    assert zip_groups(corr, alpha=0.3, beta=0.0) == [[0, 2], [1, 3]]
    z = Zip.of([[0, 1], [2, 3]], (0.25, 0.75))
    # the anchor's two features make merged feature 0, averaged; the source's feature 1
    assert torch.equal(z.unmerge[0], torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64))
    assert torch.equal(z.merge[1], torch.tensor([[0.0, 0.0], [0.5, 0.5]], dtype=torch.float64))
    assert z.across().tolist() == [-1, -1]
    # a merged feature of a model weighted 0 only: its members' plain mean, not 0 / 0
    z = Zip.of([[0, 1], [2, 3]], (1.0, 0.0))
    assert torch.equal(z.merge[1], torch.tensor([[0.0, 0.0], [0.5, 0.5]], dtype=torch.float64))


def test_the_record_and_its_refusals(loaded):
    m = method("zipit")
    assert m.needs_statistics and m.max_models == 2 and not m.at_size
    a = loaded("vit")
    with pytest.raises(RotvizError, match="combines 2 models, got 3"):
        merge_many(a, "zipit", [a.state] * 3, stats=[{}] * 3)
    with pytest.raises(RotvizError, match="needs statistics"):
        merge_many(a, "zipit", [a.state] * 2)
    from rotviz.measures.merge import _sized_check

    with pytest.raises(RotvizError, match="needs statistics of whole models") as e:
        _sized_check({"method": "zipit"})
    assert "\n" not in str(e.value)


def test_the_cli_refuses_a_depth_beyond_the_model_and_writing_a_partial_zip(ws, capfd):
    from conftest import refused

    from tests.pairs import default_pair_refs

    a, b = default_pair_refs()
    cmd = ["merge", a, b, "--data", "digits", "--match", "none", "--method", "zipit",
           "--batches", "1", "--batch-size", "8"]
    refused([*cmd, "--zip-layers", "9"], capfd, ws, "--zip-layers must be -1 (all) or from 0 "
            "to 4 (this model's blocks), got 9")
    refused([*cmd, "--zip-layers", "1", "--out", "o"], capfd, ws, "no single model to write")

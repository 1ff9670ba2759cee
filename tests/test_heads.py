"""Head permutation: planted recovery, optimal assignment, composition, errors."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import view_of

from rotviz.errors import RotvizError
from rotviz.groups import rope_free, rope_pairs
from rotviz.match.distances import distances, norm
from rotviz.match.engine import match
from rotviz.match.layer_solvers import head_gain, head_permutation
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import match_models
from rotviz.match.selection import match_options
from rotviz.sources.loading import load_model
from rotviz.sources.running import max_output_diff
from rotviz.symmetry.actions import (
    LayerTransform,
    apply,
    apply_layer,
    qk_fixed_pairs,
    random_element,
    random_transform,
)
from rotviz.symmetry.view import write_state

F64 = torch.float64
HEADS = MatchOptions(heads=True)


def _planted(view, seed=42):
    element = random_element(view.dims, seed=seed, heads=True)
    assert any(not torch.equal(t.heads, torch.arange(view.dims.n_heads))
               for t in element.values())  # the heads really move
    return element


def test_planted_image_with_head_permutation_has_the_same_function(family, loaded):
    model = loaded(family)
    view = view_of(model)
    image = apply(view, _planted(view))
    assert distances(image, view).total > 1.0
    assert max_output_diff(model, model.state, write_state(image)) <= 1e-4


def test_head_matching_recovers_the_planted_element(family, loaded):
    original = view_of(loaded(family, 0, F64))
    image = apply(original, _planted(original))
    scale = norm(original)
    with_heads = match(original, image, HEADS)
    assert distances(with_heads.view, original).total / scale <= 1e-5
    assert with_heads.report.after.total / scale <= 1e-5
    seed_only = match(original, image)
    assert seed_only.report.after.total > with_heads.report.after.total
    assert seed_only.report.after.total / scale > 1e-3  # rotations alone cannot undo it
    assert all(len(h.head_perm) == original.dims.n_heads for h in with_heads.report.layers)
    # the returned element maps the image onto the result
    assert distances(apply(image, with_heads.transforms), with_heads.view).total / scale <= 1e-9


def test_heads_matching_keeps_the_function(family, loaded):
    anchor, source = loaded(family, 0), loaded(family, 1)
    out = match_models(anchor, source, HEADS)
    assert out.report.max_output_diff <= 1e-4 and out.preserved


def _outer(x, y, i, j):
    return 0.0 if x is None else torch.outer(x[i], y[j])


def _qk_gain(m, rope, fixed=None):
    """max tr(R^T M) over the Q-K maps allowed: the nuclear norm, or under rotary embeddings
    the per-pair rotations' gain, sum over pairs (i, j) of |(M_ii + M_jj, M_ji - M_ij)|, or
    |M_ii + M_jj| for a pair that may only flip its sign (`fixed`, q/k norms)."""
    if rope is None:
        return torch.linalg.svdvals(m).sum()
    i, j = rope_pairs(m.shape[-1], rope)
    if fixed is not None:
        x, y = m[i, i] + m[j, j], m[j, i] - m[i, j]
        return torch.where(fixed, x.abs(), torch.hypot(x, y)).sum()
    k = rope_free(m.shape[-1], rope)  # partial rotary: any rotation of the other dims
    free = torch.linalg.svdvals(m[k[:, None], k]).sum() if len(k) else 0.0
    return torch.hypot(m[i, i] + m[j, j], m[j, i] - m[i, j]).sum() + free


def _group_gain(src, anc, heads, gs, ga, rope):
    """From first principles: the gain of rotating source key/value group gs, its query heads
    `heads` in that order, onto anchor group ga (a single head without grouped-query
    attention)."""
    r = len(heads)
    mqk = src.wk[gs] @ anc.wk[ga].T + _outer(src.bk, anc.bk, gs, ga)
    mvo = src.wv[gs] @ anc.wv[ga].T + _outer(src.bv, anc.bv, gs, ga)
    for k, hs in enumerate(heads):
        ha = ga * r + k
        mqk = mqk + src.wq[hs] @ anc.wq[ha].T + _outer(src.bq, anc.bq, hs, ha)
        mvo = mvo + src.wo[hs].T @ anc.wo[ha]
    moved = 0.0  # q/k norms over the whole projection (OLMo-2): gain rows move with heads
    if src.gq is not None and src.gq.dim() == 2:
        moved = src.gk[gs] @ anc.gk[ga] + sum(src.gq[hs] @ anc.gq[ga * r + k]
                                              for k, hs in enumerate(heads))
    return (_qk_gain(mqk, rope, qk_fixed_pairs(src, rope)) + torch.linalg.svdvals(mvo).sum()
            + moved)


def test_head_assignment_is_optimal_over_all_permutations(family, loaded):
    """Over every head permutation the model allows (those that keep key/value groups whole;
    all of them without grouped-query attention), the chosen one has the largest gain."""
    anchor, source = (view_of(loaded(family, s, F64)) for s in (0, 1))
    dims = anchor.dims
    h, h_kv, r, rope = dims.n_heads, dims.n_kv_heads, dims.group_size, dims.rope
    allowed = [torch.tensor([order[g] * r + inner[g][k] for g in range(h_kv) for k in range(r)])
               for order in itertools.permutations(range(h_kv))
               for inner in itertools.product(itertools.permutations(range(r)), repeat=h_kv)]
    assert len(allowed) == math.factorial(h_kv) * math.factorial(r) ** h_kv

    def total(src, anc, perm):  # new head k = source head perm[k]
        return sum(_group_gain(src, anc, perm[g * r:(g + 1) * r].tolist(),
                               int(perm[g * r]) // r, g, rope) for g in range(h_kv))

    for i in range(dims.n_layers):
        src, anc = source.blocks[i].attn, anchor.blocks[i].attn
        assert src.wq.shape[0] == h == 4
        # the gain from first principles, one pair of groups (heads) at a time, with the
        # best order of the group's query heads
        gain = torch.empty(h_kv, h_kv, dtype=F64)
        for gs, ga in itertools.product(range(h_kv), range(h_kv)):
            gain[gs, ga] = max(_group_gain(src, anc, [gs * r + o for o in order], gs, ga, rope)
                               for order in itertools.permutations(range(r)))
        torch.testing.assert_close(head_gain(src, anc, rope=rope), gain, rtol=1e-10,
                                   atol=1e-10)
        perm = head_permutation(src, anc, rope)
        chosen = total(src, anc, perm)
        best = max(total(src, anc, p) for p in allowed)
        assert chosen >= best - 1e-9


def test_heads_without_attn_is_a_one_line_error():
    with pytest.raises(RotvizError, match=r"\(heads\) needs attention rotation \(attn\)") as e:
        MatchOptions(attn=False, heads=True)
    assert "\n" not in str(e.value)
    with pytest.raises(RotvizError, match="needs attention"):
        match_options("ffn,heads")


def test_spec_passes_heads_through():
    opts = match_options("seed,heads")
    assert opts == MatchOptions(heads=True) and opts.label == "ffn,attn,rescale,heads"
    assert MatchOptions().label == "ffn,attn,rescale" and not MatchOptions().heads


def test_composition_with_head_permutations(loaded):
    view = view_of(loaded("gpt2", 0, F64))
    t1 = random_transform(view.dims, 1, heads=True)
    t2 = random_transform(view.dims, 2, heads=True)
    two_steps = apply_layer(apply_layer(view, 0, t1), 0, t2)
    once = apply_layer(view, 0, t1.then(t2))
    assert distances(two_steps, once).total / norm(view) <= 1e-12
    # heads=False draws exactly the element it drew before heads existed
    plain = random_transform(view.dims, 1)
    assert plain.heads is None and torch.equal(plain.qk, t1.qk) and torch.equal(plain.perm, t1.perm)
    only_heads = LayerTransform(heads=t1.heads)
    moved = apply_layer(view, 0, only_heads).blocks[0].attn
    torch.testing.assert_close(moved.wo, view.blocks[0].attn.wo[t1.heads])


def test_default_pair_heads_keep_function_and_do_not_lose_to_seed():
    from rotviz.zoo_registry import default_pair

    a_ref, b_ref = default_pair()
    anchor, source = load_model(a_ref), load_model(b_ref)
    seed = match_models(anchor, source, MatchOptions())
    heads = match_models(anchor, source, HEADS)
    assert heads.preserved and heads.report.max_output_diff <= 1e-4
    assert heads.report.after.total <= seed.report.after.total + 1e-9

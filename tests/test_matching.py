"""The seed paper's matching: planted recovery, optimality of every solver, toggles, report."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch
from conftest import (
    ATTN_ROLES,
    FFN_ROLES,
    assert_state_equal,
    changed_keys,
    clone_state,
    module_keys,
    view_of,
)

from rotviz.errors import RotvizError
from rotviz.groups import (
    best_scale,
    procrustes,
    random_orthogonal,
    random_rope_maps,
    rope_free,
    rope_maps,
    rope_pairs,
    rope_procrustes,
)
from rotviz.match.distances import distances, norm
from rotviz.match.engine import match
from rotviz.match.layer_solvers import cross_qk, cross_vo, ffn_permutation
from rotviz.match.options import MatchOptions, parse_layers
from rotviz.match.pipeline import match_models
from rotviz.sources.running import max_output_diff
from rotviz.symmetry.actions import apply, qk_fixed_pairs, random_element
from rotviz.symmetry.kinds import KINDS
from rotviz.symmetry.view import FFN, write_state

F64 = torch.float64


def _pair(loaded, family, dtype=F64):
    """(anchor, source): two independent random models of one family."""
    return loaded(family, 0, dtype), loaded(family, 1, dtype)


# ---- planted recovery -------------------------------------------------------------------


def test_planted_image_has_the_same_function(family, loaded):
    model = loaded(family)
    view = view_of(model)
    image = apply(view, random_element(view.dims, seed=42))
    assert distances(image, view).total > 1.0  # it moved far
    assert max_output_diff(model, model.state, write_state(image)) <= 1e-4


def test_planted_element_is_recovered(family, loaded):
    original = view_of(loaded(family, 0, F64))
    image = apply(original, random_element(original.dims, seed=42))
    assert distances(image, original).total / norm(original) > 0.1
    result = match(original, image)
    assert distances(result.view, original).total / norm(original) <= 1e-5
    assert result.report.after.total / norm(original) <= 1e-5


# ---- optimality of each solver ------------------------------------------------------------


def _bias_sq(b1, b2, idx, r):
    """||b1[idx] R - b2[idx]||^2 for a batch of R (n, dh, dh); 0 where the model has no bias."""
    if b1 is None:
        return 0.0
    return ((b1[idx] @ r - b2[idx]) ** 2).sum(-1)


def _head_distance_qk(r, s, a, g):
    """||R^T W_Q1 - W_Q2||^2 over the query heads of key/value group g (head g without
    grouped-query attention) + ||R^T W_K1 - W_K2||^2 of the group + bias terms, for a batch
    of orthogonal R (n, dh, dh)."""
    rt = r.transpose(-1, -2)
    size = s.n_heads // s.n_kv_heads
    d = ((rt @ s.wk[g] - a.wk[g]) ** 2).sum((1, 2)) + _bias_sq(s.bk, a.bk, g, r)
    for h in range(g * size, (g + 1) * size):
        d = d + ((rt @ s.wq[h] - a.wq[h]) ** 2).sum((1, 2)) + _bias_sq(s.bq, a.bq, h, r)
    return d


def _head_distance_vo(r, s, a, g):
    """||R^T W_V1 - W_V2||^2 + ||b_V1 R - b_V2||^2 of key/value group g + ||W_O1[:, h] R -
    W_O2[:, h]||^2 over its query heads."""
    rt = r.transpose(-1, -2)
    size = s.n_heads // s.n_kv_heads
    d = ((rt @ s.wv[g] - a.wv[g]) ** 2).sum((1, 2)) + _bias_sq(s.bv, a.bv, g, r)
    for h in range(g * size, (g + 1) * size):
        d = d + ((s.wo[h] @ r - a.wo[h]) ** 2).sum((1, 2))
    return d


def _candidates(r_best: torch.Tensor, n_random: int = 1000, n_local: int = 200, seed: int = 0):
    """Haar-random orthogonal matrices (both determinants) plus small rotations of r_best."""
    gen = torch.Generator().manual_seed(seed)
    dh = r_best.shape[-1]
    rand = random_orthogonal(n_random, dh, gen)
    skew = torch.randn(n_local, dh, dh, generator=gen, dtype=F64) * 1e-2
    local = r_best @ torch.linalg.matrix_exp(skew - skew.transpose(-1, -2))
    return torch.cat([rand, local])


@pytest.mark.parametrize("which", ["qk", "vo"])
def test_procrustes_beats_random_orthogonal_maps(family, loaded, which):
    """Per map (one per key/value group; per head without grouped-query attention): the
    Procrustes solution is the optimum over orthogonal maps, and the library's matched head
    sits at the optimum over the maps its group allows (under rotary embeddings the Q-K maps
    are per-pair rotations: the structured optimum, which beats random structured maps)."""
    anchor, source = (view_of(m) for m in _pair(loaded, family))
    dims = anchor.dims
    cross, head_distance = (cross_qk, _head_distance_qk) if which == "qk" else (
        cross_vo, _head_distance_vo)
    structured = which == "qk" and dims.rope is not None
    result = match(anchor, source, MatchOptions(ffn=False, attn=True, rescale=False))
    for layer in range(dims.n_layers):
        s, a = source.blocks[layer].attn, anchor.blocks[layer].attn
        m = cross(s, a)
        r, sv = procrustes(m)
        dets = torch.linalg.det(r).abs()
        torch.testing.assert_close(dets, torch.ones_like(dets))
        # q/k norms (Qwen3): pairs whose gains differ may only flip their sign
        fixed = qk_fixed_pairs(s, dims.rope) if structured else None
        r_lib = rope_procrustes(m, dims.rope, fixed)[0] if structured else r
        for g in range(dims.n_kv_heads):
            cand = _candidates(r[g], seed=layer * 100 + g)
            best = torch.trace(r[g].T @ m[g])
            scores = torch.einsum("nij,ij->n", cand, m[g])  # tr(Q^T M)
            assert float(best) >= float(scores.max()) - 1e-9 * abs(float(best))
            torch.testing.assert_close(best, sv[g].sum())  # the optimum is the nuclear norm
            d_best = head_distance(r[g][None], s, a, g)[0]
            d_cand = head_distance(cand, s, a, g)
            assert float(d_best) <= float(d_cand.min()) * (1 + 1e-12)
            d_lib = head_distance(r_lib[g][None], s, a, g)[0]
            if structured and fixed is not None and bool(fixed.all()):
                # every map of the group: a sign per pair, all 2^(d_h / 2) of them
                signs = torch.tensor(list(itertools.product((1.0, -1.0), repeat=len(fixed))),
                                     dtype=F64)
                every = rope_maps(signs, torch.zeros_like(signs), dims.rope)
                assert float(d_lib) <= float(head_distance(every, s, a, g).min()) * (1 + 1e-12)
            elif structured:
                gen = torch.Generator().manual_seed(layer * 100 + g)
                rand = random_rope_maps(1000, dims.d_head, dims.rope, gen)
                assert float(d_lib) <= float(head_distance(rand, s, a, g).min()) * (1 + 1e-12)
            # the library's matched head sits exactly at that optimum
            got = head_distance(torch.eye(r.shape[-1], dtype=F64)[None],
                                result.view.blocks[layer].attn, a, g)[0]
            torch.testing.assert_close(got, d_lib, rtol=1e-9, atol=1e-9)


def _outer(x, y):
    return 0.0 if x is None else torch.outer(x, y)


def _eq7(anchor_ffn: FFN, source_ffn: FFN) -> np.ndarray:
    """C[j, k] = <unit j of the source, unit k of the anchor> over [W_in, b_in, W_out^T], and
    the gate [W_gate, b_gate] of a gated FFN (permuted with them)."""
    s, a = source_ffn, anchor_ffn
    c = s.w_in @ a.w_in.T + _outer(s.b_in, a.b_in) + s.w_out.T @ a.w_out
    if s.w_gate is not None:
        c = c + s.w_gate @ a.w_gate.T + _outer(s.b_gate, a.b_gate)
    return c.double().numpy()


def _sq_diff(x, y):
    return 0.0 if x is None else ((x - y) ** 2).sum()


def test_ffn_assignment_beats_random_permutations(family, loaded):
    anchor, source = (view_of(m) for m in _pair(loaded, family))
    rng = np.random.default_rng(0)
    for layer in range(anchor.dims.n_layers):
        c = _eq7(anchor.blocks[layer].ffn, source.blocks[layer].ffn)
        perm = ffn_permutation(anchor, source, layer).numpy()
        assert sorted(perm) == list(range(len(perm)))
        best = c[perm, np.arange(len(perm))].sum()
        randoms = [c[rng.permutation(len(perm)), np.arange(len(perm))].sum() for _ in range(200)]
        assert best >= max(randoms) and best >= np.trace(c)
        # and the distance it leaves is the smallest among those permutations
        matched = match(anchor, source, MatchOptions(ffn=True, attn=False, rescale=False))
        cells = distances(matched.view, anchor).cells
        d_best = cells[(layer, "ffn_in")] + cells[(layer, "ffn_out")]
        s, a = source.blocks[layer].ffn, anchor.blocks[layer].ffn
        for _ in range(20):
            p = torch.as_tensor(rng.permutation(len(perm)))
            d = float(((s.w_in[p] - a.w_in) ** 2).sum()
                      + _sq_diff(None if s.b_in is None else s.b_in[p], a.b_in)
                      + ((s.w_out[:, p] - a.w_out) ** 2).sum() + _sq_diff(s.b_out, a.b_out)
                      + _sq_diff(None if s.w_gate is None else s.w_gate[p], a.w_gate)
                      + _sq_diff(None if s.b_gate is None else s.b_gate[p], a.b_gate))
            assert d_best <= d * (1 + 1e-12)


def test_ffn_assignment_is_the_exact_optimum_on_a_small_layer(loaded):
    """Exhaustive check over all 7! permutations of a 7-unit FFN."""
    base = view_of(loaded("bert", 0, F64))
    gen = torch.Generator().manual_seed(3)

    def small_ffn():
        return FFN(torch.randn(7, 32, generator=gen, dtype=F64),
                   torch.randn(7, generator=gen, dtype=F64),
                   torch.randn(32, 7, generator=gen, dtype=F64),
                   torch.zeros(32, dtype=F64), "gelu")

    blk = base.blocks[0]
    for _ in range(3):
        fa, fs = small_ffn(), small_ffn()
        anchor = base.with_block(0, type(blk)(blk.attn, fa, blk.norms))
        source = base.with_block(0, type(blk)(blk.attn, fs, blk.norms))
        c = _eq7(fa, fs)
        perms = np.array(list(itertools.permutations(range(7))))
        all_scores = c[perms, np.arange(7)].sum(1)
        perm = ffn_permutation(anchor, source, 0).numpy()
        assert math.isclose(c[perm, np.arange(7)].sum(), all_scores.max(), rel_tol=1e-12)


def _f(coef, a):
    big_a, big_b, big_c, big_d = coef
    return big_a * a**2 - 2 * big_b * a + big_c / a**2 - 2 * big_d / a


GRID = np.concatenate([np.logspace(-3, 3, 3001), -np.logspace(-3, 3, 3001)])


def test_best_scale_beats_a_grid_on_random_objectives():
    rng = np.random.default_rng(0)
    coefs = np.column_stack([rng.uniform(0.1, 5, 200), rng.normal(0, 3, 200),
                             rng.uniform(0.1, 5, 200), rng.normal(0, 3, 200)])
    t = torch.as_tensor(coefs)
    s = best_scale(t[:, 0], t[:, 1], t[:, 2], t[:, 3]).numpy()
    assert (s < 0).any() and (s > 0).any()  # both signs occur and are allowed
    for co, a in zip(coefs, s, strict=True):
        assert _f(co, a) <= _f(co, GRID).min() + 1e-9 * (1 + abs(_f(co, a)))


def _sq(t):
    return float((t**2).sum())


def _group(s, g):
    """The query heads of key/value group g (head g alone without grouped-query attention)."""
    size = s.n_heads // s.n_kv_heads
    return range(g * size, (g + 1) * size)


def _scaled_qk(x, s, a, g):
    """Group g's Q-K distance after scaling the source by x, a number or one per head
    dimension (W_Q rows * x, W_K rows / x)."""
    x = torch.as_tensor(x, dtype=F64).reshape(-1)
    d = _sq(s.wk[g] / x[:, None] - a.wk[g]) + (0.0 if s.bk is None else _sq(s.bk[g] / x - a.bk[g]))
    for h in _group(s, g):
        d += _sq(x[:, None] * s.wq[h] - a.wq[h])
        d += 0.0 if s.bq is None else _sq(x * s.bq[h] - a.bq[h])
    return d


def _scaled_vo(x, s, a, g):
    """Group g's V-O distance after scaling the source by x (W_V * x, W_O[:, h] / x)."""
    d = _sq(x * s.wv[g] - a.wv[g]) + (0.0 if s.bv is None else _sq(x * s.bv[g] - a.bv[g]))
    return d + sum(_sq(s.wo[h] / x - a.wo[h]) for h in _group(s, g))


def _grid_min(fn, s, a, g) -> float:
    """The least of `fn` (_scaled_qk or _scaled_vo) over every single scale of GRID. In one
    scale x, fn is c2 x^2 + c1 x + c0 + c_1 / x + c_2 / x^2 (the source's maps are multiplied
    by x or divided by it), so its values at five scales give it everywhere: one solve, then
    the whole grid at once (calling it 601 times per group took 23 s of the suite)."""
    xs = np.array([-2.0, -0.5, 0.5, 1.0, 2.0])
    terms = np.stack([xs**2, xs, np.ones_like(xs), 1 / xs, 1 / xs**2], axis=1)
    c = np.linalg.solve(terms, np.array([fn(x, s, a, g) for x in xs]))
    assert abs(c @ [9.0, 3.0, 1.0, 1 / 3, 1 / 9] - fn(3.0, s, a, g)) <= \
        1e-9 * (1 + abs(fn(3.0, s, a, g)))  # the form holds at a sixth scale
    return float((c[0] * GRID**2 + c[1] * GRID + c[2] + c[3] / GRID + c[4] / GRID**2).min())


def _qk_dim_scales(rep, dims) -> torch.Tensor:
    """The Q-K scale of every head dimension of every key/value group (H_kv, d_h): one per
    map, or under rotary embeddings one per frequency pair (both dims of the pair); 1 under
    q/k norms, which divide any scale out."""
    if dims.rope is None or dims.qk_norm:
        return torch.tensor(rep.qk_scale, dtype=F64)[:, None].expand(-1, dims.d_head)
    pair = torch.tensor(rep.qk_pair_scale, dtype=F64)
    i, j = rope_pairs(dims.d_head, dims.rope)
    out = torch.empty(dims.n_kv_heads, dims.d_head, dtype=F64)
    out[:, i], out[:, j] = pair, pair
    free = rope_free(dims.d_head, dims.rope)  # partial rotary: one scale for the other dims
    if len(free):
        out[:, free] = torch.tensor(rep.qk_free_scale, dtype=F64)[:, None]
    return out


def test_rescale_beats_a_grid_on_the_head_distance(family, loaded):
    """The chosen scales (one per map, or per frequency pair under rotary embeddings) beat a
    grid of single scales and no scaling, and the matched heads are the rotated heads at them."""
    anchor, source = (view_of(m) for m in _pair(loaded, family))
    dims = anchor.dims
    rotated = match(anchor, source, MatchOptions(ffn=False, attn=True, rescale=False)).view
    full = match(anchor, source, MatchOptions(ffn=False, attn=True, rescale=True))
    for layer, rep in enumerate(full.report.layers):
        s, a = rotated.blocks[layer].attn, anchor.blocks[layer].attn
        m = full.view.blocks[layer].attn
        qk_dims = _qk_dim_scales(rep, dims)
        for g in range(dims.n_kv_heads):
            scaled = ((_scaled_qk, qk_dims[g]),) if not dims.qk_norm else ()  # no Q-K scales
            for fn, scale in (*scaled, (_scaled_vo, rep.vo_scale[g])):
                chosen = fn(scale, s, a, g)
                grid = _grid_min(fn, s, a, g)
                one = fn(1.0, s, a, g)
                assert chosen <= grid * (1 + 1e-12) and chosen <= one * (1 + 1e-12)
            # the matched heads are the rotated heads at the chosen scales
            for h in _group(s, g):
                torch.testing.assert_close(m.wq[h], qk_dims[g][:, None] * s.wq[h])
                torch.testing.assert_close(m.wo[h], s.wo[h] / rep.vo_scale[g])


# ---- never worse, toggles, subsets, anchor ------------------------------------------------

OPTION_SETS = {
    "full": MatchOptions(),
    "ffn": MatchOptions(ffn=True, attn=False, rescale=False),
    "attn": MatchOptions(ffn=False, attn=True, rescale=False),
    "rescale": MatchOptions(ffn=False, attn=False, rescale=True),
    "layer1": MatchOptions(layers=(1,)),
}
GROUPS = {"qk": ("q", "k"), "vo": ("v", "o"), "ffn": ("ffn_in", "ffn_out")}


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_matching_never_increases_the_distance(family, loaded, name):
    anchor, source = (view_of(m) for m in _pair(loaded, family))
    rep = match(anchor, source, OPTION_SETS[name]).report
    before, after = rep.before.cells, rep.after.cells
    assert set(before) == set(after)
    for layer in range(anchor.dims.n_layers):
        for kinds in GROUPS.values():
            b = sum(before[(layer, k)] for k in kinds)
            a = sum(after[(layer, k)] for k in kinds)
            assert a <= b * (1 + 1e-12), (layer, kinds)
    for cell in before:
        if cell[1] in ("norms", "embeddings", "head", "other"):
            assert after[cell] == before[cell], cell
    assert rep.after.total < rep.before.total


def _matched_state(anchor, source, options):
    return write_state(match(view_of(anchor), view_of(source), options).view)


def test_no_ffn_keeps_ffn_bit_identical(family, loaded):
    anchor, source = _pair(loaded, family, None)
    out = _matched_state(anchor, source, MatchOptions(ffn=False))
    changed = changed_keys(out, source.state)
    view = view_of(source)
    assert changed and changed <= module_keys(view, range(2), ATTN_ROLES)
    assert not changed & module_keys(view, range(2), FFN_ROLES)


def test_no_attn_no_rescale_keeps_attention_bit_identical(family, loaded):
    anchor, source = _pair(loaded, family, None)
    out = _matched_state(anchor, source, MatchOptions(ffn=True, attn=False, rescale=False))
    changed = changed_keys(out, source.state)
    view = view_of(source)
    assert changed and changed <= module_keys(view, range(2), FFN_ROLES)
    assert not changed & module_keys(view, range(2), ATTN_ROLES)


def test_rescale_alone_only_scales_heads(family, loaded):
    anchor, source = (view_of(m) for m in _pair(loaded, family))
    dims = source.dims
    res = match(anchor, source, MatchOptions(ffn=False, attn=False, rescale=True))
    size = dims.group_size
    for layer, rep in enumerate(res.report.layers):
        s, m = source.blocks[layer].attn, res.view.blocks[layer].attn
        a = _qk_dim_scales(rep, dims)[:, :, None]  # per key/value group and head dimension
        b = torch.tensor(rep.vo_scale, dtype=F64)[:, None, None]
        torch.testing.assert_close(m.wq, a.repeat_interleave(size, 0) * s.wq)
        torch.testing.assert_close(m.wk, s.wk / a)
        torch.testing.assert_close(m.wv, b * s.wv)
        torch.testing.assert_close(m.wo, s.wo / b.repeat_interleave(size, 0))
        assert (m.bo is None) == (s.bo is None) and (m.bo is None or torch.equal(m.bo, s.bo))
        assert torch.equal(res.view.blocks[layer].ffn.w_in, source.blocks[layer].ffn.w_in)


@pytest.mark.parametrize("layers", [(0,), (1,)])
def test_layers_outside_the_subset_are_bit_identical(family, loaded, layers):
    anchor, source = _pair(loaded, family, None)
    out = _matched_state(anchor, source, MatchOptions(layers=layers))
    changed = changed_keys(out, source.state)
    view = view_of(source)
    inside = module_keys(view, layers, ATTN_ROLES + FFN_ROLES)
    assert changed and changed <= inside


def test_all_toggles_off_changes_nothing(family, loaded):
    anchor, source = _pair(loaded, family, None)
    out = _matched_state(anchor, source, MatchOptions(ffn=False, attn=False, rescale=False))
    assert_state_equal(out, source.state)


@pytest.mark.parametrize("name", ["full", "layer1"])
def test_anchor_and_source_never_change(family, loaded, name):
    anchor, source = _pair(loaded, family, None)
    a0, s0 = clone_state(anchor.state), clone_state(source.state)
    res = match(view_of(anchor), view_of(source), OPTION_SETS[name])
    write_state(res.view)
    match_models(anchor, source, OPTION_SETS[name])
    assert_state_equal(anchor.state, a0)
    assert_state_equal(source.state, s0)


# ---- report -------------------------------------------------------------------------------


def _direct_distance(a: dict, b: dict) -> float:
    """Euclidean distance over all floating tensors, tied copies (shared storage) once."""
    seen, total = set(), 0.0
    for k, t in a.items():
        if t.is_floating_point() and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += float(((t.double() - b[k].double()) ** 2).sum())
    return total**0.5


def test_report_contents(family, loaded):
    anchor, source = _pair(loaded, family, None)
    calls = []
    res = match(view_of(anchor), view_of(source), progress=lambda *c: calls.append(c))
    rep = res.report
    dims = view_of(source).dims
    h, dh = dims.n_kv_heads, dims.d_head  # one map per key/value group (per head without GQA)
    # distances: total (checked against a direct float64 computation; rotviz takes the
    # differences in the weights' own float32), per layer, per kind
    assert math.isclose(rep.before.total, _direct_distance(source.state, anchor.state),
                        rel_tol=1e-6)
    after_state = write_state(res.view)
    assert math.isclose(rep.after.total, _direct_distance(after_state, anchor.state),
                        rel_tol=1e-6)
    for dist in (rep.before, rep.after):
        d = dist.to_dict()
        assert set(d) == {"total", "per_layer", "per_kind"}
        assert set(d["per_layer"]) == {"0", "1", "rest"}
        assert {"q", "k", "v", "o", "ffn_in", "ffn_out", "norms"} <= set(d["per_kind"])
        assert set(d["per_kind"]) <= set(KINDS)
        assert math.isclose(sum(v**2 for v in d["per_layer"].values()), d["total"] ** 2,
                            rel_tol=1e-9)
        assert math.isclose(sum(v**2 for v in d["per_kind"].values()), d["total"] ** 2,
                            rel_tol=1e-9)
    # per head: singular values of the cross matrices, angles, determinants, scales
    assert [r.layer for r in rep.layers] == [0, 1]
    sv = torch.linalg.svdvals(cross_qk(view_of(source).blocks[0].attn,
                                       view_of(anchor).blocks[0].attn))
    # float32 weights: rotviz solves the small SVDs in float32
    torch.testing.assert_close(torch.tensor(rep.layers[0].qk_singular, dtype=F64), sv,
                               rtol=1e-5, atol=1e-6)
    for r in rep.layers:
        for key in ("qk_singular", "vo_singular", "qk_angles", "vo_angles"):
            arr = np.array(getattr(r, key))
            assert arr.shape == (h, dh), key
            assert np.all(np.isfinite(arr))
        assert np.all(np.diff(r.qk_singular, axis=1) <= 1e-9)  # descending
        assert np.all((np.array(r.qk_angles) >= 0) & (np.array(r.qk_angles) <= 180 + 1e-9))
        assert np.allclose(np.abs(r.qk_det), 1) and np.allclose(np.abs(r.vo_det), 1)
        assert len(r.qk_scale) == h and len(r.vo_scale) == h
        assert all(s != 0 and math.isfinite(s) for s in r.qk_scale + r.vo_scale)
        assert 0 < r.ffn_moved <= dims.d_ffn
    # progress: (done, total, message), ends at total
    total = calls[-1][1]
    assert total >= 2 and calls[-1][0] == total and all(c[1] == total for c in calls)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls) and calls[0][0] == 0
    assert all(isinstance(c[2], str) for c in calls)
    # the whole report serialises
    json.dumps(rep.to_dict())


def test_match_models_checks_the_function(family, loaded):
    anchor, source = _pair(loaded, family, None)
    out = match_models(anchor, source)
    assert out.report.max_output_diff is not None and out.report.max_output_diff <= 1e-4
    assert out.preserved
    assert max_output_diff(source, source.state, out.state) <= 1e-4
    assert set(out.state) == set(source.state)
    assert all(out.state[k].dtype == source.state[k].dtype for k in out.state)
    assert out.report.after.total < out.report.before.total
    d = out.report.to_dict()
    assert {"options", "distance_before", "distance_after", "heads", "max_output_diff",
            "seconds"} <= set(d)


# ---- --layers parsing ---------------------------------------------------------------------


def test_parse_layers_accepts_lists_and_ranges():
    assert parse_layers("0,2-5", 6) == (0, 2, 3, 4, 5)
    assert parse_layers(" 3 , 1-1,1 ", 6) == (1, 3)
    assert parse_layers([2, 0], 3) == (0, 2)
    assert parse_layers(None, 3) is None and parse_layers("all", 3) is None


@pytest.mark.parametrize("spec", ["a-b", "3-1", "", " ", "1,,2", "x", "1.5", "-1"])
def test_parse_layers_rejects_malformed(spec):
    with pytest.raises(RotvizError, match="--layers"):
        parse_layers(spec, 6)


@pytest.mark.parametrize("spec", ["99", "0-6", "5,6"])
def test_parse_layers_rejects_out_of_range(spec):
    with pytest.raises(RotvizError, match="out of range.*6 layers"):
        parse_layers(spec, 6)

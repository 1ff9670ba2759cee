"""Residual-stream maps: canonical forms, planted recovery per group, the
alternating objective, optimality of the solvers, and one-line errors for maps that do not
exist on an architecture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import DISTINCT, clone_state, view_of

from rotviz.arch import family_module
from rotviz.errors import RotvizError
from rotviz.groups import random_orthogonal
from rotviz.match.distances import distances, norm
from rotviz.match.engine import match
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import match_models
from rotviz.sources.loading import load_model
from rotviz.sources.running import max_output_diff
from rotviz.symmetry import residual as rs
from rotviz.symmetry.view import write_state

F64 = torch.float64
RESIDUAL_ONLY = MatchOptions(ffn=False, attn=False, rescale=False, residual=True)
# (family, options of its random model): every distinct family (conftest.ALIASES: an alias
# runs the same symmetry and matching code as the family it names) whose stream has a
# symmetry we can use, on a random model with an output head of its own (the family
# module's UNTIED)
WITH_RESIDUAL = [(f, family_module(f).UNTIED) for f in DISTINCT
                 if family_module(f).UNTIED is not None]


def expected_group(spec) -> str:
    """The residual groups' table (rotviz.symmetry.residual): a post-norm stream admits
    permutations, a pre-norm RMSNorm stream any orthogonal map, a pre-norm LayerNorm stream
    orthogonal maps that keep the all-ones vector (on centred writers). A norm on each
    sub-layer's output (Gemma 2) scales what is written coordinate by coordinate, which only
    permutations commute with; nor does an embedding norm on a pre-norm stream (ModernBERT)."""
    if spec.placement == "post" or any(n.site in ("attn_post", "ffn_post") for n in spec.norms):
        return "permutation"
    if spec.stream_norms:
        return "permutation"
    return "orthogonal" if spec.norm_kind == "rmsnorm" else "centred"


# (family, seed, dtype) -> the loaded model, shared by every test of this module (as the
# conftest's `loaded`; never modify it: the tests that match check that nothing is mutated)
_STREAM_MODELS: dict[tuple, object] = {}


@pytest.fixture(params=WITH_RESIDUAL, ids=[f for f, _ in WITH_RESIDUAL])
def stream_model(request, saved):
    """`get(seed, dtype)`: a tiny model of one family whose residual stream can be mapped,
    loaded once per module (each test took its own loads before: 14 per family)."""
    fam, extra = request.param

    def get(seed: int = 0, dtype=None):
        key = (fam, seed, dtype)
        if key not in _STREAM_MODELS:
            _STREAM_MODELS[key] = load_model(saved(fam, seed, **extra), dtype=dtype)
        return _STREAM_MODELS[key]

    return get


def test_group_is_read_from_the_architecture(stream_model):
    model = stream_model()
    view = view_of(model)
    assert rs.group_of(view) == expected_group(model.spec)
    assert rs.unsupported(view) is None


def test_canonical_form_keeps_the_function_and_restores_exactly(stream_model):
    model = stream_model()
    view = view_of(model)
    before = clone_state(model.state)
    canon, gauge = rs.canonicalise(view)
    assert max_output_diff(model, model.state, write_state(canon)) <= 1e-4
    if rs.group_of(view) != "permutation":
        assert distances(canon, view).total > 0.1  # gains folded, writers centred: it moved
        for blk in canon.blocks:  # gain 1 (stored as 0 where the norm stores gain - 1)
            assert all(bool((rs.gain(view, n.weight) == 1).all()) for n in blk.norms.values())
    back = rs.restore(canon, gauge)
    assert distances(back, view).total / norm(view) <= 1e-6
    assert all(torch.equal(before[k], model.state[k]) for k in before)  # nothing mutated


def test_planted_residual_map_keeps_the_function(stream_model):
    model = stream_model()
    canon, _ = rs.canonicalise(view_of(model))
    image = rs.apply_residual(canon, rs.random_map(canon, seed=7))
    assert distances(image, canon).total > 1.0
    assert max_output_diff(model, model.state, write_state(image)) <= 1e-4


_PLANTED: dict[int, tuple] = {}


def planted_match(stream_model):
    """(canonical form, the match of its planted image with RESIDUAL_ONLY) of a family's
    float64 model: computed once, read by the two tests below (never modify it)."""
    model = stream_model(0, F64)
    if id(model) not in _PLANTED:
        canon, _ = rs.canonicalise(view_of(model))
        image = rs.apply_residual(canon, rs.random_map(canon, seed=7))
        _PLANTED[id(model)] = (canon, match(canon, image, RESIDUAL_ONLY))
    return _PLANTED[id(model)]


def test_matching_recovers_a_planted_residual_map(stream_model):
    canon, out = planted_match(stream_model)
    assert distances(out.view, canon).total / norm(canon) <= 1e-5
    assert out.report.residual["group"] == rs.group_of(canon)


def test_alternating_objective_never_goes_up(stream_model):
    anchor, source = view_of(stream_model(0, F64)), view_of(stream_model(1, F64))
    out = match(anchor, source, MatchOptions(heads=True, residual=True, rounds=2, tol=1e-8))
    res = out.report.residual
    history = res["objective"]
    # start, then each round's per-layer step and its residual steps: one Procrustes step on
    # a permutation stream, the continuous block's steps on a rotation stream (each followed
    # by the per-head maps), in two phases (heads join second)
    rounds = sum(res["phase_rounds"])
    assert res["phase_rounds"][0] == 2 and 1 <= res["phase_rounds"][1] <= 2
    if res["group"] == "permutation":
        assert len(history) == 1 + 2 * rounds and res["joint_steps"] == res["plain_steps"] == 0
    else:
        assert len(history) == 1 + rounds + res["joint_steps"] + res["plain_steps"]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(history, history[1:], strict=False))
    assert history[-1] < history[1]  # the residual steps gain beyond the per-layer maps
    # the first step is exactly the seed paper's matching of the canonical forms
    ac, _ = rs.canonicalise(anchor)
    sc, _ = rs.canonicalise(source)
    seed = match(ac, sc, MatchOptions())
    assert abs(seed.report.after.total ** 2 - history[1]) <= 1e-9 * history[1]


def test_the_report_says_whether_the_alternation_converged(stream_model):
    """A planted map is recovered and then nothing gains: the phase ends by the tolerance,
    long before the cap. A real pair under a cap of 2 rounds (tol 0) is still gaining."""
    res = planted_match(stream_model)[1].report.residual
    assert res["converged"] == [True] and res["phase_rounds"][0] <= 3
    anchor, source = view_of(stream_model(0, F64)), view_of(stream_model(1, F64))
    capped = match(anchor, source, MatchOptions(heads=True, residual=True, rounds=2, tol=0.0,
                                                stall=0.0))
    res = capped.report.residual
    assert res["phase_rounds"] == [2, 2] and res["converged"] == [False, False]
    history = res["objective"]
    assert history[-1] < history[-3]  # the last round did gain: the cap, not the gain, ended it


# The plain rounds' squared canonical distances after weight matching on these pairs
# (MatchOptions(plain_rounds=True): the alternation before joint steps, 50 rounds per phase),
# made by tests/plain_rounds.py
PLAIN = json.loads((Path(__file__).parent / "data" / "plain_rounds.json").read_text())
# The squared canonical distances at which the rule before `stall` (tol and rounds only)
# ended on these pairs, as the test below matches them; made by tests/old_rule.py
OLD_RULE = json.loads((Path(__file__).parent / "data" / "old_rule.json").read_text())


def test_weight_matching_keeps_the_function_and_shrinks_the_distance(stream_model, request):
    """Matching with the residual map keeps the function and mutates nothing, settles in
    every phase (converged, or stalled: a round gained less than `stall` of the total), and
    its objective never goes up (float32 roundoff aside). The default rule ends within 0.5%
    of the old rule's canonical distance (OLD_RULE), the per-round gains add up to the total
    gain. On the pairs pinned in PLAIN, weight matching (heads too) ends no higher than the
    plain rounds."""
    family = request.node.callspec.params["stream_model"][0]
    anchor, source = stream_model(0), stream_model(1)
    before = clone_state(source.state)
    out = match_models(anchor, source, MatchOptions(heads=family in PLAIN, residual=True))
    assert out.report.max_output_diff <= 1e-4 and out.preserved
    res = out.report.residual
    # a permutation-only stream with q/k norms (OLMo-2: Q-K maps only flip pairs) leaves
    # the least to gain: 8.7% on this pair
    bound = 0.92 if res["group"] == "permutation" and anchor.spec.qk_norms else 0.9
    assert res["distance_canonical_after"] < bound * res["distance_canonical_before"]
    assert all(torch.equal(before[k], source.state[k]) for k in before)
    history = res["objective"]
    assert all(b <= a * (1 + 1e-7) for a, b in zip(history, history[1:], strict=False))
    assert set(res["phase_ended"]) <= {"converged", "stalled"}
    assert res["ended"] in ("converged", "stalled") and all(res["converged"])
    assert all(-1e-7 <= g <= 1e-3 for g in res["last_gain"])
    assert res["distance_canonical_after"] <= 1.005 * OLD_RULE[family] ** 0.5
    assert abs(sum(x["gain"] for x in res["history"]) - res["gain"]) <= 1e-6 * history[0]
    if family in PLAIN:
        assert history[-1] <= PLAIN[family] * (1 + 1e-6)
        if res["group"] != "permutation":  # the continuous block took quasi-Newton steps
            assert res["joint_steps"] > 0


def test_centred_procrustes_is_optimal_and_keeps_all_ones():
    gen = torch.Generator().manual_seed(0)
    d = 12
    m = torch.randn(d, d, generator=gen, dtype=F64)
    q = rs.solve(m, "centred")
    ones = torch.ones(d, dtype=F64)
    assert torch.allclose(q.t() @ q, torch.eye(d, dtype=F64), atol=1e-12)
    assert torch.allclose(q @ ones, ones, atol=1e-12)
    best = float(torch.trace(q.t() @ m))
    bz = rs.ones_complement(d)
    for r in random_orthogonal(500, d - 1, gen):
        other = bz @ r @ bz.t() + torch.full((d, d), 1.0 / d, dtype=F64)
        assert float(torch.trace(other.t() @ m)) <= best + 1e-9
    full = rs.solve(m, "orthogonal")  # the unconstrained optimum is at least as good
    assert float(torch.trace(full.t() @ m)) >= best - 1e-9


def test_permutation_solver_is_the_exact_assignment():
    import itertools

    gen = torch.Generator().manual_seed(1)
    m = torch.randn(6, 6, generator=gen, dtype=F64)
    q = rs.solve(m, "permutation")
    best = max(sum(float(m[p[k], k]) for k in range(6)) for p in itertools.permutations(range(6)))
    assert abs(float(torch.trace(q.t() @ m)) - best) <= 1e-12


def test_full_rotation_of_a_layernorm_stream_is_refused_and_would_break_it(loaded):
    model = loaded("vit")
    canon, _ = rs.canonicalise(view_of(model))
    gen = torch.Generator().manual_seed(3)
    full = random_orthogonal(1, canon.dims.d_model, gen)[0]
    with pytest.raises(RotvizError, match="Q 1 = 1") as e:
        rs.apply_residual(canon, full)
    assert "\n" not in str(e.value)
    broken = rs.apply_residual(canon, full, check=False)  # the check is what keeps it safe
    assert max_output_diff(model, model.state, write_state(broken)) > 1e-2


def test_rotation_of_a_post_norm_stream_is_refused_and_would_break_it(loaded):
    model = loaded("bert")
    view = view_of(model)
    rotation = random_orthogonal(1, view.dims.d_model, torch.Generator().manual_seed(2))[0]
    with pytest.raises(RotvizError, match="only coordinate permutations"):
        rs.apply_residual(view, rotation)
    with pytest.raises(RotvizError, match="allows only coordinate permutation") as e:
        match(view, view, MatchOptions(residual=True, residual_group="orthogonal"))
    assert "residual auto" in str(e.value)
    broken = rs.apply_residual(view, rotation, check=False)
    assert max_output_diff(model, model.state, write_state(broken)) > 1e-2


def test_unfolded_gains_are_refused(loaded):
    view = view_of(loaded("vit"))
    with pytest.raises(RotvizError, match="canonicalise"):
        rs.apply_residual(view, torch.eye(view.dims.d_model))


def test_tied_heads_are_refused_with_a_way_out(loaded, family):
    """An output weight tied to a stream writer (GPT-2's head, RoBERTa's MLM decoder, both tied
    to the embeddings) refuses residual maps: a pre-norm model's tied head would need the final
    gain folded into its embedding, a post-norm decoder reads another space. Both are one-line
    errors naming what to do instead. Models with an output head of their own are offered
    residual maps, and so are tied heads that read the stream when the stream's maps are
    permutations (no gain to fold: Gemma 2's)."""
    model = loaded(family)
    view = view_of(model)
    readers = {f"{r}.weight" for r in view.layout.readers}
    permuted = rs.group_of(view) == "permutation"
    tied_head = any(owner in view.layout.writers and (alias not in readers or not permuted)
                    for alias, owner in view.tied)
    if not tied_head:
        assert rs.unsupported(view) is None
        return
    assert rs.unsupported(view)
    with pytest.raises(RotvizError) as e:
        match_models(model, loaded(family, 1), MatchOptions(residual=True))
    msg = str(e.value)
    assert "\n" not in msg and "without residual" in msg
    if not permuted:
        with pytest.raises(RotvizError, match="tie_word_embeddings"):
            rs.canonicalise(view)


def test_residual_and_seed_compose_on_planted_elements(loaded, saved):
    """A planted residual map plus the seed paper's group on an untied GPT-2: every part
    together keeps the function."""
    from rotviz.symmetry.actions import apply, random_element

    model = load_model(saved("gpt2", 0, tie=False))
    canon, _ = rs.canonicalise(view_of(model))
    image = apply(rs.apply_residual(canon, rs.random_map(canon, 5)),
                  random_element(canon.dims, 5, heads=True))
    assert max_output_diff(model, model.state, write_state(image)) <= 1e-4


# ---- holding the FFN maps (MatchOptions.ffn_backoff) ----------------------------------------


def test_residual_map_parts_compose_to_the_whole(stream_model):
    """Turning the rest, then the blocks' FFN and norms, is turning everything; their cross
    terms add up to the whole one."""
    anchor, _ = rs.canonicalise(view_of(stream_model(0, F64)))
    source, _ = rs.canonicalise(view_of(stream_model(1, F64)))
    q = rs.random_map(source, seed=3)
    whole = rs.apply_residual(source, q)
    parts = rs.apply_residual(rs.apply_residual(source, q, which="rest"), q, which="ffn")
    assert distances(parts, whole).total == 0.0
    assert distances(rs.apply_residual(source, q, which="rest"), whole).total > 1e-3
    m = rs.cross(source, anchor)
    split = rs.cross(source, anchor, which="ffn") + rs.cross(source, anchor, which="rest")
    assert torch.allclose(split, m, rtol=0, atol=1e-12 * float(m.abs().max()))
    with pytest.raises(ValueError, match="which must be one of"):
        rs.cross(source, anchor, which="attn")


def test_held_ffn_tensors_are_accounted_exactly(stream_model):
    """While FFN tensors lag behind the residual map, the cross term and the objective the
    alternation uses are those of the model they stand for (1e-10 relative), and settling
    yields that model."""
    from rotviz.match.alternating import objective
    from rotviz.match.memo import TensorMemo
    from rotviz.match.residual import _LazyFFN

    anchor, _ = rs.canonicalise(view_of(stream_model(0, F64)))
    source, _ = rs.canonicalise(view_of(stream_model(1, F64)))
    q1, q2 = rs.random_map(source, seed=4), rs.random_map(source, seed=5)
    target = rs.apply_residual(rs.apply_residual(source, q1), q2)
    lazy = _LazyFFN(anchor, TensorMemo())
    held = lazy.turn(lazy.turn(source, q1), q2)
    assert held.blocks[0].ffn.w_in is source.blocks[0].ffn.w_in  # not turned yet
    want = rs.cross(target, anchor)
    assert (lazy.cross(held) - want).abs().max() <= 1e-10 * want.abs().max()
    obj = objective(target, anchor)
    assert abs(lazy.objective(held, objective(held, anchor)) - obj) <= 1e-10 * obj
    assert distances(lazy.settle(held), target).total <= 1e-12 * norm(target)
    assert lazy.pending is None


def test_ffn_backoff_holds_the_ffn_and_keeps_every_guarantee(saved):
    """On a random LLaMA pair the units stop moving after the first rounds: with ffn_backoff
    later rounds hold the FFN maps, the objective still never goes up, the first round is the
    default's, and the matched model computes the source's function."""
    anchor, source = (load_model(saved("llama", s)) for s in (0, 1))
    before = clone_state(source.state)
    runs = {}
    for backoff in (False, True):
        options = MatchOptions(heads=True, residual=True, rounds=12, tol=0.0, stall=0.0,
                               ffn_backoff=backoff, plain_rounds=not backoff)
        runs[backoff] = match_models(anchor, source, options)
    held, plain = runs[True].report.residual, runs[False].report.residual
    assert plain["ffn_held"] == 0 and held["ffn_held"] >= 6
    history = held["objective"]
    assert len(history) == 1 + 2 * 12 * 2
    assert all(b <= a * (1 + 1e-6) for a, b in zip(history, history[1:], strict=False))
    assert history[:2] == plain["objective"][:2]  # the first per-layer step, as it was
    assert history[2] == pytest.approx(plain["objective"][2], rel=1e-8)  # held: via Q
    assert history[-1] <= 1.01 * plain["objective"][-1]
    assert runs[True].preserved and runs[True].report.max_output_diff <= 1e-4
    assert all(torch.equal(before[k], source.state[k]) for k in before)


def test_per_layer_steps_in_chunks_give_the_same_result(saved, monkeypatch):
    """The in-memory alternation solves and applies the per-layer maps a few layers per call
    (rotviz.match.residual.CHUNK) so that it holds fewer copies; one layer per call gives
    exactly what one call for every layer gives: the same objective history and the same
    tensors."""
    from rotviz.match import residual
    from rotviz.symmetry.kinds import groups

    anchor = view_of(load_model(saved("llama", 0)))
    source = view_of(load_model(saved("llama", 1)))
    assert anchor.dims.n_layers >= 2
    options = MatchOptions(heads=True, residual=True, rounds=2)
    whole = match(anchor, source, options)
    monkeypatch.setattr(residual, "CHUNK", 1)
    chunked = match(anchor, source, options)
    assert chunked.report.residual["objective"] == whole.report.residual["objective"]
    pairs = zip(groups(whole.view), groups(chunked.view), strict=True)
    assert all(torch.equal(a, b) for (_, _, a), (_, _, b) in pairs)

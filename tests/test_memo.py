"""The tensor memo behind fast alternation rounds: it must never change a result.

rotviz.match.memo serves again the results of pure functions of the very same tensor objects. The
alternating weight matching uses it to skip FFN solves, stream cross terms and distances of
tensors that did not change; these tests pin that the results are bit-identical to running
without it, that it does hit where it should, and that it never keeps freed weights alive.
"""

from __future__ import annotations

import gc

import pytest
import torch
from conftest import view_of

from rotviz.match import residual
from rotviz.match.engine import match
from rotviz.match.memo import TensorMemo
from rotviz.match.options import MatchOptions
from rotviz.sources.loading import load_model
from rotviz.symmetry.actions import permute_ffn
from rotviz.symmetry.view import FFN, write_state


def test_hits_only_the_same_tensor_objects():
    memo, calls = TensorMemo(), []
    a = torch.arange(6.0)
    twin = a.clone()  # equal values, another object

    def f(t):
        calls.append(1)
        return float(t.sum())

    assert memo.get("sum", (a, None), lambda: f(a)) == 15.0
    assert memo.get("sum", (a, None), lambda: f(a)) == 15.0
    assert len(calls) == 1 and memo.hits == 1
    memo.get("sum", (twin, None), lambda: f(twin))
    memo.get("other", (a, None), lambda: f(a))  # another tag is another function
    assert len(calls) == 3


def test_entries_die_with_their_tensors():
    # the objects that existed before the test are set aside (gc.freeze), so each collection
    # below scans only what the test made: a full one of a worker that has loaded torch,
    # transformers and the suite's models took about 0.6 s
    gc.freeze()
    try:
        memo = TensorMemo()
        a, b = torch.ones(1000), torch.zeros(1000)
        memo.put("pair", (a, b), 1)
        memo.put("one", (b,), 2)
        assert len(memo) == 2
        del a
        gc.collect()
        assert len(memo) == 1  # the entry that held `a` went with it; b's own stays
        del b
        gc.collect()
        assert len(memo) == 0
    finally:
        gc.unfreeze()


def test_identity_permutation_keeps_the_tensor_objects():
    w = torch.randn(8, 4)
    ffn = FFN(w, torch.randn(8), torch.randn(4, 8), None, "gelu", None, None)
    assert permute_ffn(ffn, torch.arange(8)) is ffn
    moved = permute_ffn(ffn, torch.tensor([1, 0, *range(2, 8)]))
    assert moved is not ffn and torch.equal(moved.w_in[0], w[1])


class NeverHits(TensorMemo):
    def find(self, tag, tensors):
        self.misses += 1
        return False, None


@pytest.mark.parametrize("fam,extra", [("bert", {}), ("vit", {}), ("llama", {})])
def test_weight_matching_is_the_same_with_and_without_the_memo(saved, monkeypatch, fam, extra):
    anchor = load_model(saved(fam, 0, **extra), dtype=torch.float64)
    source = load_model(saved(fam, 1, **extra), dtype=torch.float64)
    options = MatchOptions(heads=True, residual=True, rounds=5, tol=0.0)
    made = []

    class Recording(TensorMemo):
        def __init__(self):
            super().__init__()
            made.append(self)

    monkeypatch.setattr(residual, "TensorMemo", Recording)
    fast = match(view_of(anchor), view_of(source), options)
    monkeypatch.setattr(residual, "TensorMemo", NeverHits)
    slow = match(view_of(anchor), view_of(source), options)
    assert made and made[0].hits > 0  # rounds did reuse work
    assert fast.report.residual["objective"] == slow.report.residual["objective"]
    a, b = write_state(fast.view), write_state(slow.view)
    assert all(torch.equal(a[k], b[k]) for k in a)

"""rotviz.analysis.hvp keeps each batch's gradient graph within a byte budget: the products,
loss and gradient are the same (1e-12, float64) with every graph kept, none kept (batch by
batch, the memory-bounded path) and a budget that holds only the first batch's; and
rotviz.analysis.lanczos.top_ritz stops at the CONVERGED residual and takes a warm start."""

from __future__ import annotations

import pytest
import torch
from pairs import synthetic_split

from rotviz.analysis.hvp import Curvature
from rotviz.analysis.lanczos import CONVERGED, top_eigenvectors, top_ritz
from rotviz.evaluation import Evaluator

F64 = torch.float64
SMALL = dict(layers=1, d=8, heads=2, ffn=16)  # 845 parameters


@pytest.fixture(scope="module")
def tiny(saved):
    from rotviz.sources.loading import load_model

    model = load_model(saved("vit", 0, **SMALL))
    return model, synthetic_split(model, 12)


def curvature(tiny, retain: int | None = None) -> Curvature:
    model, split = tiny
    ev = Evaluator(model, split, "cpu", 5)  # three batches: 5, 5 and 2 images
    return Curvature(ev, model.state, F64) if retain is None else \
        Curvature(ev, model.state, F64, retain=retain)


def test_kept_none_and_some_graphs_give_the_same_products(tiny):
    full = curvature(tiny)
    v = torch.randn(full.n, generator=torch.Generator().manual_seed(0), dtype=F64)
    want = full.hvp(v)
    assert len(full._kept) == 3 and full.kept_bytes > 0
    one = full._kept[0].bytes
    for cur, kept in ((curvature(tiny, 0), 0), (curvature(tiny, one + one // 4), 1)):
        torch.testing.assert_close(cur.hvp(v), want, rtol=1e-12, atol=1e-12)
        assert len(cur._kept) == kept
        torch.testing.assert_close(cur.hvp(v), want, rtol=1e-12, atol=1e-12)  # again
        assert cur.loss() == pytest.approx(full.loss(), rel=1e-12)
        torch.testing.assert_close(cur.gradient(), full.gradient(), rtol=1e-12, atol=1e-12)
    rows = torch.randn(3, full.n, generator=torch.Generator().manual_seed(1), dtype=F64)
    torch.testing.assert_close(full.hvp_rows(rows), torch.stack([full.hvp(r) for r in rows]),
                               rtol=1e-10, atol=1e-12)
    assert full.hvps == 1 + 3 + 3
    ev = full.ev
    # the loss the kept graphs recorded is the one the evaluator reports (its float32)
    assert full.loss() == pytest.approx(ev.evaluate(ev.params(tiny[0].state))[0], rel=1e-6)
    full.release()
    assert not full._kept and full.kept_bytes == 0
    torch.testing.assert_close(full.hvp(v), want, rtol=1e-12, atol=1e-12)


def test_lanczos_stops_at_the_convergence_bar_and_starts_warm(tiny):
    cur = curvature(tiny)
    eye = torch.eye(cur.n, dtype=F64)
    dense = torch.cat([cur.hvp_rows(eye[i:i + 128]) for i in range(0, cur.n, 128)])
    vals, vecs = torch.linalg.eigh((dense + dense.T) / 2)
    top, top_vec = float(vals[-1]), vecs[:, -1]
    gen = torch.Generator().manual_seed(0)
    before = cur.hvps
    eig, res = top_ritz(cur.hvp, cur.n, 1, gen, F64, cur.device)
    cold = cur.hvps - before
    assert res[0] <= CONVERGED * abs(eig[0]) and eig[0] == pytest.approx(top, rel=1e-6)
    # from the top eigenvector, slightly off: fewer products, the same eigenvalue
    near = top_vec + 1e-4 * torch.randn(cur.n, generator=torch.Generator().manual_seed(2),
                                        dtype=F64)
    state = gen.get_state()
    before = cur.hvps
    warm, _ = top_ritz(cur.hvp, cur.n, 1, gen, F64, cur.device, v0=near)
    assert cur.hvps - before < cold and cur.hvps - before <= 3
    assert warm[0] == pytest.approx(top, rel=1e-6)
    assert torch.equal(gen.get_state(), state)  # a warm start draws nothing
    # top_eigenvectors too, and its vector is the top eigenvector (up to sign)
    vals, vecs = top_eigenvectors(cur.hvp, cur.n, 1, gen, F64, cur.device, v0=near)
    assert vals[0] == pytest.approx(top, rel=1e-9)
    assert abs(float(vecs[0] @ top_vec)) == pytest.approx(1.0, abs=1e-6)

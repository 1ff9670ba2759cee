"""The symmetry group's dimension against the near-zero eigenvalues of the Hessian restricted
to a block (rotviz.analysis.nullity, the `flat` record's nullity rows): the exact count
against the eigenvalues of an independent dense torch.autograd.functional.hessian (integer
equality), at a critical point (a regression model whose targets are its own outputs: the
gradient is exactly 0) where every tangent is a null vector and the count covers the group,
and at a non-critical point where the tangents curve and the count falls below it; the SLQ
estimate against the exact count; and the record (summary, rows, plot, parameters)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_landscape import synthetic_split

from rotviz.analysis.hessian import Curvature, math_attention
from rotviz.analysis.nullity import count_exact, count_slq, dense_block, nullity
from rotviz.analysis.tangents import f64_view, generators, group_dimension, tangents
from rotviz.cli import main
from rotviz.data import Split
from rotviz.evaluation import Evaluator
from rotviz.models import Loaded, probe_inputs
from rotviz.plots.figure_style import Style

F64 = torch.float64
# bert (post-norm, GELU): one block of 136 parameters, d_h = 4, one head: Q-K and V-O maps,
# 2 * 4^2 = 32 dimensions; a regression head (one output) on 4-token inputs
BERT = dict(layers=1, d=4, heads=1, ffn=4, labels=1, positions=4)
TOL = 1e-13  # the null eigenvalues sit below 1e-14 lambda_max, the others above 1e-12


@pytest.fixture(scope="module")
def reg(saved) -> Loaded:
    from rotviz.models import load_model

    return load_model(saved("bert", 0, **BERT))


def regression_split(model: Loaded, n: int, own: bool) -> Split:
    """n inputs; targets the model's own float64 outputs (own: a global minimum, gradient 0)
    or seeded noise (a non-critical point)."""
    x = probe_inputs(model, n, 0)["input_ids"]
    if own:
        params = {k: v.to(F64) for k, v in model.model.named_parameters()}
        bufs = {k: v.to(F64) if v.is_floating_point() else v
                for k, v in model.model.named_buffers()}
        with torch.no_grad(), math_attention():
            y = torch.func.functional_call(model.model, {**bufs, **params}, (x,)).logits
    else:
        y = torch.randn(n, 1, generator=torch.Generator().manual_seed(1), dtype=F64)
    return Split("synthetic", "test", "regression", x, y, 1, "chars")


def torch_block_hessian(model: Loaded, split: Split, cur: Curvature, mask: torch.Tensor):
    """The dense Hessian of the block's parameters, by torch.autograd.functional.hessian of
    an independent float64 mean squared error (the others held at the model)."""
    names = cur.names
    sizes = [model.state[n].numel() for n in names]
    theta = torch.cat([model.state[n].to(F64).reshape(-1) for n in names])
    idx = mask.nonzero().flatten()
    bufs = {k: v.to(F64) if v.is_floating_point() else v for k, v in model.model.named_buffers()}

    def loss(part: torch.Tensor) -> torch.Tensor:
        v = theta.index_put((idx,), part)
        params = {n: p.reshape(model.state[n].shape)
                  for n, p in zip(names, torch.split(v, sizes), strict=True)}
        with math_attention():
            out = torch.func.functional_call(model.model, {**bufs, **params}, (split.inputs,))
        return ((out.logits.to(F64) - split.labels.to(F64)) ** 2).mean()

    return torch.autograd.functional.hessian(loss, theta[idx], vectorize=True)


def block_tangents(model: Loaded, mask: torch.Tensor) -> torch.Tensor:
    view = f64_view(model, None)
    _, t, _ = tangents(model, gens=generators(view, residual=False))
    assert float(t[:, ~mask].abs().max()) == 0.0  # a block's tangents live in the block
    return t[:, mask]


@pytest.mark.parametrize("own", [True, False], ids=["critical", "non-critical"])
def test_the_exact_count_equals_the_dense_hessians(reg, own):
    """The exact count (HVPs against the identity, then eigvalsh) equals the number of
    eigenvalues of torch's dense Hessian below the tolerance, exactly. At the critical point
    (gradient exactly 0) every block tangent is a null vector (|H t| <= 1e-10 lambda_max |t|)
    and the count, 70, is at least the group's 32 (the rest: the key bias under the softmax,
    the means LayerNorm removes from what the block writes, b_V against b_O); at noise
    targets the tangents curve (H t = -(Dt)^T grad) and only 28 of those other null
    directions stay: fewer than the group's dimension."""
    split = regression_split(reg, 300, own)
    cur = Curvature(Evaluator(reg, split), reg.state, F64)
    gn = float(cur.gradient().norm())
    assert (gn == 0.0) if own else gn > 1.0
    mask = cur.masks("block", reg)["block 0"]
    dim = group_dimension(f64_view(reg, None))[0]["total"]
    assert int(mask.sum()) == 136 and dim == 32
    rows = nullity(cur, reg, group_dimension(f64_view(reg, None)), TOL, 136, 2, 10)
    row = next(r for r in rows if r["block"] == "block 0")
    assert row["method"] == "exact" and row["dimension"] == 32 and row["params"] == 136
    h = torch_block_hessian(reg, split, cur, mask)
    eig = torch.linalg.eigvalsh(h)
    top = float(eig.abs().max())
    assert row["lambda_max"] == pytest.approx(top, rel=1e-10)
    assert row["near_zero"] == int((eig.abs() <= TOL * top).sum())
    t = block_tangents(reg, mask)
    ht = (h @ t.T).norm(dim=0) / (top * t.norm(dim=1))
    if own:
        assert row["near_zero"] == 70 >= dim
        assert float(ht.max()) <= 1e-10
    else:
        assert row["near_zero"] == 28 < dim
        assert float(ht.max()) > 1e-3


def test_the_quadrature_estimate_against_the_exact_count(reg):
    """SLQ with as many Lanczos steps as the block has parameters (its quadrature then
    holds the null cluster as one node at ~0) agrees with the exact count within three
    standard errors over the probes."""
    split = regression_split(reg, 40, True)
    cur = Curvature(Evaluator(reg, split), reg.state, F64)
    mask = cur.masks("block", reg)["block 0"]
    exact, top = count_exact(dense_block(cur, mask), 1e-8)
    est, se, top_slq = count_slq(cur, mask, 1e-8, 4, 136, torch.Generator().manual_seed(0))
    assert top_slq == pytest.approx(top, rel=1e-8)
    assert 0 < se and abs(est - exact) <= 3 * se, (est, se, exact)


def test_the_record_counts_per_block_and_for_the_model(saved, capsys):
    """The `flat` record with nullity on a tiny ViT (845 parameters, all exact): rows for
    block 0, the parameters outside the blocks and the whole model, whose dimension counts the
    block's group (64) and the stream's centred map (21); the summary, the export rows and
    the grouped bar chart; an SLQ run gives an error bar; a bad tolerance is one line."""
    from rotviz.measures import measurement
    from rotviz.models import load_model
    from rotviz.runner import measure

    vit = load_model(saved("vit", 0, layers=1, d=8, heads=2, ffn=16))
    split = synthetic_split(vit, 4)
    ends = SimpleNamespace(anchor=vit, anchor_ref="tiny-vit", at_size=False)
    r = measure("flat", ends, split, per_layer=1, curvature="no", nullity="yes",
                nullity_tol=1e-10)
    rows = {x["block"]: x for x in r.nullity}
    assert list(rows) == ["outside", "block 0", "model"]
    assert [rows[k]["dimension"] for k in rows] == [0, 64, 85]
    assert [rows[k]["params"] for k in rows] == [245, 600, 845]
    assert all(x["method"] == "exact" and x["error"] == 0.0 for x in r.nullity)
    cur = Curvature(Evaluator(vit, split), vit.state, F64)
    mask = cur.masks("block", vit)["block 0"]
    assert rows["block 0"]["near_zero"] == count_exact(dense_block(cur, mask), 1e-10)[0]
    rec = measurement("flat")
    line = rec.summary(r, "")
    assert "block 0 64 vs " + str(rows["block 0"]["near_zero"]) in line
    assert "residual centred map: 21" in line
    d = r.to_dict()
    table = rec.rows(d)
    assert [x["block"] for x in table if x["table"] == "nullity"] == list(rows)
    fig = rec.plot(d, Style())
    assert fig.layout.title.text and fig.layout.xaxis.title.text and \
        fig.layout.yaxis.title.text and fig.layout.legend.title.text
    assert [tr.type for tr in fig.data] == ["bar", "bar"]
    assert list(fig.data[0].y) == [0, 64, 85]
    s = measure("flat", ends, split, per_layer=1, curvature="no", nullity="yes", nullity_exact=0,
                nullity_probes=2, nullity_steps=8)
    assert all(x["method"] == "slq" and x["error"] >= 0 for x in s.nullity)
    assert "(slq)" in rec.summary(s, "")
    off = measure("flat", ends, split, per_layer=1, curvature="no", nullity="no")
    assert off.nullity == [] and rec.plot(off.to_dict(), Style()).layout.yaxis.type == "log"
    rc = main(["flat", "zoo:vit-digits-s3", "--data", "digits", "--nullity-tol", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "--nullity-tol must be a number" in err and err.count("\n") == 1

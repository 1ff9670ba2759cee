"""The flat record (rotviz.measures.flat): the loss along each orbit and the gradient's cosine
with each tangent (by rotviz's code and by an independent float64 loss through torch.func),
a random direction as the negative control, the curvature along tangents against the dense
Hessian, a RoPE family (llama), q/k norms (qwen3) and the residual map's tangents, the
record's CLI JSON, plot and refusal at size; and the symmetry group's dimension against the
near-zero eigenvalues of the Hessian restricted to a block (the nullity rows): the exact
count against the eigenvalues of an independent dense torch.autograd.functional.hessian
(integer equality), at a critical point (a regression model whose targets are its own
outputs: the gradient is exactly 0) where every tangent is a null vector and the count
covers the group, and at a non-critical point where the tangents curve and the count falls
below it; the SLQ estimate against the exact count; and the record (summary, rows, plot,
parameters)."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import clone_state
from pairs import assert_unchanged, synthetic_split
from test_tangents import SMALL, f64_loss, pdict

from rotviz.analysis.hvp import Curvature, dense_block, math_attention
from rotviz.analysis.tangents import (
    f64_view,
    generators,
    group_dimension,
    moved_state,
    tangents,
)
from rotviz.cli import main
from rotviz.data.split import Split
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.measures.flat import count_exact, count_slq, flat
from rotviz.measures.flat import count_nullity as nullity
from rotviz.plots.figure_style import Style
from rotviz.sources.loading import Loaded, load_model
from rotviz.sources.running import probe_inputs
from rotviz.symmetry.view import write_state

F64 = torch.float64


@pytest.fixture(scope="module")
def tiny(saved) -> Loaded:
    """test_tangents' tiny ViT (SMALL), for the flat record's checks."""
    return load_model(saved("vit", 0, **SMALL))

# bert (post-norm, GELU): one block of 136 parameters, d_h = 4, one head: Q-K and V-O maps,
# 2 * 4^2 = 32 dimensions; a regression head (one output) on 4-token inputs
BERT = dict(layers=1, d=4, heads=1, ffn=4, labels=1, positions=4)
TOL = 1e-13  # the null eigenvalues sit below 1e-14 lambda_max, the others above 1e-12


@pytest.fixture(scope="module")
def reg(saved) -> Loaded:
    from rotviz.sources.loading import load_model

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
    from rotviz.runner import measure
    from rotviz.sources.loading import load_model

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


def test_orbits_are_flat_and_the_gradient_is_orthogonal(tiny):
    split = synthetic_split(tiny, 12)
    before = clone_state(tiny.state)
    r = flat(tiny, None, split, per_layer=64, steps=(-0.5, 0.5), nullity=None)
    assert len(r.rows) == 64 + 21 and r.dimension[0]["tangents"] == 64
    assert r.dimension[1]["tangents"] == 21 == sum(x.kind == "residual" for x in r.rows)
    assert max(x.loss_change for x in r.rows) <= 1e-6
    assert max(x.cosine for x in r.rows) <= 1e-5
    assert r.control_cosine > 1e-3  # a random direction is not orthogonal to the gradient
    assert_unchanged(tiny, before)

    # independently: a float64 loss through torch.func, its gradient by torch.func.grad
    names, t, gens = tangents(tiny)
    loss = f64_loss(tiny, split)
    base = pdict(tiny, tiny.state, names)
    l0 = float(loss(base))
    view = f64_view(tiny, None)
    for g in gens[::7]:
        for s in (-0.5, 0.5):
            moved = pdict(tiny, moved_state(view, g, s), names)
            assert abs(float(loss(moved)) - l0) <= 1e-10 * l0, g.label
    grad = torch.func.grad(loss)(base)
    gflat = torch.cat([grad[n].reshape(-1) for n in names])
    cos = (t @ gflat).abs() / (t.norm(dim=1) * gflat.norm())
    assert float(cos.max()) <= 1e-5
    # negative controls: a random direction, and a Q-K map applied to W_Q alone
    rnd = torch.randn(t.shape[1], generator=torch.Generator().manual_seed(1), dtype=F64)
    assert abs(float(rnd @ gflat)) / float(rnd.norm() * gflat.norm()) > 1e-3
    blk = view.blocks[0]
    half = replace(blk.attn, wq=blk.attn.wq * 1.5)
    broken = write_state(view.with_block(0, replace(blk, attn=half)))
    assert abs(float(loss(pdict(tiny, broken, names))) - l0) > 1e-4 * l0


def test_rope_and_qk_norm_families(loaded):
    """llama (rotary, gated FFN: Q-K scale-rotations per frequency pair, unit scales) and
    qwen3 (q/k norms: only rotations of the pairs whose gains are equal; at its random gains
    none are, so its Q-K group is discrete; with all-ones gains every pair turns)."""
    ll = loaded("llama")
    r = flat(ll, None, synthetic_split(ll, 6), per_layer=6, curvature=False)
    assert {x.kind for x in r.rows} == {"qk", "vo", "ffn", "residual"}
    assert max(x.loss_change for x in r.rows) <= 1e-6
    assert max(x.cosine for x in r.rows) <= 1e-5 < r.control_cosine
    qw = loaded("qwen3")
    view = f64_view(qw, None)
    assert view.dims.qk_norm and all(d["qk"] == 0 for d in group_dimension(view))
    ones = {k: (torch.ones_like(v) if k.endswith(("q_norm.weight", "k_norm.weight")) else v)
            for k, v in qw.state.items()}
    view = f64_view(qw, ones)
    h_kv, dh = view.dims.n_kv_heads, view.dims.d_head
    assert [d["qk"] for d in group_dimension(view)][:-1] == [h_kv * dh // 2] * view.dims.n_layers
    gens = [g for g in generators(view) if g.kind == "qk"]
    assert len(gens) == view.dims.n_layers * h_kv * dh // 2
    assert all(torch.equal(g.e, -g.e.T) for g in gens)  # rotations only, no scales
    r = flat(qw, ones, synthetic_split(qw, 6), per_layer=6, curvature=False)
    # (its head is tied to the embedding: no residual map, see the next tests)
    assert {x.kind for x in r.rows} == {"qk", "vo", "ffn"}
    assert max(x.loss_change for x in r.rows) <= 1e-6
    assert max(x.cosine for x in r.rows) <= 1e-5 < r.control_cosine


def test_the_record_cli_plot_and_refusal(tmp_path, capsys, tiny):
    from types import SimpleNamespace

    from rotviz.measures import measurement
    from rotviz.runner import measure

    js = tmp_path / "f.json"
    rc = main(["flat", "zoo:vit-digits-s3", "--data", "digits", "--per-layer", "2",
               "--examples", "16", "--json", str(js), "--device", "cpu", "--nullity", "no"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("flat on cpu"), out
    d = json.loads(js.read_text())
    assert {"rows", "dimension", "control_cosine", "loss", "steps"} <= set(d)
    assert d["nullity"] == [] and "residual" in {x["kind"] for x in d["rows"]}
    assert max(x["loss_change"] for x in d["rows"]) <= 1e-6
    assert max(x["cosine"] for x in d["rows"]) <= 1e-5 < d["control_cosine"]
    fig = measurement("flat").plot(d, Style())
    assert fig.layout.title.text and fig.layout.xaxis.title.text and \
        fig.layout.yaxis.title.text and fig.layout.legend.title.text
    assert fig.layout.yaxis.type == "log" and len(fig.data) == 4
    with pytest.raises(RotvizError, match="read block by block, and the gradient"):
        measure("flat", SimpleNamespace(at_size=True), synthetic_split(tiny, 4))
    rc = main(["flat", "zoo:vit-digits-s3", "--data", "digits", "--per-layer", "0"])
    err = capsys.readouterr().err
    assert rc != 0 and "--per-layer" in err and err.count("\n") == 1


def test_curvature_along_tangents_equals_the_dense_hessian(tiny):
    """t^T H t / |t|^2 from Hessian-vector products against the exact dense Hessian of an
    independent float64 loss (torch.autograd.functional.hessian), 1e-4 relative."""
    split = synthetic_split(tiny, 12)
    r = flat(tiny, None, split, per_layer=4, steps=(0.1,))
    assert sum(x.kind == "residual" for x in r.rows) == 4  # the stream's centred map too
    names, t, _ = tangents(tiny)
    by_label = {g.label: i for i, g in enumerate(tangents(tiny)[2])}
    loss = f64_loss(tiny, split)
    shapes = [tiny.state[n].shape for n in names]
    sizes = [tiny.state[n].numel() for n in names]

    def flat_loss(v: torch.Tensor) -> torch.Tensor:
        parts = torch.split(v, sizes)
        return loss({n: p.reshape(s) for n, p, s in zip(names, parts, shapes, strict=True)})

    theta = torch.cat([tiny.state[n].to(F64).reshape(-1) for n in names])
    # vectorized (vmap over the rows): the same Hessian bit for bit, a tenth of the CPU time
    h = torch.autograd.functional.hessian(flat_loss, theta, vectorize=True)
    scale = float(torch.linalg.eigvalsh((h + h.T) / 2).abs().max())
    for row in r.rows:
        v = t[by_label[row.label]]
        exact = float(v @ h @ v) / float(v @ v)
        assert row.curvature == pytest.approx(exact, rel=1e-4, abs=1e-6 * scale), row.label
    assert any(abs(row.curvature) > 1e-4 * scale for row in r.rows)  # not all trivially 0


def test_residual_tangents_of_an_rmsnorm_family(saved):
    """llama (pre-norm RMSNorm, untied head): the stream's map is all of O(d), d(d-1)/2 = 28
    tangents once for the model. At the model's own gains it acts conjugated by the folding:
    a writer W -> Q^T W (rows E -> E Q), a reader W -> W diag(g) Q diag(1/g); each tangent
    equals a central difference of that finite action (1e-6) and, independently, those
    formulas; the loss is flat along each orbit, the gradient orthogonal, and the curvature
    equals the dense Hessian's quadratic form (1e-4). Turning the stream without the
    folding changes the function (the negative control)."""
    from rotviz.analysis.tangents import ResidualFrame, residual_matrix
    from rotviz.sources.loading import load_model
    from rotviz.symmetry.residual import apply_residual

    ll = load_model(saved("llama", 0, layers=1, d=8, heads=2, ffn=8))
    view = f64_view(ll, None)
    res = [g for g in generators(view) if g.kind == "residual"]
    assert len(res) == 28 and group_dimension(view)[-1]["group"] == "orthogonal"
    names, t, gens = tangents(ll, gens=res)
    frame = ResidualFrame.of(view)
    gain = view.other["model.norm.weight"]
    for row, g in enumerate(gens):
        e = residual_matrix(view, g)
        assert torch.equal(e, -e.T)
        eps = 1e-5
        up, down = (frame.at(torch.linalg.matrix_exp(s * e)) for s in (eps, -eps))
        fd = torch.cat([((up[n] - down[n]) / (2 * eps)).reshape(-1) for n in names])
        assert float((fd - t[row]).norm()) <= 1e-6 * float(t[row].norm()), g.label
        part = dict(zip(names, torch.split(t[row], [ll.state[n].numel() for n in names]),
                        strict=True))
        emb = view.other["model.embed_tokens.weight"]
        assert torch.allclose(part["model.embed_tokens.weight"].reshape(emb.shape), emb @ e,
                              rtol=0, atol=1e-12)
        head = view.other["lm_head.weight"]
        want = head * gain @ e / gain
        assert torch.allclose(part["lm_head.weight"].reshape(head.shape), want, rtol=0,
                              atol=1e-12)
        assert float(part["model.norm.weight"].abs().max()) == 0.0  # gains stay

    split = synthetic_split(ll, 6)
    r = flat(ll, None, split, per_layer=28, steps=(-0.5, 0.5))
    rr = [x for x in r.rows if x.kind == "residual"]
    assert len(rr) == 28 and r.dimension[-1]["tangents"] == 28
    assert max(x.loss_change for x in rr) <= 1e-6
    assert max(x.cosine for x in rr) <= 1e-5 < r.control_cosine
    # the curvature along each against the dense Hessian of an independent float64 loss
    buffers = {n: b.to(F64) if b.is_floating_point() else b for n, b in ll.model.named_buffers()}
    sizes = [ll.state[n].numel() for n in names]

    def flat_loss(v: torch.Tensor) -> torch.Tensor:
        params = {n: p.reshape(ll.state[n].shape)
                  for n, p in zip(names, torch.split(v, sizes), strict=True)}
        with math_attention():
            lg = torch.func.functional_call(ll.model, {**buffers, **params},
                                            (split.inputs,)).logits
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]).to(F64), split.labels.reshape(-1))

    theta = torch.cat([ll.state[n].to(F64).reshape(-1) for n in names])
    assert float(flat_loss(theta)) == pytest.approx(r.loss, rel=1e-12)
    h = torch.autograd.functional.hessian(flat_loss, theta, vectorize=True)
    by_label = {g.label: i for i, g in enumerate(gens)}
    for x in rr:
        v = t[by_label[x.label]]
        assert x.curvature == pytest.approx(float(v @ h @ v) / float(v @ v), rel=1e-4)
    assert min(abs(x.curvature) for x in rr) > 1e-5  # a random point: not a critical one
    # negative control: the stream turned with the gains left in the norms
    q = torch.linalg.matrix_exp(0.5 * residual_matrix(view, gens[0]))
    raw = write_state(apply_residual(view, q, check=False))
    moved = torch.cat([raw[n].reshape(-1) for n in names])
    assert abs(float(flat_loss(moved)) - r.loss) > 1e-4 * r.loss


def test_no_residual_tangents_where_the_family_has_no_continuous_map(loaded):
    """gpt2 (LayerNorm, head tied to the embedding: the final gain cannot be folded) and
    bert (post-norm: permutations only) get no residual tangents, and the record says why."""
    for fam, words in (("gpt2", "tied to the embedding"), ("bert", "discrete group")):
        model = loaded(fam)
        view = f64_view(model, None)
        row = group_dimension(view)[-1]
        assert row["layer"] == "residual" and row["total"] == 0 and row["group"] is None
        assert words in row["why"], row["why"]
        assert not [g for g in generators(view) if g.kind == "residual"]
        r = flat(model, None, synthetic_split(model, 4), per_layer=1, curvature=False)
        assert "residual" not in {x.kind for x in r.rows}
        assert r.dimension[-1]["why"] == row["why"]


@pytest.mark.parametrize("option", [("--nullity-tol", "0.1"), ("--nullity-exact", "100"),
                                    ("--nullity-probes", "2"), ("--nullity-steps", "10")])
def test_nullity_settings_need_the_nullity_count(option, capfd, ws):
    """The nullity count's settings were accepted and ignored without --nullity yes (after
    minutes of work); each is declared to need it (Param.needs) and refused in one line
    before any model loads
    (models that do not exist: a refusal after loading would name them instead)."""
    from conftest import refused

    flag, value = option
    refused(["flat", "nosuch", "--data", "digits", flag, value], capfd, ws,
            f"{flag} needs --nullity yes: add it, or drop {flag}")
    refused(["flat", "nosuch", "--data", "digits", flag, value, "--nullity", "no"], capfd, ws,
            f"{flag} needs --nullity yes")

"""Curvature (rotviz.measures.hessian, the `hessian` record): Lanczos eigenvalues and traces
against the exact dense Hessian of a tiny ViT, Hutchinson within its standard error, the
spectrum's invariance under permutations and rotations and its change under a rescale that
keeps the function, and the CLI's JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import clone_state
from pairs import assert_unchanged, synthetic_split

from rotviz.analysis.hvp import Curvature, group_names, math_attention, restricted
from rotviz.analysis.lanczos import hutchinson, top_eigenvalues, top_eigenvectors
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.measures.hessian import hessian
from rotviz.plots.figure_style import Style
from rotviz.sources.loading import Loaded
from rotviz.symmetry.actions import apply, random_element
from rotviz.symmetry.view import read_view, write_state

SMALL = dict(layers=1, d=8, heads=2, ffn=16)  # 845 parameters: a dense Hessian in seconds
F64 = torch.float64


@pytest.fixture(scope="module")
def tiny(saved) -> Loaded:
    from rotviz.sources.loading import load_model

    return load_model(saved("vit", 0, **SMALL))


_CACHE: dict[tuple[int, str], object] = {}


def split_of(model: Loaded):
    key = (id(model), "split")
    if key not in _CACHE:
        _CACHE[key] = synthetic_split(model, 12)
    return _CACHE[key]


def dense_hessian(model: Loaded, state: dict, split) -> tuple[torch.Tensor, list[str]]:
    """The exact Hessian of the split's mean cross-entropy with respect to the flattened
    parameters, in float64, by torch.autograd.functional.hessian on a plain functional_call
    of the module (independent of rotviz's loss code)."""
    names = [n for n, _ in model.model.named_parameters()]
    shapes = [state[n].shape for n in names]
    sizes = [state[n].numel() for n in names]
    buffers = {n: b.to(F64) for n, b in model.model.named_buffers()}
    x, y = split.inputs.to(F64), split.labels

    def loss(flat: torch.Tensor) -> torch.Tensor:
        parts = torch.split(flat, sizes)
        params = {n: p.reshape(s) for n, p, s in zip(names, parts, shapes, strict=True)}
        with math_attention():
            out = torch.func.functional_call(model.model, {**buffers, **params}, (x,))
        logits = out.logits if hasattr(out, "logits") else out[0]
        return F.cross_entropy(logits, y)

    flat = torch.cat([state[n].to(F64).reshape(-1) for n in names])
    h = torch.autograd.functional.hessian(loss, flat, vectorize=True)
    return (h + h.T) / 2, names


def exact(model: Loaded) -> tuple[torch.Tensor, np.ndarray]:
    """The dense Hessian at the model's own state and its eigenvalues, largest first
    (computed once per module)."""
    key = (id(model), "exact")
    if key not in _CACHE:
        h, _ = dense_hessian(model, model.state, split_of(model))
        _CACHE[key] = h, torch.linalg.eigvalsh(h).numpy()[::-1].copy()
    return _CACHE[key]


def test_top_eigenvalues_and_trace_equal_the_dense_hessian(tiny):
    before = clone_state(tiny.state)
    h, eig = exact(tiny)
    n = h.shape[0]
    r = hessian(tiny, None, split_of(tiny), top=3, probes=n, seed=1, dtype=F64)
    assert r.n_params == n == 845 and r.trace_se == 0.0
    np.testing.assert_allclose(r.eigenvalues, eig[:3], rtol=1e-4)
    assert r.eigenvalues == sorted(r.eigenvalues, reverse=True)
    assert r.trace == pytest.approx(float(h.trace()), rel=1e-4)
    # the loss it differentiates is the one the evaluator reports
    ev = Evaluator(tiny, split_of(tiny))
    assert r.loss == pytest.approx(ev.evaluate(ev.params(tiny.state))[0], rel=1e-6)
    assert_unchanged(tiny, before)
    # float32 (the default) agrees too, on the top eigenvalue
    r32 = hessian(tiny, None, split_of(tiny), top=1, seed=1)
    assert r32.eigenvalues[0] == pytest.approx(eig[0], rel=1e-4)


def test_lanczos_says_when_it_did_not_converge(tiny):
    """Two steps cannot resolve the top three: the result says so, with the largest Ritz
    residual ||H y - theta y||, which equals the one taken with the dense Hessian and bounds
    each Ritz value's distance to an eigenvalue; enough steps converge to the dense top three
    to 1e-3 with a residual below 1e-4 of the top eigenvalue."""
    h, eig = exact(tiny)
    short = hessian(tiny, None, split_of(tiny), top=2, steps=2, seed=1, dtype=F64)
    assert short.converged is False and short.residual > 1e-2
    cur = Curvature(Evaluator(tiny, split_of(tiny)), tiny.state, F64)
    vals, vecs = top_eigenvectors(cur.hvp, cur.n, 2, torch.Generator().manual_seed(1), F64,
                                  cur.device, steps=2)
    np.testing.assert_allclose(vals, short.eigenvalues, rtol=1e-10)
    dense = [float((h @ v - t * v).norm()) for t, v in zip(vals, vecs, strict=True)]
    assert short.residual == pytest.approx(max(dense), rel=1e-6)
    assert all(np.abs(eig - t).min() <= r + 1e-9 for t, r in zip(vals, dense, strict=True))
    d = short.to_dict()
    assert d["converged"] is False and d["residual"] == short.residual
    from rotviz.measures import measurement

    said = measurement("hessian").summary(short, "")
    assert f"(not converged (residual {short.residual:.2g}): raise --iterations)" in said
    full = hessian(tiny, None, split_of(tiny), top=3, steps=200, seed=1, dtype=F64)
    assert full.converged is True and full.residual <= 1e-4 * full.eigenvalues[0]
    np.testing.assert_allclose(full.eigenvalues, eig[:3], atol=1e-3)


def test_top_beyond_the_lanczos_steps_is_refused_before_loading(capsys):
    """--top K needs K Lanczos steps at least (one Ritz value a step), in hessian and
    sharpness alike; refused in one line before a model is read (a missing model would
    otherwise be the error)."""
    for cmd in (["hessian", "nosuch-model", "--data", "digits", "--top", "50",
                 "--iterations", "2"],
                ["sharpness", "nosuch-a", "nosuch-b", "--data", "digits", "--top", "3",
                 "--iterations", "2"]):
        assert main(cmd) == 2, cmd
        err = capsys.readouterr().err
        top = cmd[cmd.index("--top") + 1]
        assert f"--top {top} asks for more eigenvalues than --iterations 2 Lanczos steps" \
            in err and err.count("\n") == 1, err


def test_group_restrictions_are_the_principal_sub_matrices(tiny):
    """Per kind: each group's top eigenvalue equals the top eigenvalue of the dense
    Hessian's principal sub-matrix over that group's parameters; the small groups' exact
    traces equal the sub-matrix traces; the kinds cover every parameter once."""
    h, _ = exact(tiny)
    cur = Curvature(Evaluator(tiny, split_of(tiny)), tiny.state, F64)
    masks = cur.masks("kind", tiny)
    assert set(masks) == {"embeddings", "qk", "vo", "ffn", "norms", "head"}
    assert int(sum(m.long() for m in masks.values()).max()) == 1
    assert sum(int(m.sum()) for m in masks.values()) == cur.n
    gen = torch.Generator().manual_seed(0)
    for g, mask in masks.items():
        idx = mask.nonzero().flatten()
        sub = h[idx][:, idx]
        want = float(torch.linalg.eigvalsh(sub)[-1])
        got = top_eigenvalues(restricted(cur.hvp, mask), cur.n, 1, gen, F64, cur.device,
                              mask)[0]
        assert got == pytest.approx(want, rel=1e-4), g
        if idx.numel() <= 50:  # norms (48) and head (45): exact traces by unit vectors
            tr, se = hutchinson(restricted(cur.hvp, mask), cur.n, idx.numel(), gen, F64,
                                cur.device, mask)
            assert se == 0.0 and tr == pytest.approx(float(sub.trace()), rel=1e-6), g
    names = group_names(cur.names, tiny, "block")
    assert set(names.values()) == {"block 0", "outside"}
    assert names["vit.layers.0.mlp.fc1.weight"] == "block 0"
    assert names["classifier.weight"] == "outside"


def test_hutchinson_lies_within_three_standard_errors(tiny):
    h, _ = exact(tiny)
    said: list[tuple[int, int, str]] = []
    r = hessian(tiny, None, split_of(tiny), top=1, probes=60, seed=3, dtype=F64,
                progress=lambda *a: said.append(a))
    assert said[-1] == (60, 60, "trace probe 60 of 60") and said[0][2].startswith("Lanczos")
    assert r.trace_se > 0
    assert abs(r.trace - float(h.trace())) <= 3 * r.trace_se
    again = hessian(tiny, None, split_of(tiny), top=1, probes=60, seed=3, dtype=F64)
    assert again.trace == r.trace and again.eigenvalues == r.eigenvalues  # seeded


def _moved(model: Loaded, element) -> dict[str, torch.Tensor]:
    view = read_view(model.spec, model.config, model.state)
    return write_state(apply(view, element))


def _top_at(model: Loaded, state: dict) -> float:
    cur = Curvature(Evaluator(model, split_of(model)), state, F64)
    gen = torch.Generator().manual_seed(0)
    return top_eigenvalues(cur.hvp, cur.n, 1, gen, F64, cur.device)[0]


def test_permutations_and_rotations_keep_the_spectrum_a_rescale_changes_it(tiny):
    """Dinh et al. (2017): a rescale W_Q -> s W_Q, W_K -> W_K / s leaves every output the
    same but is not an isometry of parameter space, so the curvature changes; permutations
    and rotations are isometries, so the spectrum stays."""
    dims = read_view(tiny.spec, tiny.config, tiny.state).dims
    ev = Evaluator(tiny, split_of(tiny))
    x = ev.batches[0][0]
    base_logits = ev.logits(ev.params(tiny.state), x)
    top = _top_at(tiny, tiny.state)
    _, eig = exact(tiny)
    assert top == pytest.approx(eig[0], rel=1e-4)

    rotated = _moved(tiny, random_element(dims, 2, rescale=False))  # FFN perm + head rotations
    assert not torch.allclose(rotated["vit.layers.0.attention.q_proj.weight"],
                              tiny.state["vit.layers.0.attention.q_proj.weight"])
    torch.testing.assert_close(ev.logits(ev.params(rotated), x), base_logits, atol=1e-5,
                               rtol=0)
    assert _top_at(tiny, rotated) == pytest.approx(top, rel=1e-4)

    scaled = _moved(tiny, random_element(dims, 6, ffn=False, attn=False, rescale=True))
    assert (ev.logits(ev.params(scaled), x) - base_logits).abs().max() <= 1e-5
    changed = _top_at(tiny, scaled)
    assert abs(changed - top) / top > 1e-2


def test_the_cli_writes_the_json_keys(tmp_path, capsys):
    """`rotviz hessian MODEL --data D ...` on the zoo's digits ViT with 32 examples."""
    js = tmp_path / "h.json"
    rc = main(["hessian", "zoo:vit-digits-s3", "--data", "digits", "--top", "2",
               "--trace", "2", "--by", "block", "--examples", "32", "--iterations", "8",
               "--json", str(js), "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("hessian on cpu")
    d = json.loads(js.read_text())
    assert {"eigenvalues", "trace", "trace_se", "groups", "n_params", "loss"} <= set(d)
    assert len(d["eigenvalues"]) == 2 and d["eigenvalues"][0] >= d["eigenvalues"][1] > 0
    assert d["trace"] is not None and d["trace_se"] > 0 and d["n"] == 32
    blocks = {g["group"] for g in d["groups"]}
    assert "outside" in blocks and "block 0" in blocks
    # its plot: title, axes with units, a legend titled, one bar series per rank
    from rotviz.measures import measurement
    from rotviz.plots import style

    fig = measurement("hessian").plot(d, Style())
    assert fig.layout.title.text.startswith("Top Hessian eigenvalues of zoo:vit-digits-s3")
    assert "eigenvalue" in fig.layout.yaxis.title.text and "(by block)" in \
        fig.layout.xaxis.title.text and fig.layout.legend.title.text
    assert [t.marker.color for t in fig.data] == [style.color(0), style.color(1)]
    assert list(fig.data[0].x) == ["whole model", *[g["group"] for g in d["groups"]]]
    rc = main(["hessian", "zoo:vit-digits-s3", "--data", "digits", "--top", "51"])
    err = capsys.readouterr().err
    assert rc != 0 and "--top must be an integer from 1 to 50" in err and err.count("\n") == 1


def test_bad_grouping_and_density(tiny):
    from types import SimpleNamespace

    from rotviz.runner import measure

    with pytest.raises(RotvizError, match="unknown grouping"):
        group_names(["x"], tiny, "layer")
    with pytest.raises(RotvizError, match="read block by block, and Hessian-vector products"):
        measure("hessian", SimpleNamespace(at_size=True), split_of(tiny))
    with pytest.raises(RotvizError, match="--by must|unknown --by 'layer'"):
        measure("hessian", SimpleNamespace(at_size=False), split_of(tiny), by="layer")
    r = hessian(tiny, None, split_of(tiny), top=2, density_probes=2, steps=20, dtype=F64)
    d = r.density
    grid, dens = np.asarray(d["grid"]), np.asarray(d["density"])
    # a probability density: it integrates to 1, and its nodes' weights sum to 1
    assert float(np.trapezoid(dens, grid)) == pytest.approx(1.0, abs=2e-2)
    assert sum(d["weights"]) == pytest.approx(1.0, rel=1e-9)
    _, eig = exact(tiny)
    assert max(d["nodes"]) == pytest.approx(eig[0], rel=1e-3)  # extreme nodes converge first


@pytest.mark.parametrize(("family", "fused", "norm"), [
    ("gpt2", "transformer.h.1.attn.c_attn.weight", "transformer.h.1.ln_1.weight"),
    ("qwen3", "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.q_norm.weight"),
])
def test_kinds_by_name_across_families(loaded, family, fused, norm):
    """A fused Q/K/V projection is its own kind (qkv), a separate one is qk; per-head q/k
    norms are norms; every block tensor belongs to its block."""
    m = loaded(family)
    names = [n for n, _ in m.model.named_parameters()]
    kinds, blocks = group_names(names, m, "kind"), group_names(names, m, "block")
    assert kinds[fused] == ("qkv" if family == "gpt2" else "qk") and kinds[norm] == "norms"
    assert blocks[fused] == blocks[norm] == "block 1"
    assert {"embeddings", "vo", "ffn"} <= set(kinds.values())
    assert "other" not in kinds.values()


def test_the_hessian_json_says_the_split_and_the_data(ws, capfd):
    """The hessian and sharpness JSON say the split and the data (from test_early_refusals)."""
    A, B = "zoo:vit-digits-s3", "zoo:vit-digits-s6"
    assert main(["hessian", A, "--data", "digits", "--split", "train", "--examples", "32",
                 "--top", "1", "--iterations", "5", "--json", "h.json"]) == 0
    d = json.loads((ws / "h.json").read_text())
    assert d["split"] == "train" and d["data"] == "digits"
    assert " train samples" in capfd.readouterr().out
    assert main(["sharpness", A, B, "--data", "digits", "--split", "train", "--points", "3",
                 "--examples", "16", "--top", "1", "--iterations", "3", "--json",
                 "s.json"]) == 0
    d = json.loads((ws / "s.json").read_text())
    assert d["split"] == "train" and d["data"] == "digits"


def test_geodesic_sharpness_beside_the_eigenvalues_leaves_them_as_they_were(tiny, capsys):
    """`--geodesic average|worst` adds the invariant sharpness (rotviz.analysis.
    geodesic_sharpness) as the JSON's `geodesic`, in the summary and the caption; off (the
    default) the field is null and every other number is the same either way."""
    from rotviz.measures.hessian import _caption, _summary

    split = split_of(tiny)
    off = hessian(tiny, None, split, top=2, probes=3, seed=1)
    on = hessian(tiny, None, split, top=2, probes=3, seed=1,
                 geodesic={"kind": "average", "rho": 0.1, "samples": 2})
    assert off.geodesic is None and "geodesic" not in _summary(off, "")
    assert on.eigenvalues == off.eigenvalues and on.trace == off.trace and on.loss == off.loss
    g = on.geodesic
    assert g["kind"] == "average" and len(g["rises"]) == 2 and g["samples"] == 2
    assert g["value"] == pytest.approx(sum(g["rises"]) / 2, rel=1e-12)
    assert "geodesic sharpness (average-case, rho 0.1, 2 directions)" in _summary(on, "")
    assert "Geodesic sharpness (average-case" in _caption(on.to_dict())
    from rotviz.measures.hessian import _rows

    assert all("geodesic_sharpness" not in r for r in _rows(off.to_dict()))
    assert _rows(on.to_dict())[0]["geodesic_sharpness"] == g["value"]


def test_geodesic_options_on_the_command_line(ws, capfd):
    rc = main(["hessian", "zoo:vit-digits-s3", "--data", "digits", "--top", "1",
               "--examples", "16", "--iterations", "4", "--geodesic", "worst",
               "--geodesic-steps", "1", "--json", "g.json"])
    out = capfd.readouterr().out
    d = json.loads((ws / "g.json").read_text())
    assert rc == 0 and "geodesic sharpness (worst-case, rho 0.1, 1 ascent steps)" in out
    assert d["geodesic"]["kind"] == "worst" and len(d["geodesic"]["rises"]) == 2
    assert d["geodesic"]["value"] == max(d["geodesic"]["rises"]) > 0
    for argv, says in ((["--geodesic-steps", "2"], "--geodesic-steps needs --geodesic worst"),
                       (["--geodesic", "average", "--geodesic-rho", "0"],
                        "--geodesic-rho must be a number from 1e-06 to 10"),
                       (["--geodesic", "yes"], "--geodesic")):
        rc = main(["hessian", "zoo:vit-digits-s3", "--data", "digits", *argv])
        err = capfd.readouterr().err
        assert rc == 2 and says in err and err.count("\n") == 1

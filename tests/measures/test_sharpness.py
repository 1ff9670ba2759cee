"""Sharpness along the path (rotviz.measures.sharpness, the `sharpness` record): its ends are
exactly `hessian` at A and at B', the matched and unmatched paths agree at alpha = 1 when the
matching is permutations and rotations only (B and B' are one function with conjugate
Hessians), the CLI's JSON keys, the plot, and the refusal at size."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import clone_state
from pairs import assert_unchanged, synthetic_split

from rotviz.analysis.paths import path_point
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.match.endpoints import match_endpoints
from rotviz.measures.hessian import hessian
from rotviz.measures.sharpness import rescales, sharpness_on
from rotviz.plots.figure_style import Style
from rotviz.sources.loading import Loaded

SMALL = dict(layers=1, d=8, heads=2, ffn=16)  # 845 parameters
F64 = torch.float64


@pytest.fixture(scope="module")
def pair(saved) -> tuple[Loaded, Loaded]:
    from rotviz.sources.loading import load_model

    return load_model(saved("vit", 0, **SMALL)), load_model(saved("vit", 1, **SMALL))


def test_ends_are_the_hessian_at_a_and_b_prime_and_the_paths_meet(pair):
    a, b = pair
    before_a, before_b = clone_state(a.state), clone_state(b.state)
    ends = match_endpoints(a, b, "ffn,attn")
    split = synthetic_split(a, 12)
    r = sharpness_on(ends, split, points=3, top=2, probes=3, compare=True, seed=5, steps=40,
                     dtype=F64)
    assert r.alphas == [0.0, 0.5, 1.0]
    at_a = hessian(a, a.state, split, top=2, probes=3, seed=5, steps=40, dtype=F64)
    at_bp = hessian(a, ends.matched, split, top=2, probes=3, seed=5, steps=40, dtype=F64)
    # the ends: the same numbers as `hessian` with the same seed and steps (1e-6 relative)
    assert r.matched_top[0] == pytest.approx(at_a.eigenvalues, rel=1e-6)
    assert r.matched_top[-1] == pytest.approx(at_bp.eigenvalues, rel=1e-6)
    assert r.matched_trace[0] == pytest.approx(at_a.trace, rel=1e-6)
    assert r.matched_trace[-1] == pytest.approx(at_bp.trace, rel=1e-6)
    assert r.matched_loss[0] == pytest.approx(at_a.loss, rel=1e-9)
    assert r.unmatched_top[0] == pytest.approx(at_a.eigenvalues, rel=1e-6)  # both start at A
    # B and B' are one function, permuted and rotated: the same top eigenvalue (1e-4)
    assert r.unmatched[-1] == pytest.approx(r.matched[-1], rel=1e-4)
    assert r.unmatched_loss[-1] == pytest.approx(r.matched_loss[-1], rel=1e-6)
    # B really was moved (otherwise the agreement says nothing), and the middle differs
    assert ends.info.distance_after < ends.info.distance_before
    assert r.matched[1] != pytest.approx(r.unmatched[1], rel=1e-3)
    assert r.matched[0] > 0 and r.notes == []
    # the path's residual is the largest of its points', each as `hessian` reports it
    assert r.residual >= max(at_a.residual, at_bp.residual) > 0
    assert r.converged is True and at_a.converged and at_bp.converged  # 40 steps suffice
    short = sharpness_on(ends, split, points=3, top=2, compare=False, seed=5, steps=2,
                         dtype=F64)
    assert short.converged is False and short.residual > 0
    from rotviz.measures import measurement

    said = measurement("sharpness").summary(short, "")
    assert f"(not converged (residual {short.residual:.2g}): raise --iterations)" in said
    assert_unchanged(a, before_a)
    assert_unchanged(b, before_b)


def test_path_point_is_exact_at_the_ends_and_linear_between(pair):
    a, b = pair
    sa, sb = a.state, b.state
    assert all(path_point(sa, sb, 0.0)[k] is sa[k] for k in sa)
    assert all(torch.equal(path_point(sa, sb, 1.0)[k], sb[k]) for k in sa
               if sa[k].is_floating_point())
    assert rescales("seed") and rescales("ffn,rescale") and not rescales("ffn,attn")
    mid = path_point(sa, sb, 0.25)
    k = next(k for k in sa if sa[k].dim() == 2)
    assert torch.allclose(mid[k], 0.75 * sa[k] + 0.25 * sb[k], atol=1e-6)


def test_the_cli_writes_the_json_keys_and_refuses_at_size(tmp_path, capsys):
    """`rotviz sharpness A B --data digits` on the zoo's default pair with 16 examples."""
    js = tmp_path / "s.json"
    rc = main(["sharpness", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
               "--match", "ffn,attn", "--points", "2", "--examples", "16",
               "--iterations", "12", "--json", str(js), "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and out.strip().splitlines()[-1].startswith("sharpness on cpu"), out
    d = json.loads(js.read_text())
    assert {"alphas", "matched", "unmatched", "matched_top", "unmatched_top", "matched_loss",
            "unmatched_loss", "matched_trace", "n_params", "match"} <= set(d)
    assert d["alphas"] == [0.0, 1.0] and len(d["matched"]) == len(d["unmatched"]) == 2
    assert d["matched_trace"] is None and d["n"] == 16 and d["matched"][0] > 0
    assert d["unmatched"][0] == pytest.approx(d["matched"][0], rel=1e-9)
    from rotviz.measures import measurement
    from rotviz.plots import style

    m = measurement("sharpness")
    fig = m.plot(d, Style())
    assert fig.layout.title.text.startswith("Sharpness along the path<br>zoo:vit-digits-s3")
    assert d["split"] == "test" and d["data"] == "digits"  # the split's name, not the data's
    assert "alpha" in fig.layout.xaxis.title.text and "eigenvalue" in \
        fig.layout.yaxis.title.text and fig.layout.legend.title.text == "path"
    assert [t.line.color for t in fig.data] == [style.color(0), style.color(1)]
    assert len(m.rows(d)) == 4
    rc = main(["sharpness", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
               "--points", "102"])
    err = capsys.readouterr().err
    assert rc != 0 and "--points must be an integer from 2 to 101" in err
    from types import SimpleNamespace

    from rotviz.runner import measure

    with pytest.raises(RotvizError, match="read block by block, and Hessian-vector products"):
        measure("sharpness", SimpleNamespace(at_size=True), synthetic_split(
            __import__("rotviz.sources.loading", fromlist=["load_model"]).load_model(
                "zoo:vit-digits-s3"), 4))


# ---- Hessian directions for slices ------------------------------------------------------

def test_a_slice_along_the_top_eigenvector_curves_by_its_eigenvalue(pair):
    """1D slice along the top Hessian eigenvector, unnormalised (a unit vector): the second
    finite difference of the loss at the centre is lambda_1 |d|^2 (to 1 %; 0.3 % seen), and
    lambda_1 is `hessian`'s top eigenvalue (float64) when the biases move too."""
    from rotviz.analysis.loss_grid import slice_at

    a, _ = pair
    before = clone_state(a.state)
    split = synthetic_split(a, 12)
    ref = hessian(a, None, split, top=2, seed=0, steps=60, dtype=F64).eigenvalues
    for keep in (True, False):
        h = 0.02
        s = slice_at(a, split, dims=1, directions="hessian", norm="none", keep_1d=keep,
                     grid=3, span=h, seed=1)
        (lam,) = s.eigenvalues
        assert s.direction_norms[0] == pytest.approx(1.0, rel=1e-5)
        second = (s.loss[0] - 2 * s.centre_loss + s.loss[2]) / h**2
        assert second == pytest.approx(lam * s.direction_norms[0] ** 2, rel=1e-2)
        assert s.loss[1] == s.centre_loss and s.directions == "hessian"
        if keep:  # the whole Hessian: the same top eigenvalue as `rotviz hessian`
            assert lam == pytest.approx(ref[0], rel=1e-5)
        else:  # biases and gains held: the sub-matrix's, at most the whole one (Cauchy)
            assert 0 < lam <= ref[0] * (1 + 1e-4)
    # 2D: the two directions are orthonormal eigenvectors, largest first
    s2 = slice_at(a, split, dims=2, directions="hessian", norm="none", keep_1d=True, grid=3,
                  span=h, seed=1)
    assert abs(s2.cosine) < 1e-6 and s2.direction_norms == pytest.approx([1, 1], rel=1e-5)
    assert s2.eigenvalues == pytest.approx(ref, rel=1e-5)
    # filter-normalised: every row of a weight matrix has that row's norm (biases zeroed)
    from rotviz.analysis.directions import hessian_directions
    from rotviz.evaluation import Evaluator

    ev = Evaluator(a, split)
    theta = ev.params(a.state)
    (d,), _ = hessian_directions(ev, theta, 1, seed=1, norm="filter")
    for k, w in theta.items():
        if w.dim() == 2 and d[k].abs().sum() > 0:
            assert torch.allclose(d[k].double().norm(dim=1), w.double().norm(dim=1),
                                  rtol=1e-6)
        if w.dim() == 1:
            assert not d[k].any()
    assert_unchanged(a, before)


def test_the_slice_record_takes_hessian_directions(pair, capsys):
    from rotviz.runner import measure

    a, _ = pair
    split = synthetic_split(a, 12)
    from rotviz.match.endpoints import unmatched

    s = measure("slice", unmatched(a, a), split, dims=1, directions="hessian", norm="none",
                grid=3, span=0.02, iterations=30)
    assert s.eigenvalues and s.eigenvalues[0] > 0
    assert s.converged is True and s.residual <= 1e-4 * s.eigenvalues[0]
    # two Lanczos steps: directions that are not yet eigenvectors, and the one line says so
    short = measure("slice", unmatched(a, a), split, dims=1, directions="hessian",
                    norm="none", grid=3, span=0.02, iterations=2)
    assert short.converged is False and short.residual > 1e-4 * short.eigenvalues[0]
    from rotviz.measures import measurement

    said = measurement("slice").summary(short, "")
    assert f"(not converged (residual {short.residual:.2g}): raise --iterations)" in said
    with pytest.raises(RotvizError, match="--iterations needs --directions hessian"):
        measure("slice", unmatched(a, a), split, dims=1, iterations=30)


def test_the_app_runs_the_record_and_exports_its_table():
    """The generated app dispatch: `app.run('sharpness', ...)` on the default pair, its CSV
    and figure in the export."""
    import io
    import zipfile

    from rotviz import app
    from rotviz.app.export import measurement_zip

    base = {"anchor": "zoo:vit-digits-s3", "source": "zoo:vit-digits-s6", "data": "digits",
            "seed": 0, "n_eval": 0, "device": "cpu"}
    cfg = app.measure_cfg(base, "ffn,attn", points=2, examples=16, iterations=12)
    r = app.run("sharpness", app.Resources(), cfg)
    assert "sharpness" in app.kinds() and r["alphas"] == [0.0, 1.0]
    assert r["unmatched"][-1] == pytest.approx(r["matched"][-1], rel=1e-4)
    with zipfile.ZipFile(io.BytesIO(measurement_zip("sharpness", cfg, r, images=False))) as z:
        rows = z.read("tables/sharpness.csv").decode().splitlines()
        assert "figures/sharpness.html" in z.namelist()
    assert rows[0] == "path,alpha,top_eigenvalue,loss,trace,trace_se" and len(rows) == 5


def test_the_sharpness_figure_has_room_for_its_titles():
    """The title stands off the left edge and the y title is on two lines, with room."""
    from rotviz.measures.sharpness import sharpness_figure

    A, B = "zoo:vit-digits-s3", "zoo:vit-digits-s6"
    fig = sharpness_figure({"alphas": [0, 0.5, 1], "matched": [3.0, 4.0, 3.0],
                            "model": A, "source": B, "split": "test"})
    lay = fig.layout
    assert lay.title.pad.l >= 10 and lay.margin.l >= 90 and lay.margin.t >= 90
    assert lay.title.text.startswith("Sharpness along the path<br>")
    assert lay.title.text.endswith(" on test")  # no data reference: the split alone
    assert lay.yaxis.title.text.startswith("top Hessian eigenvalue<br>(")

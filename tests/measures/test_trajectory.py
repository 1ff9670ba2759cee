"""Training trajectories on the loss surface (rotviz.measures.trajectory; Li et al., 2018,
Fig. 9): the PCA against an SVD written here, the final checkpoint at the origin, each
offset recovered from its projection and its off-plane part, the surface at a node against
rotviz's loss of that parameter set, one series twice (matched) giving one path twice,
and the refusals."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from rotviz import measure
from rotviz.errors import RotvizError
from tests.conftest import refused

RUN_A, RUN_B = "zoo:vit-digits-run-a", "zoo:vit-digits-run-b"
N = 64  # test samples


@pytest.fixture(scope="module")
def split():
    from rotviz.data.split import load_split

    return load_split("digits", "test", 0).subset(N)


@pytest.fixture(scope="module")
def checkpoints():
    """Run A's checkpoints (step -> model), read independently of the record."""
    from rotviz.measures.training import read_series
    from rotviz.sources.loading import load_model

    return {s: load_model(p) for s, p in read_series(RUN_A).steps.items()}


@pytest.fixture(scope="module")
def alone(split):
    return measure("trajectory", [RUN_A], split, grid=5).to_dict()


@pytest.fixture(scope="module")
def both(split):
    """Runs A and B, unmatched and seed-matched (the Training page's matchings, none and seed:
    the same record as match=["seed"]), on the page's smallest grid: read by the recipe test
    and as the library's side of the page test (never modify it)."""
    return measure("trajectory", [RUN_A, RUN_B], split, grid=5, match=["none", "seed"]).to_dict()


def _offsets(checkpoints) -> tuple[np.ndarray, list[str]]:
    """theta_i - theta_final over the model's floating parameters, written here."""
    final = checkpoints[max(checkpoints)]
    names = [n for n, p in final.model.named_parameters() if p.is_floating_point()]
    rows = [np.concatenate([(m.state[n].double() - final.state[n].double()).reshape(-1).numpy()
                            for n in names]) for m in checkpoints.values()]
    return np.stack(rows), names


def _pcs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy's SVD: the top two directions, signed so the first checkpoint is >= 0 on each,
    and every direction's share of the squared singular values."""
    _, s, vt = np.linalg.svd(x, full_matrices=False)
    v = vt[:2] * np.where(vt[:2] @ x[0] < 0, -1.0, 1.0)[:, None]
    return v, s ** 2 / np.sum(s ** 2)


def test_the_pca_matches_an_svd_and_each_offset_is_recovered(alone, checkpoints):
    (plane,) = alone["planes"]
    path = plane["paths"]["A"]
    x, _ = _offsets(checkpoints)
    v, share = _pcs(x)
    assert path["steps"] == [0, 16, 64, 160, 304]
    assert sum(plane["explained_variance"]) <= 1 + 1e-12
    np.testing.assert_allclose(plane["explained_variance"], share[:2], atol=1e-6)
    coords = np.asarray(path["coordinates"])
    np.testing.assert_allclose(coords, x @ v.T, atol=1e-6)
    assert coords[-1].tolist() == [0.0, 0.0] and path["off_plane"][-1] == 0.0  # the final
    proj = coords @ v
    rest = x - proj
    np.testing.assert_allclose(np.linalg.norm(rest, axis=1), path["off_plane"], atol=1e-6)
    np.testing.assert_allclose(proj + rest, x, atol=1e-12)
    off, pn, on = (np.asarray(path[k]) for k in ("off_plane", "projection_norm", "offset_norm"))
    np.testing.assert_allclose(off ** 2 + pn ** 2, on ** 2, rtol=1e-6)
    np.testing.assert_allclose(on, np.linalg.norm(x, axis=1), rtol=1e-9)
    # the paths in its library: the record's own directions give the same decomposition
    from rotviz.measures.trajectory import directions_of, project

    final = checkpoints[max(checkpoints)]
    names = [n for n, p in final.model.named_parameters() if p.is_floating_point()]
    xt = torch.from_numpy(x)
    d, _ = directions_of(xt, final.state, names)
    c, p, r = project(xt, d)
    assert torch.allclose(p + r, xt, atol=1e-6)
    assert torch.allclose(c, torch.from_numpy(coords), atol=1e-6)
    # the checkpoints' own losses and the surface under them: the figure's explanation
    assert path["loss"][0] == pytest.approx(2.318, abs=0.05)  # the shared random start
    assert path["surface_loss"][-1] == pytest.approx(path["loss"][-1], abs=1e-6)  # on the plane


def test_the_surface_at_a_node_is_rotvizs_loss_of_that_parameter_set(alone, checkpoints,
                                                                      split):
    from rotviz.evaluation import Evaluator

    (plane,) = alone["planes"]
    x, names = _offsets(checkpoints)
    v, _ = _pcs(x)
    final = checkpoints[max(checkpoints)]
    ev = Evaluator(final, split)
    for iy, ix in ((0, 0), (1, 3), (4, 2)):
        gx, gy = plane["xs"][ix], plane["ys"][iy]
        state, at = dict(final.state), 0
        for n in names:
            w = final.state[n]
            k = w.numel()
            moved = w.double().reshape(-1).numpy() + gx * v[0, at:at + k] + gy * v[1, at:at + k]
            state[n] = torch.from_numpy(moved).reshape(w.shape).to(w.dtype)
            at += k
        assert plane["surface"][iy][ix] == pytest.approx(ev.evaluate(ev.params(state))[0],
                                                         abs=1e-6)
    # the origin is a node: the final checkpoint itself
    ix, iy = plane["xs"].index(0.0), plane["ys"].index(0.0)
    assert plane["surface"][iy][ix] == pytest.approx(plane["paths"]["A"]["loss"][-1], abs=1e-6)


@pytest.mark.parametrize("spec", ["weight", "none"])
def test_one_series_twice_gives_one_path_twice(spec, split):
    r = measure("trajectory", [RUN_A], split, grid=3, match=[spec],
                **{"with": RUN_A}).to_dict()
    assert [p["name"] for p in r["planes"]] == (["unmatched", "matched"] if spec != "none"
                                                else ["unmatched"])
    for p in r["planes"]:
        a, b = p["paths"]["A"], p["paths"]["B"]
        np.testing.assert_allclose(b["coordinates"], a["coordinates"], atol=1e-6)
        np.testing.assert_allclose(b["off_plane"], a["off_plane"], atol=1e-6)
        np.testing.assert_allclose(b["loss"], a["loss"], atol=1e-6)


def test_two_runs_unmatched_and_matched_share_the_recipe(both):
    r = both
    un, ma = r["planes"]
    assert (un["name"], ma["name"], r["match"], r["series_b"]) == ("unmatched", "matched",
                                                                    "seed", RUN_B)
    assert r["max_output_diff"] < 1e-3
    # the runs share their start, so unmatched both paths start at one point; B moved does not
    assert un["paths"]["B"]["coordinates"][0] == pytest.approx(un["paths"]["A"]["coordinates"][0])
    # B moved keeps every checkpoint's function
    np.testing.assert_allclose(ma["paths"]["B"]["loss"], un["paths"]["B"]["loss"], atol=1e-4)
    for p in (un, ma):
        assert sum(p["explained_variance"]) <= 1
        for q in p["paths"].values():
            off, pn, on = (np.asarray(q[k]) for k in ("off_plane", "projection_norm",
                                                      "offset_norm"))
            np.testing.assert_allclose(off ** 2 + pn ** 2, on ** 2, rtol=1e-6)


def test_filter_normalised_coordinates_are_least_squares(split):
    r = measure("trajectory", [RUN_A], split, grid=3, norm="filter").to_dict()
    (plane,) = r["planes"]
    q = plane["paths"]["A"]
    assert plane["direction_norms"][0] != pytest.approx(1.0)  # no longer orthonormal
    assert q["coordinates"][-1] == [0.0, 0.0]
    off, pn, on = (np.asarray(q[k]) for k in ("off_plane", "projection_norm", "offset_norm"))
    np.testing.assert_allclose(off ** 2 + pn ** 2, on ** 2, rtol=1e-6)


def test_the_figure_and_rows(alone):
    from rotviz.measures import measurement

    m = measurement("trajectory")
    fig = m.figure(alone)
    assert "Training trajectories" in fig.layout.title.text
    assert fig.layout.xaxis.title.text.startswith("PC1 (")
    assert fig.data[0].colorbar.title.text == "test loss (nats)"
    assert [t.mode for t in fig.data[1:]] == ["lines+markers+text"]
    assert len(m.rows(alone)) == 5


def _series(tmp_path, steps: dict[int, object]):
    for s, src in steps.items():
        shutil.copytree(src, tmp_path / f"checkpoint-{s}")
    return str(tmp_path)


def test_refusals_are_one_line(tmp_path, capfd, ws):
    from rotviz.measures.training import read_series
    from rotviz.random_models import save_random

    a = list(read_series(RUN_A).steps.values())
    two = _series(tmp_path / "two", {0: a[0], 1: a[-1]})
    refused(["trajectory", two, "--data", "digits"], capfd, ws, "holds 2 checkpoint(s)",
            "at least 3")
    refused(["trajectory", RUN_A, "--with", two, "--data", "digits"], capfd, ws,
            "holds 2 checkpoint(s)")
    refused(["trajectory", RUN_A, "--data", "digits", "--match", "weight"], capfd, ws,
            "--match weight needs --with SERIES_B")
    refused(["trajectory", RUN_A, "--with", RUN_B, "--data", "digits", "--match", "weight",
             "--match", "seed"], capfd, ws, "give one --match")
    odd = save_random("vit", tmp_path / "odd", seed=0, layers=1, d=32, heads=4, ffn=64, image=8,
                      patch=2, channels=1, labels=10)
    mixed = _series(tmp_path / "mixed", {0: a[0], 5: odd, 9: a[-1]})
    refused(["trajectory", mixed, "--data", "digits"], capfd, ws, "checkpoint at step 5")
    refused(["trajectory", RUN_A, "--data", "digits", "--max-memory", "1"], capfd, ws,
            "trajectory is refused at size")
    with pytest.raises(RotvizError, match="series B is given twice"):
        measure("trajectory", [RUN_A, RUN_B], object(), **{"with": RUN_B})


def test_the_training_page_draws_both_runs_unmatched_and_matched(both):
    """Section 4 of the Training page opens on run A with run B; its Run draws the two
    planes (the page's matchings: none and seed), framed, with the library's numbers (on
    this module's N test samples: the library's side is the `both` fixture)."""
    from tests.test_app import _framed, app, figures

    at = app("training", n=str(N), t_trajectory_grid="5")
    at.button(key="t_trajectory_run").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    (fig,) = [f for t, f in figures(at).items() if t.startswith("Training trajectories")]
    _framed(fig)
    want = both
    assert want["n"] == N
    contours = [tr for tr in fig["data"] if tr["type"] == "contour"]
    assert len(contours) == 2 == len(want["planes"])
    for tr, p in zip(contours, want["planes"], strict=True):
        np.testing.assert_allclose(np.asarray(tr["z"], float), p["surface"], rtol=1e-9)

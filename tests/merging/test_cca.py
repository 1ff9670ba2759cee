"""CCA Merge: the canonical-correlation map equals the textbook one, a planted copy of a model
(its stream moved by a random element of the stream's group, its FFN units permuted, and
scaled where the FFN allows) is recovered (1e-4) and merges back to the model (1e-4), and
bad input is one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rotviz.merging import method
from rotviz.merging.cca import MAP, align, cca_map
from rotviz.merging.combine import merge_states
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import LayerTransform, apply
from rotviz.symmetry.view import read_view, write_state
from tests.merging.reference import refused

TOL = 1e-4


def test_the_map_is_canonical_correlation():
    """rho equals the singular values of Q_a^T Q_b (Bjorck-Golub, written here in numpy),
    T^-1 is T's inverse, and T sends the source's canonical variates onto the anchor's."""
    g = np.random.default_rng(0)
    xa = g.standard_normal((400, 6)) @ g.standard_normal((6, 6))
    xb = xa @ g.standard_normal((6, 5)) + 0.5 * g.standard_normal((400, 5))
    ca, cb = xa - xa.mean(0), xb - xb.mean(0)
    n = len(xa)
    t, ti, rho = cca_map(*(torch.from_numpy(m / n) for m in (ca.T @ ca, cb.T @ cb, ca.T @ cb)))
    qa, qb = np.linalg.qr(ca)[0], np.linalg.qr(cb)[0]
    want = np.linalg.svd(qa.T @ qb, compute_uv=False)
    np.testing.assert_allclose(rho.numpy(), want[:len(rho)], rtol=0, atol=1e-10)
    assert t.shape == (5, 6) and ti.shape == (6, 5)
    # the source's top canonical variate, mapped by T, is the anchor's top variate: its
    # correlation with the anchor's data along that direction is rho_1
    top = np.linalg.svd(qa.T @ qb)[0][:, 0]  # the anchor's top direction, in qa's basis
    za = qa @ top
    zb = cb @ t.numpy() @ np.linalg.pinv(ca) @ za
    assert abs(abs(np.corrcoef(za, zb)[0, 1]) - want[0]) < 1e-8


def _planted(m, seed: int = 3):
    """A copy of model `m` moved by a random element of its symmetries that CCA aligns: the
    stream by a random map of its group (pre-norm streams only), each FFN's units by a
    permutation, then (gated FFNs) random scales in [0.5, 2]; with the maps drawn."""
    v = read_view(m.spec, m.config, m.state).to(dtype=torch.float64)
    moves_stream = rs.group_of(v) != "permutation"
    c, gauge = rs.canonicalise(v)
    q = rs.random_map(c, seed) if moves_stream else None
    gen = torch.Generator().manual_seed(seed)
    ts = {}
    for i, blk in enumerate(c.blocks):
        perm = torch.randperm(blk.ffn.w_in.shape[0], generator=gen)
        scale = None if blk.ffn.w_gate is None else \
            0.5 + 1.5 * torch.rand(len(perm), generator=gen, dtype=torch.float64)
        ts[i] = LayerTransform(perm=perm, ffn_scale=scale)
    moved = apply(rs.apply_residual(c, q) if moves_stream else c, ts)
    state = {k: x.to(m.state[k].dtype) for k, x in write_state(rs.restore(moved, gauge)).items()}
    return state, q, ts


@pytest.mark.parametrize("family", ["vit", "llama", "bert"])  # centred, orthogonal, kept stream
def test_planted_copy_is_recovered_and_merges_back(loaded, family):
    from tests.pairs import synthetic_split

    m = loaded(family)
    state, q, ts = _planted(m)
    split = synthetic_split(m, n=32)
    st = align(m, state, split, batches=2, batch_size=16)
    if q is None:  # post-norm: the stream keeps the basis the matching gave it
        assert not any(k.startswith(f"{MAP}stream") for k in st)
    else:
        assert float((st[f"{MAP}stream"] - q.T).abs().max()) < TOL
        assert float((st[f"{MAP}stream"] @ st[f"{MAP}stream_inv"]
                      - torch.eye(len(q), dtype=torch.float64)).abs().max()) < 1e-9
    for i, t in ts.items():
        # unit k of the copy is the model's unit perm[k] (times scale[k]): h_b = h_a P
        p = torch.eye(len(t.perm), dtype=torch.float64)[:, t.perm]
        if t.ffn_scale is not None:
            p = p * t.ffn_scale
        assert float((st[f"{MAP}ffn.{i}"] @ p - torch.eye(len(p), dtype=torch.float64))
                     .abs().max()) < TOL
    stats = method("cca").statistics(m, m.state, split, "cpu", batches=2, batch_size=16)
    assert stats == {}  # the anchor is its own alignment
    merged = merge_states(m, "cca", m.state, state, 0.5, stats, st)
    for k, v in m.state.items():
        assert float((merged[k].double() - v.double()).abs().max()) < TOL, k
    assert any(float((state[k].double() - v.double()).abs().max()) > 0.1
               for k, v in m.state.items())  # the copy was moved far


def test_the_record():
    m = method("cca")
    assert m.needs_statistics and not m.at_size and not m.needs_base and m.mergekit is None
    assert [(p.name, p.default) for p in m.params][-1] == ("cca_reg", 1e-2)


@pytest.mark.parametrize("argv, text", [
    (["--method", "cca", "--cca-reg", "-1"], "--cca-reg must be a number from 0 to 10"),
    (["--method", "simple", "--cca-reg", "0.1"], "--cca-reg needs --method cca"),
    (["--method", "cca", "--stats-split", "dev"], "--stats-split"),
])
def test_bad_input_is_one_line(capsys, argv, text):
    refused(argv, capsys, text)


def test_no_data_and_at_size_are_refused(capsys):
    from rotviz.atsize.merge import sized_merge
    from rotviz.cli import main
    from rotviz.data.split import load_split
    from rotviz.errors import RotvizError

    capsys.readouterr()
    assert main(["merge", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--method", "cca"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--data" in err, err
    with pytest.raises(RotvizError, match="--method cca needs statistics of whole"):
        sized_merge("zoo:vit-digits-s3", "zoo:vit-digits-s6",
                    load_split("digits", "test").subset(8), method="cca")

"""The merge methods built on task vectors (task arithmetic, TIES, DARE), SLERP and Model
Stock, and the N-model generalisation of simple, Fisher and RegMean: each equals a plain
implementation of its published definition (mergekit's) written here, on random tensors;
their edge cases; the merge command's refusals; at size, the streamed merge equals the
in-memory one; and the fine-tuned demo of the zoo (vit-digits-base, -ft-a, -ft-b)."""

from __future__ import annotations

import json
import math
from functools import cache

import numpy as np
import pytest
import torch
from conftest import refused

from rotviz.errors import RotvizError
from rotviz.merging import method as method_record
from rotviz.merging.combine import merge_job, merge_many, merge_states
from rotviz.merging.dare import dare
from rotviz.merging.fisher import FISHER_FLOOR, fisher_combine, model_normalised
from rotviz.merging.model_stock import model_stock
from rotviz.merging.regmean import regmean_combine
from rotviz.merging.slerp import slerp
from rotviz.merging.task_arithmetic import task_arithmetic
from rotviz.merging.task_vectors import drop_seed
from rotviz.merging.ties import ties

TOL = dict(rtol=0, atol=1e-6)


def _rand(*shape, seed=0, n=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(n)]


def _close(got: torch.Tensor, want: np.ndarray) -> None:
    np.testing.assert_allclose(got.double().numpy(), want, **TOL)


# ---- plain implementations of the published definitions (numpy, written out) --------------


def ref_task_arithmetic(ts, base, ws, lam):
    b = base.numpy()
    return b + lam * sum(w * (t.numpy() - b) for w, t in zip(ws, ts, strict=True))


def ref_trim(d, density):
    """Keep the int(density * n) (at least 1) entries largest in magnitude."""
    flat = d.reshape(-1).copy()
    if density >= 1:
        return d
    if density <= 0:
        return np.zeros_like(d)
    k = max(1, int(density * flat.size))
    order = np.argsort(-np.abs(flat), kind="stable")
    out = np.zeros_like(flat)
    out[order[:k]] = flat[order[:k]]
    return out.reshape(d.shape)


def ref_elect_merge(deltas, ws, consensus, normalize):
    """TIES's election and (disjoint) merge, entry by entry, in plain loops."""
    shape = deltas[0].shape
    flat = [w * d.reshape(-1) for w, d in zip(ws, deltas, strict=True)]
    out = np.zeros(flat[0].size)
    for j in range(out.size):
        vals = [f[j] for f in flat]
        vote = sum(vals) if consensus == "sum" else sum(np.sign(v) for v in vals)
        sign = 1.0 if vote >= 0 else -1.0
        carried = [(v, w) for v, w in zip(vals, ws, strict=True) if np.sign(v) == sign]
        total = sum(v for v, _ in carried)
        div = sum(w for _, w in carried) or 1.0
        out[j] = total / div if normalize else total
    return out.reshape(shape)


def ref_ties(ts, base, ws, density, consensus, lam):
    b = base.numpy()
    deltas = [ref_trim(t.numpy() - b, density) for t in ts]
    return b + lam * ref_elect_merge(deltas, ws, consensus, normalize=True)


def ref_dare(ts, base, ws, name, density, seed, lam, consensus):
    b = base.numpy()
    deltas = []
    for i, t in enumerate(ts):
        g = torch.Generator().manual_seed(drop_seed(seed, name, i))
        keep = (torch.rand(t.shape, generator=g, dtype=torch.float64) < density).numpy()
        deltas.append((t.numpy() - b) * keep / density)
    if consensus is None:
        return b + lam * sum(w * d for w, d in zip(ws, deltas, strict=True))
    return b + lam * ref_elect_merge(deltas, ws, consensus, normalize=False)


def ref_slerp(v0, v1, t):
    a, b = v0.numpy().reshape(-1), v1.numpy().reshape(-1)
    cos = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
    if abs(cos) > 0.9995:
        return ((1 - t) * a + t * b).reshape(v0.shape)
    th = math.acos(cos)
    out = math.sin((1 - t) * th) / math.sin(th) * a + math.sin(t * th) / math.sin(th) * b
    return out.reshape(v0.shape)


def ref_model_stock(ts, base):
    w0 = base.numpy().reshape(-1)
    ds = [t.numpy().reshape(-1) - w0 for t in ts]
    pairs = [(i, j) for i in range(len(ds)) for j in range(i + 1, len(ds))]
    cos = np.mean([np.dot(ds[i], ds[j]) / (np.linalg.norm(ds[i]) * np.linalg.norm(ds[j]))
                   for i, j in pairs])
    n = len(ds)
    t = n * cos / (1 + (n - 1) * cos)
    avg = np.mean([x.numpy().reshape(-1) for x in ts], axis=0)
    return (t * avg + (1 - t) * w0).reshape(base.shape)


# ---- each method equals its definition ---------------------------------------------------


@pytest.mark.parametrize("lam", [1.0, 0.7, -0.5])
def test_task_arithmetic_is_the_base_plus_the_scaled_weighted_task_vectors(lam):
    *ts, base = _rand(4, 6, n=4)
    ws = (0.2, 0.3, 0.9)  # mergekit's weights are taken as given (no normalisation)
    _close(task_arithmetic(ts, base, ws, lam), ref_task_arithmetic(ts, base, ws, lam))


@pytest.mark.parametrize("density,consensus,lam", [(0.3, "sum", 1.0), (0.5, "count", 0.8),
                                                   (1.0, "sum", 1.3), (0.05, "sum", 1.0)])
def test_ties_trims_elects_and_takes_the_disjoint_mean(density, consensus, lam):
    *ts, base = _rand(5, 7, seed=1, n=4)
    ws = (0.5, 0.2, 0.3)
    got = ties(ts, base, ws, density, consensus, lam)
    _close(got, ref_ties(ts, base, ws, density, consensus, lam))


@pytest.mark.parametrize("consensus", [None, "sum", "count"])
@pytest.mark.parametrize("density", [0.3, 0.9])
def test_dare_drops_at_random_rescales_by_one_over_density(consensus, density):
    *ts, base = _rand(6, 5, seed=2, n=3)
    ws = (0.6, 0.4)
    got = dare(ts, base, ws, "layer.weight", density, 7, "density", 0.9, consensus)
    _close(got, ref_dare(ts, base, ws, "layer.weight", density, 7, 0.9, consensus))


def test_dare_keeps_about_density_of_entries_and_its_expectation():
    base = torch.zeros(200, 200, dtype=torch.float64)
    t = torch.ones(200, 200, dtype=torch.float64)
    got = dare([t, t], base, (1.0, 0.0), "w", 0.3, 0, "density")
    kept = float((got != 0).double().mean())
    assert abs(kept - 0.3) < 0.01  # 40,000 draws: about 4.5 standard deviations
    assert float(got.mean()) == pytest.approx(1.0, abs=0.04)  # 1/density keeps the mean
    l1 = dare([t, t], base, (1.0, 0.0), "w", 0.3, 0, "l1")  # mergekit 0.1.5: the L1 norm
    assert float(l1.abs().sum()) == pytest.approx(float(t.abs().sum()), rel=1e-12)
    none = dare([t, t], base, (1.0, 0.0), "w", 0.3, 0, "none")
    torch.testing.assert_close(none * (1 / 0.3), got, rtol=1e-12, atol=0)


def test_dare_is_reproducible_from_its_seed():
    *ts, base = _rand(8, 8, seed=3, n=3)
    one = dare(ts, base, (0.5, 0.5), "w", 0.5, 11)
    assert torch.equal(one, dare(ts, base, (0.5, 0.5), "w", 0.5, 11))
    assert not torch.equal(one, dare(ts, base, (0.5, 0.5), "w", 0.5, 12))
    assert not torch.equal(one, dare(ts, base, (0.5, 0.5), "other", 0.5, 11))


def test_dare_l1_in_slices_is_the_drop_of_the_whole_tensor():
    """The L1 rescaling's two passes over slices (the second reads back the first's masks)
    give the definition on the whole tensor: one mask per model drawn at once from its seeded
    generator, the kept entries scaled to the L1 norm before dropping; every mask used."""
    from rotviz.merging.dare import dare_rows
    from rotviz.merging.rows import held, whole

    *ts, base = _rand(40, 30, seed=5, n=3)
    ws = (0.7, 0.3)
    got = whole(lambda src: dare_rows(src, ws, "w", 0.4, 9, "l1"), ts, base, chunk=90)
    want = base.clone()
    for i, (t, w) in enumerate(zip(ts, ws, strict=True)):
        gen = torch.Generator().manual_seed(drop_seed(9, "w", i))
        d = t - base
        kept = d * (torch.rand(d.shape, generator=gen, dtype=torch.float64) < 0.4)
        want += w * kept * (d.abs().sum() / kept.abs().sum())
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    from rotviz.merging.task_vectors import Drop

    drop = Drop(held(ts, base, chunk=90), 0.4, [1, 2], "l1")
    assert [len(m) for m in drop.masks] == [14, 14]  # 40 rows, 3 a slice: one mask each
    for lo in range(0, 40, 3):
        for i in range(2):
            drop(i, ts[i][lo:lo + 3] - base[lo:lo + 3])
    assert drop.masks == [[], []]


def test_slices_read_ahead_are_the_same_slices_and_merges():
    """A RowSource that reads each next slice on its own thread (as the at-size merge does)
    gives the same slices in the same order, so multi-pass merges (DARE's L1 pass, Arcee
    Fusion's threshold passes) give the same bits; a failing read reaches the caller at
    its own slice."""
    from dataclasses import replace

    from rotviz.merging.arcee_fusion import arcee_fusion_rows
    from rotviz.merging.dare import dare_rows
    from rotviz.merging.rows import gather, held

    *ts, base = _rand(41, 30, seed=6, n=3)
    src = held(ts, base, chunk=90)  # 3 rows a slice: 14 slices
    ahead = replace(src, prefetch=True)
    pairs = list(zip(src.slices(), ahead.slices(), strict=True))
    assert len(pairs) == 14
    for (m1, b1), (m2, b2) in pairs:
        assert torch.equal(b1, b2) and all(torch.equal(x, y) for x, y in zip(m1, m2, strict=True))
    for rows in (lambda s: dare_rows(s, (0.6, 0.4), "w", 0.4, 3, "l1"),
                 lambda s: arcee_fusion_rows(replace(s, read=lambda lo, hi: (s.read(lo, hi)[0],
                                                                             None)))):
        assert torch.equal(gather(rows(ahead), src.shape, torch.float64),
                           gather(rows(src), src.shape, torch.float64))

    def read(lo: int, hi: int):
        if lo >= 30:
            raise RotvizError("bad slice")
        return src.read(lo, hi)

    slices = replace(src, read=read, prefetch=True).slices()
    assert len([next(slices) for _ in range(10)]) == 10  # rows 0-29
    with pytest.raises(RotvizError, match="bad slice"):
        next(slices)


def test_slices_worked_on_two_threads_come_in_order_with_the_same_bits(monkeypatch):
    """in_order works items on two threads and gives them back in order; an error reaches
    the caller at its own item; Arcee Fusion's passes (threaded through it) give the same
    bits on two threads as on one."""
    import threading
    import time

    import rotviz.devices as devices
    import rotviz.merging.rows as rows
    from rotviz.merging.arcee_fusion import arcee_fusion_rows

    names = set()

    def work(k: int) -> int:
        names.add(threading.current_thread().name)
        time.sleep(0.01 if k % 3 == 0 else 0.0)  # slow items finish after later fast ones
        if k == 13:
            raise RotvizError("bad slice")
        return k

    got = devices.in_order(work, range(20), workers=2)
    assert [next(got) for _ in range(13)] == list(range(13))
    with pytest.raises(RotvizError, match="bad slice"):
        next(got)
    assert len({n for n in names if n.startswith("rotviz-slices")}) == 2
    a, b = _rand(41, 30, seed=7, n=2)
    merged = {}
    for workers in (1, 2):
        monkeypatch.setattr(devices, "SLICE_WORKERS", workers)
        merged[workers] = rows.whole(arcee_fusion_rows, [a, b], None, chunk=90)
    assert torch.equal(merged[1], merged[2]) and not torch.equal(merged[1], a)


@pytest.mark.parametrize("t", [0.0, 0.3, 0.5, 1.0])
def test_slerp_follows_the_great_circle(t):
    v0, v1 = _rand(9, 4, seed=4, n=2)
    got = slerp(v0, v1, t)
    _close(got, ref_slerp(v0, v1, t))
    if t in (0.0, 1.0):
        torch.testing.assert_close(got, v0 if t == 0 else v1, rtol=0, atol=1e-12)
    # two unit vectors at right angles: the midpoint is a unit vector too
    e0, e1 = torch.eye(2, dtype=torch.float64)
    assert float(slerp(e0, e1, 0.5).norm()) == pytest.approx(1.0, abs=1e-12)


def test_slerp_of_colinear_and_opposite_tensors_is_linear():
    v = _rand(3, 3, seed=5, n=1)[0]
    for other in (2.0 * v, -v, -3.0 * v, v + 1e-4 * _rand(3, 3, seed=6, n=1)[0]):
        torch.testing.assert_close(slerp(v, other, 0.3), 0.7 * v + 0.3 * other, rtol=0,
                                   atol=1e-12)
    zero = torch.zeros(3, 3, dtype=torch.float64)  # a zero tensor: the norm taken as 1
    assert torch.isfinite(slerp(zero, v, 0.4)).all()


@pytest.mark.parametrize("n", [2, 3, 5])
def test_model_stock_ratio_from_the_angle_between_fine_tunes(n):
    *ts, base = _rand(6, 6, seed=7, n=n + 1)
    got = model_stock(ts, base)
    _close(got, ref_model_stock(ts, base))


def test_model_stock_closed_form_and_its_singular_case():
    base = torch.zeros(2, dtype=torch.float64)
    a = torch.tensor([1.0, 0.0], dtype=torch.float64)
    b = torch.tensor([math.cos(1.0), math.sin(1.0)], dtype=torch.float64)
    cos = math.cos(1.0)
    t = 2 * cos / (1 + cos)  # N = 2
    torch.testing.assert_close(model_stock([a, b], base), t * (a + b) / 2, rtol=0, atol=1e-12)
    # opposite fine-tunes: 1 + cos = 0, no finite ratio, the base is kept
    shifted = base + 0.5
    torch.testing.assert_close(model_stock([shifted + a, shifted - a], shifted), shifted,
                               rtol=0, atol=0)


def test_simple_fisher_and_regmean_generalise_to_n_models():
    ts = _rand(4, 5, seed=8, n=3)
    ws = (0.5, 0.3, 0.2)
    g = torch.Generator().manual_seed(9)
    fishers = [torch.rand(4, 5, generator=g, dtype=torch.float64) for _ in range(3)]
    num = sum(w * (f.numpy() + FISHER_FLOOR) * t.numpy()
              for w, f, t in zip(ws, fishers, ts, strict=True))
    den = sum(w * (f.numpy() + FISHER_FLOOR) for w, f in zip(ws, fishers, strict=True))
    _close(fisher_combine(ts, fishers, ws), num / den)
    grams = []
    for _ in range(3):
        x = torch.randn(20, 5, generator=g, dtype=torch.float64)
        grams.append(x.T @ x / 20)
    lhs = sum(w * gm.numpy() for w, gm in zip(ws, grams, strict=True))
    rhs = sum(w * gm.numpy() @ t.numpy().T for w, gm, t in zip(ws, grams, ts, strict=True))
    want = np.linalg.solve(lhs, rhs)
    _close(regmean_combine(ts, grams, ws, alpha=1.0), want.T)
    # Fisher normalised per model (FusionBench): each Fisher divided by its whole-model norm
    normed = model_normalised({"a": fishers[0], "b": 2 * fishers[0]})
    norm = math.sqrt(float(fishers[0].pow(2).sum()) * 5)
    torch.testing.assert_close(normed["a"], fishers[0] / norm, rtol=1e-12, atol=0)


def test_fisher_norm_model_divides_each_models_fisher_by_its_norm(loaded):
    from pairs import synthetic_split

    from rotviz.measures.merge import merge
    from rotviz.merging.fisher import fisher_diag

    m = loaded("vit")
    split = synthetic_split(m, n=8)
    r = merge(m, m, "fisher", None, split, stats_split=split, batches=1, batch_size=4,
              fisher_norm="model")
    raw = fisher_diag(m, m.state, split, 1, 4)
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in raw.values()))
    assert norm > 0 and r.params == {"fisher_norm": "model"}
    for k, v in raw.items():
        torch.testing.assert_close(r.anchor_stats[k], v / norm, rtol=1e-6, atol=0)
    for k, v in m.state.items():  # a model merged with itself stays itself
        torch.testing.assert_close(r.state[k], v, rtol=0, atol=1e-6)


# ---- edge cases ----------------------------------------------------------------------------


def test_density_zero_and_all_zero_task_vectors_give_the_base():
    *ts, base = _rand(5, 5, seed=10, n=3)
    for got in (ties(ts, base, (0.5, 0.5), 0.0), dare(ts, base, (0.5, 0.5), "w", 0.0),
                dare(ts, base, (0.5, 0.5), "w", 0.0, consensus="sum")):
        torch.testing.assert_close(got, base, rtol=0, atol=0)
    same = [base.clone(), base.clone()]  # the fine-tunes are the base: zero task vectors
    for got in (task_arithmetic(same, base, (0.5, 0.5), 3.0), ties(same, base, (0.5, 0.5), 0.4),
                dare(same, base, (0.5, 0.5), "w", 0.4, consensus="sum"),
                model_stock(same, base)):
        torch.testing.assert_close(got, base, rtol=0, atol=0)


def test_copies_of_one_model_about_another_base():
    model, base = _rand(6, 4, seed=12, n=2)
    copies = [model.clone(), model.clone(), model.clone()]
    ws = (0.2, 0.3, 0.5)
    for got in (task_arithmetic(copies, base, ws), ties(copies, base, ws, 1.0),
                model_stock(copies, base)):
        torch.testing.assert_close(got, model, rtol=0, atol=1e-12)
    # TIES below density 1 keeps the same entries of each copy: the model's task vector trimmed
    want = base.numpy() + ref_trim((model - base).numpy(), 0.4)
    _close(ties(copies, base, ws, 0.4), want)
    assert not torch.allclose(dare(copies, base, ws, "w", 0.5), model)  # masks differ


def test_density_one_keeps_everything():
    *ts, base = _rand(5, 5, seed=11, n=3)
    ws = (0.5, 0.5)
    torch.testing.assert_close(dare(ts, base, ws, "w", 1.0), task_arithmetic(ts, base, ws),
                               rtol=0, atol=1e-12)
    # trimming at density 1 keeps every entry: TIES is the sign election alone
    _close(ties(ts, base, ws, 1.0), base.numpy() + ref_elect_merge(
        [t.numpy() - base.numpy() for t in ts], ws, "sum", True))


def test_ties_sign_ties_go_to_plus_and_zeros_carry_nothing():
    base = torch.zeros(3, dtype=torch.float64)
    a = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    b = torch.tensor([-1.0, -3.0, 0.0], dtype=torch.float64)
    # entry 0: +1 and -1 tie (sum 0, count 0): + wins, only a carries it, mean over a alone
    # entry 1: sum -1 elects -, count ties to +; entry 2: no vector carries it, the base's
    torch.testing.assert_close(ties([a, b], base, (0.5, 0.5), consensus="sum"),
                               torch.tensor([1.0, -3.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(ties([a, b], base, (0.5, 0.5), consensus="count"),
                               torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64))


def test_merges_by_slices_of_rows_equal_whole_tensors(monkeypatch):
    """At size a tensor is merged a slice of rows at a time (rotviz.merging.rows), never
    whole in float64: each method's result is the same whatever the slices, to the bit
    where it is entry by entry given tensor-wide choices (TIES's threshold, DARE's seeded
    mask: its generator runs on across slices), to 1e-12 where tensor-wide sums (DARE's L1
    norms, SLERP's angle, Model Stock's cosines) are added slice by slice. On values of a
    coarse grid many magnitudes tie at TIES's threshold: the first ones in the tensor's
    order are kept (the stable sort of `ref_trim`), found with the threshold by histogram
    passes over the float64 bit patterns (few candidates are gathered at once here)."""
    from rotviz.merging import task_vectors
    from rotviz.merging.dare import dare_rows
    from rotviz.merging.model_stock import model_stock_rows
    from rotviz.merging.rows import gather, held
    from rotviz.merging.simple import simple_rows
    from rotviz.merging.slerp import slerp_rows
    from rotviz.merging.task_arithmetic import task_arithmetic_rows
    from rotviz.merging.ties import ties_rows

    monkeypatch.setattr(task_vectors, "COLLECT", 20)  # histogram passes on small tensors
    g = torch.Generator().manual_seed(13)
    grid = [torch.randint(-4, 5, (9, 7), generator=g).double() / 4 for _ in range(3)]
    ws = (0.6, 0.4)
    exact = {
        "ties": lambda s: ties_rows(s, ws, 0.3, "sum", 1.2),
        "ties count": lambda s: ties_rows(s, ws, 0.77, "count"),
        "task arithmetic": lambda s: task_arithmetic_rows(s, ws, 0.8),
        "dare": lambda s: dare_rows(s, ws, "w", 0.4, 3, "density", 1.0, "sum"),
        "dare none": lambda s: dare_rows(s, ws, "w", 0.4, 3, "none"),
        "simple": lambda s: simple_rows(s, ws)}
    summed = {"dare l1": lambda s: dare_rows(s, ws, "w", 0.4, 3, "l1"),
              "slerp": lambda s: slerp_rows(s, 0.3),
              "model stock": lambda s: model_stock_rows(s, ws)}
    for data in (grid, _rand(9, 7, seed=14, n=3)):
        *ts, base = data
        for name, rows in {**exact, **summed}.items():
            models, b = (ts, None) if name in ("slerp", "simple") else (ts, base)
            one = gather(rows(held(models, b, chunk=10**6)), (9, 7), torch.float64)
            for chunk in (7, 4 * 7):  # a row, four rows
                got = gather(rows(held(models, b, chunk=chunk)), (9, 7), torch.float64)
                if name in exact:
                    assert torch.equal(got, one), (name, chunk)
                else:
                    torch.testing.assert_close(got, one, rtol=0, atol=1e-12)
        for density in (0.05, 0.5, 0.9):
            got = gather(ties_rows(held(ts, base, chunk=7), ws, density), (9, 7),
                         torch.float64)
            _close(got, ref_ties(ts, base, ws, density, "sum", 1.0))


def test_merge_many_pairs_equal_merge_states_and_refusals(loaded):
    m = loaded("vit")
    other = {k: (v + 0.01 * torch.randn_like(v)) if v.is_floating_point() else v
             for k, v in m.state.items()}
    third = {k: (v - 0.02 * torch.randn_like(v)) if v.is_floating_point() else v
             for k, v in m.state.items()}
    for name, kw in (("simple", {}), ("slerp", {}), ("ties", {"density": 0.4}),
                     ("dare_ties", {"density": 0.5, "seed": 3})):
        base = m.state if method_record(name).needs_base else None
        pair = merge_states(m, name, third, other, 0.3, base_state=base, **kw)
        many = merge_many(m, name, [third, other], (0.7, 0.3), base, **kw)
        for k in pair:
            assert torch.equal(pair[k], many[k]), (name, k)
    three = merge_many(m, "ties", [m.state, other, third], None, m.state, density=0.5)
    k = next(k for k, v in m.state.items() if v.dim() == 2)
    want = ref_ties([m.state[k].double(), other[k].double(), third[k].double()],
                    m.state[k].double(), (1 / 3,) * 3, 0.5, "sum", 1.0)
    np.testing.assert_allclose(three[k].double().numpy(), want, rtol=0, atol=1e-6)
    with pytest.raises(RotvizError, match="--method ties needs --base MODEL"):
        merge_many(m, "ties", [m.state, other])
    with pytest.raises(RotvizError, match="--method simple takes no --base"):
        merge_many(m, "simple", [m.state, other], base_state=m.state)
    with pytest.raises(RotvizError, match="slerp combines 2 models, got 3"):
        merge_many(m, "slerp", [m.state, other, third])
    with pytest.raises(RotvizError, match="statistics of every model"):
        merge_many(m, "fisher", [m.state, other])
    import rotviz

    assert rotviz.merge_many is merge_many  # the public N-model entry point
    job = merge_job(m, method_record("ties"), (0.5, 0.5), None, {})
    assert job.params == {"density": 1.0, "consensus": "sum", "scale": 1.0}


def test_records_say_base_size_and_their_mergekit_names():
    expect = {"simple": (False, True, "linear"), "fisher": (False, False, None),
              "regmean": (False, False, None), "task_arithmetic": (True, True, "task_arithmetic"),
              "ties": (True, True, "ties"), "dare_linear": (True, True, "dare_linear"),
              "dare_ties": (True, True, "dare_ties"), "slerp": (False, True, "slerp"),
              "model_stock": (True, True, "model_stock")}
    for name, (needs_base, at_size, mk) in expect.items():
        m = method_record(name)
        assert (m.needs_base, m.at_size, m.mergekit and m.mergekit.method) == \
            (needs_base, at_size, mk)
        if m.mergekit:  # every mapped parameter is one the method declares
            k = m.mergekit
            assert {*k.shared, *k.per_model, *k.values} <= {p.name for p in m.params}
    assert method_record("ties").mergekit.shared["scale"] == "lambda"


# ---- the command line -----------------------------------------------------------------------


@cache
def _refs():
    return tuple(f"zoo:vit-digits-{n}" for n in ("ft-a", "ft-b", "base"))


def test_merge_cli_refuses_bad_base_and_density(ws, capfd, saved):
    a, b, base = _refs()
    cmd = ["merge", a, b, "--data", "digits", "--match", "none", "--out", "m"]
    refused([*cmd, "--method", "model_stock"], capfd, ws,
            "--method model_stock needs --base MODEL")
    refused([*cmd, "--method", "ties", "--density", "1.5", "--base", base], capfd, ws,
            "--density must be a number from 0 to 1, got 1.5")
    refused([*cmd, "--method", "simple", "--base", base], capfd, ws,
            "--method simple takes no --base")
    refused([*cmd, "--method", "ties", "--density", "0.5"], capfd, ws, "needs --base")
    refused([*cmd, "--method", "simple", "--density", "0.5"], capfd, ws,
            "--density needs --method ties or dare_linear or dare_ties")
    other = str(saved("gpt2"))  # another architecture
    refused([*cmd, "--method", "task_arithmetic", "--base", other], capfd, ws,
            f"--base '{other}' does not fit the anchor")
    refused([*cmd, "--method", "slerp", "--base", base, "--max-memory", "0"], capfd, ws,
            "--method slerp takes no --base")


def test_merge_cli_with_a_base_writes_the_merge(tmp_path, capsys):
    from rotviz.cli import main
    from rotviz.sources.loading import load_model

    a, b, base = _refs()
    out, js = tmp_path / "m", tmp_path / "m.json"
    rc = main(["merge", a, b, "--data", "digits", "--match", "none", "--method", "ties",
               "--density", "0.2", "--base", base, "--device", "cpu", "--out", str(out),
               "--json", str(js)])
    assert rc == 0 and f"base {base}" in capsys.readouterr().out
    d = json.loads(js.read_text())
    assert d["base"] == base and d["params"] == {"density": 0.2, "consensus": "sum",
                                                 "scale": 1.0}
    la, lb, lbase = (load_model(r) for r in _refs())
    want = merge_many(la, "ties", [la.state, lb.state], (0.5, 0.5), lbase.state, density=0.2)
    back = load_model(out).state
    for k, v in want.items():
        torch.testing.assert_close(back[k], v, rtol=0, atol=1e-6)
    # at size (--max-memory 0): the base streamed beside the pair, the same merge
    rc = main(["merge", a, b, "--data", "digits", "--match", "none", "--method", "ties",
               "--density", "0.2", "--base", base, "--device", "cpu", "--out",
               str(tmp_path / "s"), "--json", str(tmp_path / "s.json"), "--max-memory", "0"])
    assert rc == 0 and "at size" in capsys.readouterr().out
    sized = json.loads((tmp_path / "s.json").read_text())
    assert sized["acc"] == d["acc"] and sized["base"] == base
    assert sized["loss"] == pytest.approx(d["loss"], rel=1e-6)
    back = load_model(tmp_path / "s").state
    for k, v in want.items():
        torch.testing.assert_close(back[k], v, rtol=0, atol=1e-6)


# ---- at size: streamed equals in memory -----------------------------------------------------


SIZED = [("task_arithmetic", {"scale": 1.5}), ("ties", {"density": 0.3}),
         ("dare_linear", {"density": 0.5, "seed": 5}),
         ("dare_ties", {"density": 0.5, "seed": 5, "consensus": "count"}),
         ("slerp", {}), ("model_stock", {})]


@pytest.mark.parametrize("name,kw", SIZED, ids=[n for n, _ in SIZED])
def test_streamed_merge_equals_the_in_memory_one(name, kw, tmp_path):
    from rotviz.atsize.merge import sized_merge
    from rotviz.data.split import load_split
    from rotviz.evaluation import Evaluator
    from rotviz.sources.loading import load_model

    a, b, base = _refs()
    split = load_split("digits", "test").subset(48)
    needs = method_record(name).needs_base
    (tmp_path / "m").mkdir()
    r = sized_merge(a, b, split, 0.4, "cpu", folder=tmp_path / "m", method=name,
                    base=base if needs else None, **kw)
    la, lb, lbase = (load_model(x) for x in _refs())
    want = merge_states(la, name, la.state, lb.state, 0.4,
                        base_state=lbase.state if needs else None, **kw)
    back = load_model(tmp_path / "m").state
    for k, v in want.items():
        torch.testing.assert_close(back[k], v, rtol=0, atol=1e-6)
    ev = Evaluator(la, split, "cpu")
    loss, acc = ev.evaluate(ev.params(want))
    assert r.method == name and r.acc == pytest.approx(acc, abs=1e-9)
    assert r.loss == pytest.approx(loss, rel=1e-5)
    assert r.base == (base if needs else "")


def test_fisher_and_regmean_refuse_at_size(tmp_path):
    from rotviz.atsize.merge import sized_merge
    from rotviz.data.split import load_split

    a, b, _ = _refs()
    for name in ("fisher", "regmean"):
        with pytest.raises(RotvizError, match=f"--method {name} needs statistics of whole"):
            sized_merge(a, b, load_split("digits", "test").subset(8), method=name)


# ---- the fine-tuned demo --------------------------------------------------------------------


def test_fine_tuned_demo_task_arithmetic_and_ties_against_the_simple_average():
    """vit-digits-ft-a and -ft-b, two fine-tunes of vit-digits-base, merged about the base.
    Measured on the digits test split (397 images): simple average 0.9446, base 0.9244,
    ft-a 0.9521, ft-b 0.9345; task arithmetic λ = 1 equals the simple average (weights
    0.5 each), λ = 1.5: 0.9496; TIES density 0.2: 0.9471."""
    from rotviz.data.split import load_split
    from rotviz.evaluation import Evaluator
    from rotviz.sources.loading import load_model

    la, lb, lbase = (load_model(x) for x in _refs())
    ev = Evaluator(la, load_split("digits", "test"), "cpu")

    def acc(state):
        return ev.evaluate(ev.params(state))[1]

    simple = acc(merge_states(la, "simple", la.state, lb.state))
    base_acc = acc(lbase.state)
    ta1 = merge_states(la, "task_arithmetic", la.state, lb.state, base_state=lbase.state)
    ta = acc(merge_states(la, "task_arithmetic", la.state, lb.state, base_state=lbase.state,
                          scale=1.5))
    ti = acc(merge_states(la, "ties", la.state, lb.state, base_state=lbase.state, density=0.2))
    assert acc(ta1) == simple  # λ = 1 with weights summing to 1: the simple average
    assert simple == pytest.approx(0.9446, abs=0.005)
    assert base_acc == pytest.approx(0.9244, abs=0.005)
    for got in (ta, ti):  # both merges stay within 2 points of the simple average, above base
        assert abs(got - simple) <= 0.02 and got > base_acc
    assert ta == pytest.approx(0.9496, abs=0.005) and ti == pytest.approx(0.9471, abs=0.005)


def test_the_app_merges_about_a_base_read_through_its_roots():
    """The Merge page's table and the Measure page's merge take the base through the app's
    Resources (its confined roots), and equal the library's merge."""
    from rotviz import app
    from rotviz.analysis.fusion import fusion_table
    from rotviz.data.split import load_split
    from rotviz.sources.loading import load_model

    a, b, base = _refs()
    res = app.Resources()
    cfg = {"anchor": a, "source": b, "data": "digits", "seed": 0, "n_eval": 64,
           "device": "cpu", "layers": ""}
    got = app.run("fusion", res, app.measure_cfg(cfg, "none", methods="ties,simple",
                                                 weight=0.5, base=base, density=0.2))
    la, lb, lbase = (load_model(x) for x in _refs())
    split = load_split("digits", "test", 0).subset(64)
    want = fusion_table(la, lb, split, methods=("ties", "simple"), specs=("none",),
                        base=lbase, density=0.2)
    assert got["acc"] == want.acc and got["loss"] == want.loss
    one = app.run("merge", res, {**app.measure_cfg(cfg, "none", method="ties", base=base,
                                                   density=0.2)})
    assert one["acc"] == want.acc["ties"]["none"] and one["base"] == base
    with pytest.raises(RotvizError, match="needs --base"):
        fusion_table(la, lb, split, methods=("model_stock",), specs=("none",))

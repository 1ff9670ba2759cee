"""NuSLERP equals mergekit 0.1.5's own nuslerp (1e-6) on random float64 tensors: flattened,
row by row and column by column, with and without a base, t at 0 and 1, colinear, opposite
and zero tensors; in small slices (as at size) as whole; and its refusals."""

from __future__ import annotations

import pytest
import torch

from rotviz.errors import RotvizError
from rotviz.merging import check_base, method
from rotviz.merging.nuslerp import nuslerp_rows
from rotviz.merging.rows import whole

from .mergekit_refs import mk_nuslerp

pytest.importorskip("mergekit")
TOL = 1e-6
MODES = [(False, True), (True, True), (False, False), (True, False)]  # (row_wise, flatten)


def _rand(*shape, seed=0, n=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(n)]


def ours(v0, v1, w, base=None, row_wise=False, flatten=True, chunk=7):
    """rotviz's NuSLERP in slices of `chunk` entries (several slices per tensor)."""
    t = w[1] / (w[0] + w[1])
    return whole(lambda src: nuslerp_rows(src, t, row_wise, flatten), [v0, v1], base,
                 chunk=chunk)


def _diff(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


@pytest.mark.parametrize("row_wise,flatten", MODES)
@pytest.mark.parametrize("based", [False, True])
@pytest.mark.parametrize("shape", [(6, 5), (4, 3, 2), (9,)])
@pytest.mark.parametrize("w", [0.3, 0.0, 1.0])
def test_equals_mergekit(row_wise, flatten, based, shape, w):
    a, b, base = _rand(*shape, seed=len(shape))
    weights = (1.0 - w, w)
    base = base if based else None
    want = mk_nuslerp(a, b, weights, base, row_wise, flatten)
    got = ours(a, b, weights, base, row_wise, flatten)
    assert _diff(got, want) < TOL
    if w in (0.0, 1.0):  # t at its ends gives the model back
        assert _diff(got, (a, b)[int(w)]) < TOL


@pytest.mark.parametrize("row_wise,flatten", MODES)
@pytest.mark.parametrize("case", ["colinear", "opposite", "zero", "rows-mixed"])
def test_edge_cases_equal_mergekit(row_wise, flatten, case):
    """Entries +-1 on 4 x 4: every norm (rows, columns, whole) is exact, so the cosines of
    colinear and opposite vectors are exactly +-1 in both tools."""
    (a,) = _rand(4, 4, seed=3, n=1)
    a = a.sign()
    b = {"colinear": 2.5 * a, "opposite": -0.5 * a, "zero": torch.zeros_like(a),
         "rows-mixed": torch.cat([2 * a[:2], -a[2:3], _rand(1, 4, seed=4, n=1)[0]])}[case]
    for w in (0.3, 0.5):
        want = mk_nuslerp(a, b, (1 - w, w), None, row_wise, flatten)
        got = ours(a, b, (1 - w, w), None, row_wise, flatten)
        assert _diff(got, want) < TOL, case
    if case in ("colinear", "opposite") and flatten:  # linear: (1 - t) a + t b
        assert _diff(ours(a, b, (0.7, 0.3)), 0.7 * a + 0.3 * b) < TOL


def test_the_record_runs_as_its_definition():
    """Through the registry (the weights 1 - w, w), dtype kept; a base is optional."""
    from rotviz.merging.combine import merge_job

    m = method("nuslerp")
    assert m.at_size and m.base_optional and not m.needs_base and m.max_models == 2
    a, b, base = _rand(6, 5, seed=9)
    job = merge_job(None, m, (0.6, 0.4), None, {"nuslerp_flatten": "no",
                                                  "nuslerp_row_wise": "yes"})
    got = m.merge(job, "w", [a.float(), b.float()], base.float())
    assert got.dtype == torch.float32
    assert _diff(got, mk_nuslerp(a, b, (0.6, 0.4), base, True, False)) < 1e-5
    check_base(m, True)
    check_base(m, False)


def test_bad_values_are_one_line():
    m = method("nuslerp")
    flag = {p.name: p for p in m.params}
    with pytest.raises(RotvizError, match="unknown --nuslerp-flatten 'maybe'"):
        flag["nuslerp_flatten"].check("maybe")
    with pytest.raises(RotvizError, match="combines 2 models"):
        from rotviz.merging import check_models
        check_models(m, 3)


def test_rounded_colinear_is_linear_where_mergekit_blows_up():
    """Random rows and their -0.5 multiples: cosines round to within ulps of -1, mergekit's
    sin(theta) ~ 1e-8 amplifies the rounding to ~1e7, rotviz takes them colinear (linear)."""
    (a,) = _rand(5, 4, seed=3, n=1)
    b = -0.5 * a
    got = ours(a, b, (0.7, 0.3), None, False, False)
    assert _diff(got, 0.7 * a + 0.3 * b) < TOL
    assert mk_nuslerp(a, b, (0.7, 0.3), None, False, False).abs().max().item() > 1e3


def test_the_yaml_says_what_rotviz_does():
    """nuslerp's and multislerp's base_model only where --base is given; the modes as
    mergekit's booleans; karcher without weights (its plain mean: --weight 0.5 only)."""
    from pathlib import Path

    import yaml

    from rotviz.merging.mergekit import mergekit_config

    a, m, base = Path("/m/a"), Path("/m/b"), Path("/m/base")
    nu = yaml.safe_load(mergekit_config("nuslerp", {"nuslerp_flatten": "no",
                                                    "nuslerp_row_wise": "yes"}, 0.3, a, m))
    assert nu["merge_method"] == "nuslerp" and "base_model" not in nu
    assert nu["parameters"] == {"nuslerp_flatten": False, "nuslerp_row_wise": True}
    assert [x["parameters"]["weight"] for x in nu["models"]] == [0.7, 0.3]
    based = yaml.safe_load(mergekit_config("nuslerp", {}, 0.3, a, m, base=base))
    assert based["base_model"] == str(base)
    ms = yaml.safe_load(mergekit_config("multislerp", {}, 0.3, a, m, base=base))
    assert ms["base_model"] == str(base) and ms["parameters"] == {"normalize_weights": True}
    k = yaml.safe_load(mergekit_config("karcher", {"karcher_max_iter": 20,
                                                   "karcher_tol": 1e-6}, 0.5, a, m))
    assert k["parameters"] == {"max_iter": 20, "tol": 1e-6} and "base_model" not in k
    assert all("parameters" not in x for x in k["models"])
    with pytest.raises(RotvizError, match="plain mean of the models"):
        mergekit_config("karcher", {}, 0.3, a, m)

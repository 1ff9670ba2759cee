"""fusion: merged accuracy of every merge method under every matching (the seed paper's
Tables 1-2), the Merge page's first section. The table's shape and its agreement with the
barrier curve's midpoint (the simple average), and one table made of one run per matching.
(The CLI, the library and the app agree, and at size equals in memory:
tests/measures/test_every_record.py; the app's table: tests/test_app_compute.py.)"""

from __future__ import annotations

import json

import pytest
from pairs import default_pair, digits

from rotviz.analysis.fusion import fusion_table
from rotviz.measures.barrier import interpolate
from rotviz.merging import method as method_record
from rotviz.merging import names


def test_fusion_table_shape_and_agreement_with_the_curve():
    a, b = default_pair()
    # the first 100 test images (the table evaluates 22 models, the curves 6): the
    # agreement holds on any split, and the endpoints still score 0.96 and 0.95 (0.947 and
    # 0.960 on all 397)
    few = digits().subset(100)
    calls = []
    t = fusion_table(a, b, few, stats_split=digits("train"), batches=2, batch_size=16,
                     progress=lambda d, n, m: calls.append((d, n)))
    # no base given: every method that needs none, less those that build whole models of
    # their own (passthrough, zipit: run when named)
    unbased = [n for n in names() if not method_record(n).needs_base
               and method_record(n).assemble is None and method_record(n).whole is None]
    assert len(unbased) >= 10 and "cca" in unbased and "zipit" not in unbased
    assert t.methods == unbased and t.specs == ["none", "seed"]
    assert set(t.acc) == set(unbased) and all(set(r) == {"none", "seed"} for r in t.acc.values())
    assert calls[-1][0] == calls[-1][1] == 2 * (1 + len(unbased))
    none = interpolate(a, b, few, None, points=3)
    seed = interpolate(a, b, few, "seed", points=3)
    assert t.acc["simple"]["none"] == pytest.approx(none.mid_acc)
    assert t.acc["simple"]["seed"] == pytest.approx(seed.mid_acc)
    assert t.distance["seed"] < t.distance["none"]
    assert t.anchor_acc > 0.9 and t.source_acc > 0.9
    md = t.to_markdown()
    assert md.count("\n") == 1 + len(unbased) and "| regmean |" in md
    json.dumps(t.to_dict())


def test_the_fusion_record_combines_its_matchings_as_one_table():
    """The Merge page runs the fusion record once per matching and draws one table: a
    column per matching, each matching's function check kept (the none column has none)."""
    from rotviz.measures.fusion import combine, rows

    def one(spec: str, acc: float, diff: float | None) -> dict:
        return {"methods": ["simple"], "specs": [spec], "match": spec,
                "acc": {"simple": {spec: acc}}, "loss": {"simple": {spec: 1 - acc}},
                "scores": {"simple": {spec: {}}}, "distance": {spec: 2.0 * acc},
                "seconds": 1.0, "max_output_diff": diff, "tolerance": 1e-3}

    t = combine([one("none", 0.25, 0.0), one("seed", 0.5, 2e-6)])
    assert t["specs"] == ["none", "seed"] and t["seconds"] == 2.0
    assert t["acc"] == {"simple": {"none": 0.25, "seed": 0.5}}
    assert t["distance"] == {"none": 0.5, "seed": 1.0}
    assert t["checks"] == [{"spec": "seed", "max_output_diff": 2e-6, "tolerance": 1e-3}]
    assert [(r["matching"], r["acc"]) for r in rows(t)] == [("none", 0.25), ("seed", 0.5)]


def test_the_table_offers_no_repair_it_would_refuse():
    """REPAIR is an option of one merge (`rotviz merge --repair`); the fusion table takes the
    merge record's other options, not --repair (it would refuse it: no method takes it)."""
    from rotviz.measures import measurement

    assert "repair" in {p.name for p in measurement("merge").parameters()}
    assert "repair" not in {p.name for p in measurement("fusion").parameters()}
    assert "repair" not in {p.name for p in measurement("merge_sweep").parameters()}


def test_a_base_given_goes_to_the_methods_that_take_one_optionally():
    """nuslerp and multislerp merge about a base where one is given (`base_optional`): the
    table hands them the base as `rotviz merge --base` does, and their numbers are those of
    `merge_on` with it, not without (here the anchor is the base: the source's task vector
    alone, nuslerp's about-the-base branch)."""
    from rotviz.analysis.merges import merge_on
    from rotviz.match.endpoints import match_endpoints
    from rotviz.measures import measurement

    a, b = default_pair()
    few = digits().subset(16)
    t = fusion_table(a, b, few, methods=("nuslerp",), specs=("none",), base=a)
    ends = match_endpoints(a, b, None)
    assert t.loss["nuslerp"]["none"] == merge_on(ends, "nuslerp", few, base=a).loss
    assert t.loss["nuslerp"]["none"] != merge_on(ends, "nuslerp", few).loss
    fusion = measurement("fusion")  # a base for only optional takers is no longer refused
    assert fusion.values({"methods": "nuslerp,multislerp", "base": "zoo:vit-digits-s3"})

"""rotviz taskvectors: the cosines of task vectors tau_i = theta_i - theta_base, flattened and
per layer, equal plain formulas; per-layer and flattened views agree by the norm-weighted
identity (rotviz.analysis.task_vector_geometry); bad inputs are one line, exit 2."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import refused

from rotviz.measures.taskvectors import task_vectors

BASE, FT_A, FT_B = "zoo:vit-digits-base", "zoo:vit-digits-ft-a", "zoo:vit-digits-ft-b"


@pytest.fixture(scope="module")
def lineage():
    """The zoo's fine-tune lineage: the base and its two fine-tunes (even, odd digits)."""
    from rotviz.sources.loading import load_model

    return [load_model(r) for r in (BASE, FT_A, FT_B)]


def flat(model, base) -> torch.Tensor:
    """The plain task vector: every floating parameter of the model minus the base's,
    concatenated in float64."""
    return torch.cat([(model.state[n].double() - base.state[n].double()).flatten()
                      for n, p in base.model.named_parameters() if p.is_floating_point()])


def identity_holds(d: dict) -> None:
    """Per pair: the flattened cosine is the per-layer cosines weighted by n_i^g n_j^g /
    (N_i N_j), whose sum is the cosine of the norm profiles, so it is also that cosine times
    the norm-weighted mean; per model, the layers' squared norms sum to the squared norm."""
    for i, n in enumerate(d["norm"]):
        assert sum(x * x for x in d["layer_norms"][i]) == pytest.approx(n * n, rel=1e-12)
    for p in d["pairs"]:
        a, b = d["layer_norms"][p["i"]], d["layer_norms"][p["j"]]
        both = d["norm"][p["i"]] * d["norm"][p["j"]]
        weights = [x * y / both for x, y in zip(a, b, strict=True)]
        weighted = sum(w * c for w, c in zip(weights, p["per_layer"], strict=True) if c is not None)
        assert weighted == pytest.approx(p["flattened"], abs=1e-6)
        profile = sum(x * y for x, y in zip(a, b, strict=True)) / math.hypot(*a) / math.hypot(*b)
        assert p["profile_cosine"] == pytest.approx(profile, abs=1e-12) and profile <= 1 + 1e-12
        assert p["profile_cosine"] * p["weighted_mean"] == pytest.approx(p["flattened"],
                                                                         abs=1e-6)


def test_the_lineage_cosine_equals_the_plain_formula_and_its_numbers(lineage):
    base, a, b = lineage
    d = task_vectors(base, [a, b]).to_dict()
    ta, tb = flat(a, base), flat(b, base)
    plain = float(ta @ tb / (ta.norm() * tb.norm()))
    assert d["cosine"][0][1] == pytest.approx(plain, abs=1e-6)
    assert d["cosine"][1][0] == d["cosine"][0][1] and d["cosine"][0][0] == pytest.approx(1.0)
    assert d["norm"] == pytest.approx([float(ta.norm()), float(tb.norm())], rel=1e-9)
    assert d["tensors"] == 72 and d["params"] == ta.numel() == 136138
    assert d["layers"] == ["block 0", "block 1", "block 2", "block 3", "outside"]
    # the zoo lineage's numbers (docs/merging.md): alike, and more so near the head
    p = d["pairs"][0]
    assert plain == pytest.approx(0.5217, abs=1e-4)
    assert (p["min"], p["median"], p["max"]) == pytest.approx((0.3429, 0.4954, 0.9126),
                                                              abs=1e-4)
    assert p["per_layer"][-1] == p["max"]  # "outside" (embeddings, head) is the most alike
    assert d["norm"] == pytest.approx([1.6489, 1.9175], abs=1e-4)
    identity_holds(d)


def test_a_task_vector_against_itself_is_one(lineage):
    base, a, b = lineage
    d = task_vectors(base, [a, a, b]).to_dict()
    same = d["pairs"][0]
    assert (same["i"], same["j"]) == (0, 1)
    assert same["flattened"] == pytest.approx(1.0, abs=1e-12)
    assert same["per_layer"] == pytest.approx([1.0] * len(d["layers"]), abs=1e-12)
    assert same["profile_cosine"] == pytest.approx(1.0, abs=1e-12)
    assert d["cosine"][0][2] == d["cosine"][1][2]  # the copy sees b as a does
    identity_holds(d)


def test_kinds_and_skipping_keep_the_identity(lineage):
    base, a, b = lineage
    by_kind = task_vectors(base, [a, b], "kind").to_dict()
    by_block = task_vectors(base, [a, b]).to_dict()
    assert by_kind["cosine"][0][1] == pytest.approx(by_block["cosine"][0][1], abs=1e-12)
    assert {"qk", "vo", "ffn", "norms", "embeddings", "head"} >= set(by_kind["layers"])
    identity_holds(by_kind)
    head = [n for n, p in base.model.named_parameters() if n.startswith("classifier")
            or n.startswith("head")]
    assert head
    pattern = head[0].split(".")[0] + ".*"
    skipped = task_vectors(base, [a, b], skip=[pattern]).to_dict()
    assert skipped["tensors"] == by_block["tensors"] - len(head)
    keep = [n for n, p in base.model.named_parameters() if n not in head]
    ta = torch.cat([(a.state[n].double() - base.state[n].double()).flatten() for n in keep])
    tb = torch.cat([(b.state[n].double() - base.state[n].double()).flatten() for n in keep])
    assert skipped["cosine"][0][1] == pytest.approx(float(ta @ tb / ta.norm() / tb.norm()),
                                                    abs=1e-6)
    identity_holds(skipped)


def test_every_family_groups_by_its_own_layout(family, loaded):
    """Three tiny random models of each family, the first as the base: the layers are its
    blocks and 'outside' (read from the family's layout), the identity holds."""
    base, a, b = (loaded(family, s) for s in (0, 1, 2))
    d = task_vectors(base, [a, b]).to_dict()
    assert d["layers"][-1] == "outside" and d["layers"][0] == "block 0"
    assert len(d["layers"]) >= 2
    ta, tb = flat(a, base), flat(b, base)
    assert d["cosine"][0][1] == pytest.approx(float(ta @ tb / ta.norm() / tb.norm()), abs=1e-6)
    identity_holds(d)


def test_the_cli_writes_the_json_and_figure(ws, capsys):
    from rotviz.cli import main

    rc = main(["taskvectors", BASE, FT_A, FT_B, "--json", "t.json", "--figure", "t.png",
               "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0 and "0.5217" in out and "0.3429/0.4954/0.9126" in out
    d = json.loads(open("t.json").read())
    assert d["finetuned"] == [FT_A, FT_B] and d["cosine"][0][1] == pytest.approx(0.5217, abs=1e-4)
    assert open("t.png", "rb").read(4) == b"\x89PNG"


@pytest.mark.parametrize(("argv", "says"), [
    ([BASE, FT_A], "at least 2 fine-tuned models, got 1"),
    ([BASE, FT_A, "zoo:gpt2-pystdlib-s0"], "architecture"),
    ([BASE, FT_A, BASE], "task vector is zero and its cosine undefined"),
    ([BASE, FT_A, FT_B, "--match", "act"], "runs the models on data"),
    ([BASE, FT_A, FT_B, "--match", "seed", "--match", "weight"], "one --match SPEC"),
    ([BASE, FT_A, FT_B, "--skip", "*"], "leaves out every trainable tensor"),
])
def test_bad_inputs_are_one_line_and_exit_2(ws, capfd, argv, says):
    refused(["taskvectors", *argv, "--device", "cpu"], capfd, ws, says)


def test_a_matching_aligns_each_fine_tune_onto_the_first():
    """--match seed: each fine-tune after the first is matched onto it (its function kept)
    before its task vector is taken; a fine-tune against itself stays at cosine 1."""
    from rotviz import measure

    d = measure("taskvectors", [BASE, FT_A, FT_B], None, match=["seed"]).to_dict()
    assert d["match"] == "seed" and d["output_diffs"][0] == 0.0
    assert 0 < d["output_diffs"][1] == d["max_output_diff"] < 1e-3
    assert d["cosine"][0][1] == pytest.approx(0.5300, abs=1e-4)  # 0.5217 as given
    assert d["norm"][0] == pytest.approx(1.6489, abs=1e-4)  # the first is not moved
    identity_holds(d)
    same = measure("taskvectors", [BASE, FT_A, FT_A], None, match=["seed"]).to_dict()
    assert same["cosine"][0][1] == pytest.approx(1.0, abs=1e-9)
    plain = measure("taskvectors", [BASE, FT_A, FT_B], None).to_dict()
    assert plain["match"] == "none" and plain["output_diffs"] == []
    assert plain["max_output_diff"] is None


def test_a_layer_one_fine_tune_left_alone_has_no_cosine(lineage):
    """A block equal to the base in one fine-tune (frozen there): its cosine is null and its
    weight 0; the spread leaves it out, the identity still holds, and the figure draws."""
    import dataclasses

    from rotviz.measures.taskvectors import TASKVECTORS, layers_of

    base, a, b = lineage
    where, _ = layers_of(base, list(base.state), "block")
    frozen = {n: (base.state[n] if where.get(n) == "block 0" else t) for n, t in a.state.items()}
    d = task_vectors(base, [dataclasses.replace(a, state=frozen), b]).to_dict()
    p = d["pairs"][0]
    assert p["per_layer"][0] is None and p["weights"][0] == 0.0
    assert d["layer_norms"][0][0] == 0.0 and d["layer_norms"][1][0] > 0
    assert p["min"] == min(c for c in p["per_layer"] if c is not None)
    identity_holds(d)
    assert TASKVECTORS.figure(d) is not None

"""The similarity record (rotviz.measures.similarity) and its maths
(rotviz.analysis.shape_metrics): linear CKA against a plain HSIC written here, the unbiased
and RBF estimators, invariances, the shape metrics' metric axioms, statistics over batches
equal to the full batch, and on the default pair the matrix unchanged by every matching that
keeps the function while the parameter distance falls."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import refused
from pairs import default_pair, digits, synthetic_split

from rotviz.analysis import shape_metrics as S
from rotviz.analysis.representations import first_token_convention
from rotviz.arch import spec_named
from rotviz.cli import main
from rotviz.errors import RotvizError
from rotviz.match.endpoints import match_endpoints, unmatched
from rotviz.measures.similarity import matrix, similarity_figure, similarity_on


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _pair(n: int = 40, p: int = 9, q: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    x = torch.randn(n, p, generator=g, dtype=torch.float64) + 2.0
    y = x @ torch.randn(p, q, generator=g, dtype=torch.float64) + \
        torch.randn(n, q, generator=g, dtype=torch.float64)
    return x, y


def _orthogonal(d: int, seed: int = 1) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=_gen(seed), dtype=torch.float64))
    return q


def plain_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Kornblith et al.'s definition, as written: HSIC(K, L) = tr(K H L H) / (n - 1)^2 with
    the centring matrix H on the linear Gram matrices."""
    n = x.shape[0]
    h = torch.eye(n, dtype=torch.float64) - torch.ones(n, n, dtype=torch.float64) / n
    k, lg = x @ x.T, y @ y.T

    def hsic(a, b):
        return torch.trace(a @ h @ b @ h) / (n - 1) ** 2

    return float(hsic(k, lg) / torch.sqrt(hsic(k, k) * hsic(lg, lg)))


def direct_unbiased_hsic(x: torch.Tensor, y: torch.Tensor) -> float:
    """Song et al. (2012), eq. 5, on the Gram matrices with zeroed diagonals."""
    n = x.shape[0]
    k, lg = x @ x.T, y @ y.T
    k.fill_diagonal_(0)
    lg.fill_diagonal_(0)
    one = torch.ones(n, dtype=torch.float64)
    value = torch.trace(k @ lg) + (one @ k @ one) * (one @ lg @ one) / ((n - 1) * (n - 2)) \
        - 2.0 / (n - 2) * (one @ k @ lg @ one)
    return float(value / (n * (n - 3)))


def test_linear_cka_equals_a_plain_hsic_implementation():
    for seed in range(3):
        x, y = _pair(seed=seed)
        want = plain_cka(x, y)
        assert abs(S.linear_cka(x, y) - want) < 1e-6
        # the record's matrix, by covariances (n > width) and by Gram matrices (n <= width)
        assert abs(matrix("cka", [x], [y])[0][0] - want) < 1e-6
        xs, ys = x[:5], y[:5]
        assert abs(matrix("cka", [xs], [ys])[0][0] - plain_cka(xs, ys)) < 1e-6
    assert 0.2 < want < 1.0  # a related pair, not a trivial one


def test_cka_is_unchanged_by_an_orthogonal_map_and_an_isotropic_scale():
    x, y = _pair()
    base = S.linear_cka(x, y)
    qx, qy = _orthogonal(x.shape[1]), _orthogonal(y.shape[1], 2)
    for a, b in ((x @ qx, y), (x, y @ qy), (3.7 * x, y), (x, 0.02 * y), (-2 * x @ qx, 5 * y @ qy)):
        assert abs(S.linear_cka(a, b) - base) < 1e-6
        assert abs(S.unbiased_cka(a, b) - S.unbiased_cka(x, y)) < 1e-6
    assert abs(S.linear_cka(x, x) - 1) < 1e-12


def test_unbiased_cka_against_the_direct_formula_and_rbf_self_similarity():
    x, y = _pair(n=30)
    for a, b in ((x, y), (x, x), (y, y)):
        assert abs(S.unbiased_hsic(a, b) - direct_unbiased_hsic(a, b)) < 1e-8 * max(
            1.0, abs(direct_unbiased_hsic(a, b)))
    want = direct_unbiased_hsic(x, y) / math.sqrt(direct_unbiased_hsic(x, x)
                                                   * direct_unbiased_hsic(y, y))
    assert abs(S.unbiased_cka(x, y) - want) < 1e-6
    assert abs(S.unbiased_cka(x, x) - 1) < 1e-9
    assert abs(S.rbf_cka(x, x) - 1) < 1e-9
    assert abs(S.rbf_cka(x, x @ _orthogonal(9), 0.3) - 1) < 1e-9  # distances kept
    assert 0 < S.rbf_cka(x, y) < 1


def test_shape_metrics_zero_for_a_transformed_copy_symmetric_and_triangle():
    x, y = _pair()
    assert S.procrustes(x, 4.0 * x @ _orthogonal(9)) < 1e-6
    assert S.permutation(x, 0.5 * x[:, torch.randperm(9, generator=_gen(3))]) < 1e-6
    assert S.linear_shape(x, x @ torch.randn(9, 9, generator=_gen(4), dtype=torch.float64)) < 1e-6
    # a permutation is a rotation: never closer modulo permutations
    assert S.permutation(x, y) >= S.procrustes(x, y) - 1e-12
    assert S.procrustes(x, y) > 0.1
    g = _gen(5)
    for _ in range(20):
        a, b, c = (torch.randn(25, int(torch.randint(3, 8, (1,), generator=g)), generator=g,
                               dtype=torch.float64) for _ in range(3))
        for f in (S.procrustes, S.permutation, S.linear_shape):
            assert abs(f(a, b) - f(b, a)) < 1e-9, f.__name__
            assert f(a, c) <= f(a, b) + f(b, c) + 1e-9, f.__name__


@pytest.mark.parametrize("fam,tokens", [("vit", "mean"), ("vit", "cls"), ("gpt2", "all"),
                                        ("bert", "mean")])
def test_a_model_against_itself_scores_one_over_several_batches(loaded, fam, tokens):
    a = loaded(fam, 0)
    split = synthetic_split(a, 12)
    ends = unmatched(a, a)
    whole = similarity_on(ends, split, "cka", tokens, batch_size=512)
    parts = similarity_on(ends, split, "cka", tokens, batch_size=5)  # 3 batches
    n = len(whole["layers_anchor"])
    assert n == 3 and whole["n"] == parts["n"]
    first = 1 if tokens == "cls" and fam == "vit" else 0  # the class token: one constant row
    for k in range(first, n):
        assert abs(parts["matrix"][k][k] - 1) < 1e-6
    for r, s in zip(whole["matrix"], parts["matrix"], strict=True):
        assert max(abs(p - q) for p, q in zip(r, s, strict=True)) < 1e-9
    assert max(s["rotation"] for s in parts["ladder"][first:]) < 1e-6


def test_first_token_convention_follows_the_architecture_data():
    have = {f: first_token_convention(spec_named(f)) for f in
            ("vit", "timm-vit", "bert", "roberta", "deberta-v2", "gpt2", "llama")}
    assert have == {"vit": True, "timm-vit": True, "bert": True, "roberta": True,
                    "deberta-v2": True, "gpt2": False, "llama": False}


def test_cls_on_a_causal_decoder_is_refused(loaded):
    a = loaded("gpt2", 0)
    with pytest.raises(RotvizError, match="first-token"):
        similarity_on(unmatched(a, a), synthetic_split(a, 6), "cka", "cls")


@pytest.fixture(scope="module")
def base():
    a, b = default_pair()
    return a, b, digits()


@pytest.mark.parametrize("spec", ["seed", "ffn", "attn", "weight"])
def test_matching_changes_the_weights_not_the_representations(base, spec):
    """Each matching moves the source's weights, not its representations. Weight matching's
    alternation stops after its first round (0.2 of 7 CPU-s here): it has matched the heads
    and the residual map by then, and nothing checked depends on how far it went."""
    from rotviz.match.options import with_time_limit
    from rotviz.match.selection import match_options

    a, b, split = base
    ends = match_endpoints(a, b, with_time_limit(match_options(spec), 0), data=split)
    d = similarity_on(ends, split)
    assert d["n"] == 397 and len(d["matrix"]) == len(d["matrix"][0]) == 5
    diff = max(abs(p - q) for r, s in zip(d["matrix"], d["matrix_matched"], strict=True)
               for p, q in zip(r, s, strict=True))
    assert diff < 1e-5 and d["max_change"] == diff
    assert d["distance_after"] < d["distance_before"] - 0.5
    assert abs(d["matrix"][0][0] - 0.9624) < 1e-3  # embeddings: the same digits, alike
    assert 0.25 < d["matrix"][4][4] < 0.5  # the last blocks: much less alike
    for s, t in zip(d["ladder"], d["ladder_matched"], strict=True):
        assert abs(s["rotation"] - t["rotation"]) < 1e-5 and abs(s["linear"] - t["linear"]) < 1e-5
    fig = similarity_figure(d)
    assert len(fig.data) == 2 + 2 + 3 and fig.layout.coloraxis.cmax == 1.0


def test_cli_json_and_bad_values(tmp_path, capfd, ws):
    out = tmp_path / "s.json"
    rc = main(
        ["similarity", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
         "--metric", "procrustes", "--match", "none", "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["metric"] == "procrustes" and d["tokens"] == "mean" and "matrix_matched" not in d
    assert d["layers_anchor"][0] == "embeddings" and len(d["layers_source"]) == 5
    assert all(0 <= v <= math.pi / 2 for r in d["matrix"] for v in r)
    refused(["similarity", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
             "--metric", "cosine", "--json", str(tmp_path / "x.json")], capfd, ws, "--metric")
    refused(["similarity", "zoo:gpt2-pystdlib-s0", "zoo:gpt2-pystdlib-s1", "--data", "pystdlib",
             "--tokens", "cls", "--json", str(tmp_path / "y.json")], capfd, ws, "--tokens cls")


@pytest.mark.parametrize("fam,tokens,metric", [("vit", "all", "cka-unbiased"),
                                               ("gpt2", "mean", "procrustes")])
def test_at_size_equals_in_memory(saved, loaded, fam, tokens, metric):
    """Block by block (each model's module on meta, a block's weights read as it runs), the
    same hidden states, so the same numbers."""
    from rotviz.atsize.blocks import open_streamed
    from rotviz.atsize.endpoints import streamed_endpoints
    from rotviz.match.selection import match_options
    from rotviz.measures.similarity import sized_similarity

    a, b = loaded(fam, 0), loaded(fam, 1)
    split = synthetic_split(a, 6)
    mem = similarity_on(match_endpoints(a, b, "ffn"), split, metric, tokens)
    with streamed_endpoints(open_streamed(saved(fam, 0)), open_streamed(saved(fam, 1)),
                            match_options("ffn"), "cpu") as ends:
        big = sized_similarity(ends, split, metric, tokens, batch_size=4)
    assert big["n"] == mem["n"] and big["layers_anchor"] == mem["layers_anchor"]
    for key in ("matrix", "matrix_matched"):
        assert max(abs(p - q) for r, s in zip(big[key], mem[key], strict=True)
                   for p, q in zip(r, s, strict=True)) < 1e-6
    assert abs(big["distance_after"] - mem["distance_after"]) < 1e-4

"""Half-precision (bfloat16, float16) checkpoints in every command, for every family.

rotviz computes in float32 (float64 where it already does) and writes each tensor back in the
checkpoint's own dtype; `match` checks the function a second time in that dtype, against the
per-dtype tolerance of `rotviz.match.pipeline.FUNCTION_TOLERANCES`. The CLI runs in-process. Text
families read the built-in `pystdlib` corpus (its head; 64-token windows, so 64 positions;
BERT as BertLMHeadModel, since its sequence classifier fits no text data); image families read
`digits` (8x8, 1 channel, 10 classes).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import TINY, clone_state
from safetensors.torch import load_file, save_file

from rotviz.arch import FAMILIES, family_module, spec_named
from rotviz.cli import main
from rotviz.data.reading import split_for
from rotviz.data.split import load_split
from rotviz.data.text import VOCAB_SIZE
from rotviz.evaluation import evaluate
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import FUNCTION_TOLERANCES, check_in_stored_dtype, match_models
from rotviz.measures.merge import merge
from rotviz.merging.simple import simple_average
from rotviz.random_models import options, save_random
from rotviz.sources.loading import Loaded, load_model
from rotviz.sources.plain_torch import load_for_eval
from rotviz.sources.running import forward, probe_inputs, stored_module, stored_output_diff
from rotviz.sources.writing import save_model

ALL = FAMILIES
HALF = (torch.bfloat16, torch.float16)
# A stream map needs an output head of its own: tied heads (RoBERTa's and BERT's LM heads)
# refuse it, so every family runs residual maps on its random model with an untied head (the
# family module's UNTIED; BERT's sequence classifier: match reads no data), where it has one.
RESIDUAL = {f for f in FAMILIES if family_module(f).UNTIED is not None}


def _images(family: str) -> bool:
    return spec_named(family).inputs == "pixels"


def _sizes(family: str, lm: bool = True) -> dict:
    """Image families: digits' shape. Text families: the corpus' vocabulary and 64 positions,
    an untied head where the family has one, and with `lm` a language-model head where the
    family's random model makes one on request (BERT: `lm`)."""
    if _images(family):
        return dict(TINY, image=8, channels=1, labels=10)
    extra = dict(family_module(family).UNTIED or {})
    if lm and "lm" in options(family):
        extra["lm"] = True
    return dict(TINY, vocab=VOCAB_SIZE, positions=64, **extra)


@pytest.fixture(scope="session")
def data_for(tmp_path_factory):
    """`data_for(family)`: a data reference the family reads. Text: the first 640 windows of
    the pystdlib corpus as a text file (64 test windows, 9x faster to evaluate than all)."""
    from rotviz.data.text import CONTEXT, pystdlib_text

    text = tmp_path_factory.mktemp("text") / "pystdlib-head.txt"
    text.write_text(pystdlib_text()[: 640 * CONTEXT + 1], encoding="utf-8")
    return lambda family: "digits" if _images(family) else f"text:{text}"


@pytest.fixture(scope="session")
def half_pair(tmp_path_factory):
    """`half_pair(family, dtype, lm=True)`: (anchor, source) folders of a saved half pair."""
    root = tmp_path_factory.mktemp("half")
    cache: dict[tuple, tuple[Path, Path]] = {}

    def get(family: str, dtype: torch.dtype, lm: bool = True) -> tuple[Path, Path]:
        key = (family, dtype, lm)
        if key not in cache:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            try:
                cache[key] = tuple(
                    save_random(family, root / f"{family}-{dtype}-{lm}-{s}", seed=s, dtype=dtype,
                                **_sizes(family, lm))
                    for s in (0, 1))
            finally:
                hf_logging.enable_progress_bar()
        return cache[key]

    return get


@pytest.fixture(scope="session")
def half_loaded(half_pair):
    """`half_loaded(family, dtype)`: the cached loaded pair (shared: never modify it)."""
    cache: dict[tuple, tuple[Loaded, Loaded]] = {}

    def get(family: str, dtype: torch.dtype) -> tuple[Loaded, Loaded]:
        if (family, dtype) not in cache:
            cache[family, dtype] = tuple(load_model(d) for d in half_pair(family, dtype))
        return cache[family, dtype]

    return get


def _run(args: list[str], capsys) -> str:
    rc = main(args)
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


def _dtypes(folder: Path) -> set[torch.dtype]:
    return {v.dtype for v in load_file(str(folder / "model.safetensors")).values()
            if v.is_floating_point()}


def _native(folder: Path, dtype: torch.dtype):
    """The saved model in `dtype`, loaded the way a user runs it: transformers' own class from
    config.json (which keeps the checkpoint's dtype), or timm's module cast to it."""
    cfg = json.loads((folder / "config.json").read_text())
    if "architecture" in cfg:  # timm
        return load_model(folder).model.to(dtype)  # a fresh, uncached load
    import transformers

    model = getattr(transformers, cfg["architectures"][0]).from_pretrained(str(folder)).eval()
    assert next(model.parameters()).dtype == dtype
    return model


def _logits(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        if "pixel_values" in inputs and not hasattr(model, "config"):
            return model(inputs["pixel_values"]).double()
        return model(**inputs).logits.double()


def assert_same_function_in(dtype: torch.dtype, source: Path, written: Path, like: Loaded):
    """The written model, run in `dtype`, computes the source's function (run in `dtype`) to
    the stated tolerance: FUNCTION_TOLERANCES[dtype] times the source's largest |logit|."""
    x = {k: v.to(dtype) if v.is_floating_point() else v for k, v in probe_inputs(like).items()}
    ya, yb = _logits(_native(source, dtype), x), _logits(_native(written, dtype), x)
    scale = float(ya.abs().max())
    assert torch.isfinite(yb).all() and scale > 0.1
    assert float((ya - yb).abs().max()) <= FUNCTION_TOLERANCES[dtype] * scale


def assert_untouched(m: Loaded, before: dict[str, torch.Tensor]) -> None:
    assert all(torch.equal(m.state[k], v) for k, v in before.items())
    assert all(p.dtype == torch.float32 for p in m.model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in m.model.state_dict().items())


# ---- loading and saving -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("family", ALL)
def test_half_checkpoint_loads_as_float32_and_records_its_dtype(family, dtype, half_loaded):
    a, _ = half_loaded(family, dtype)
    assert a.stored_dtype == dtype
    assert set(a.stored_dtypes.values()) == {dtype}
    assert all(v.dtype == torch.float32 for v in a.state.values() if v.is_floating_point())
    raw = load_file(str(next(a.path.glob("*.safetensors"))))
    # float32 holds every half value exactly: the upcast loses nothing
    for k, v in raw.items():
        if k in a.state and v.is_floating_point():
            assert torch.equal(a.state[k].to(dtype), v)


def test_explicit_dtype_and_float32_checkpoints_keep_todays_behaviour(half_pair, loaded):
    half = load_model(half_pair("llama", torch.bfloat16)[0], dtype=torch.float64)
    assert half.stored_dtypes == {} and half.stored_dtype == torch.float32
    assert next(half.model.parameters()).dtype == torch.float64
    f32 = loaded("gpt2", 0)
    assert f32.stored_dtype == torch.float32 and set(f32.stored_dtypes.values()) == {torch.float32}
    m = match_models(f32, loaded("gpt2", 1))
    assert m.report.stored_dtype is None and m.report.stored_output_diff is None
    assert m.report.to_dict()["stored_dtype"] is None


def test_save_keeps_each_tensors_own_dtype(saved, tmp_path):
    """A mixed checkpoint (bf16 weights, float32 norms and biases) comes back tensor by tensor."""
    src = saved("timm-vit", 0)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "config.json").write_text((src / "config.json").read_text())
    raw = load_file(str(src / "model.safetensors"))
    want = {k: torch.bfloat16 if v.dim() > 1 else torch.float32 for k, v in raw.items()}
    save_file({k: v.to(want[k]) for k, v in raw.items()}, str(mixed / "model.safetensors"))
    m = load_model(mixed)
    assert m.stored_dtypes == want and m.stored_dtype == torch.bfloat16
    out = save_model(m, {k: v * 2 for k, v in m.state.items()}, tmp_path / "out")
    back = load_file(str(out / "model.safetensors"))
    assert {k: v.dtype for k, v in back.items()} == want
    assert all(torch.equal(back[k], (m.state[k] * 2).to(want[k])) for k in want)


def test_lite_eval_path_computes_in_float32(half_pair, tmp_path):
    tied = save_random("gpt2", tmp_path / "tied", dtype=torch.bfloat16, **dict(TINY, vocab=61))
    for d in (tied, half_pair("vit", torch.bfloat16)[0]):  # the lite path's two families
        lite, full = load_for_eval(d), load_model(d)
        assert type(lite.model).__name__.startswith("Lite")
        assert lite.stored_dtype == torch.bfloat16
        assert all(p.dtype == torch.float32 for p in lite.model.parameters())
        x = probe_inputs(full)
        torch.testing.assert_close(forward(lite, x), forward(full, x), rtol=0, atol=1e-5)


# ---- the function check in the stored dtype -----------------------------------------------------


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_check_in_stored_dtype_fails_a_broken_map_and_an_overflow(dtype, half_loaded):
    a, b = half_loaded("llama", dtype)
    before = clone_state(b.state)
    m = match_models(a, b)
    rep = m.report
    assert m.preserved and rep.stored_dtype == str(dtype)[6:]
    assert 0 < rep.stored_output_diff <= rep.stored_tolerance
    # the tolerance is the table's, relative to the source's largest |logit| in that dtype
    _, scale = stored_output_diff(b, b.state)
    assert rep.stored_tolerance == pytest.approx(FUNCTION_TOLERANCES[dtype] * scale)
    # one FFN layer's units permuted on the way in only: the function breaks in both checks
    key = "model.layers.0.mlp.up_proj.weight"
    broken = dict(m.state, **{key: m.state[key].flip(0)})
    rep2 = replace(rep)
    check_in_stored_dtype(b, broken, rep2)
    assert rep2.stored_output_diff > rep2.stored_tolerance
    # a weight beyond float16's range (65504) overflows: never a pass
    huge = dict(m.state, **{key: m.state[key] * 1e6})
    check_in_stored_dtype(b, huge, rep2)
    if dtype == torch.float16:
        assert rep2.stored_output_diff == float("inf")
    assert not rep2.stored_output_diff <= rep2.stored_tolerance
    failing = replace(m, report=rep2)
    assert not failing.preserved and f"in {rep2.stored_dtype}" in failing.failure
    assert_untouched(b, before)


def test_library_paths_never_modify_a_cached_half_model(half_loaded, tmp_path):
    a, b = half_loaded("vit", torch.bfloat16)
    before_a, before_b = clone_state(a.state), clone_state(b.state)
    dtypes_a = dict(a.stored_dtypes)
    m = match_models(a, b, MatchOptions(heads=True, residual=True, rounds=2))
    stored_module(b)
    save_model(b, m.state, tmp_path / "m")
    split = load_split("digits", "val")
    merge(a, b, "fisher", "seed", split, split, batches=1, batch_size=8)
    assert a.stored_dtypes == dtypes_a
    assert_untouched(a, before_a)
    assert_untouched(b, before_b)


# ---- every command, every family -----------------------------------------------------------------


# Each family in one half dtype, the two taking turns (seven families each): reading a half
# checkpoint exactly, in either dtype, is asserted for every family by the tests above; what
# varies here is the command, not the dtype.
TURNS = [(f, HALF[i % 2]) for i, f in enumerate(ALL)]


@pytest.mark.parametrize(("family", "dtype"), TURNS, ids=[f"{f}-{str(d)[6:]}" for f, d in TURNS])
def test_match_writes_the_checkpoints_dtype_and_keeps_the_function(family, dtype, half_pair,
                                                                   half_loaded, tmp_path, capsys):
    a_dir, b_dir = half_pair(family, dtype)
    name = str(dtype)[6:]
    out, rep_file = tmp_path / "m", tmp_path / "r.json"
    line = _run(["match", str(a_dir), str(b_dir), "--out", str(out), "--report", str(rep_file),
                 "--device", "cpu"], capsys)
    assert f"in {name} (tolerance" in line
    rep = json.loads(rep_file.read_text())
    assert rep["stored_dtype"] == name and rep["max_output_diff"] <= 1e-3
    assert 0 < rep["stored_output_diff"] <= rep["stored_tolerance"]
    assert _dtypes(out) == {dtype}
    assert_same_function_in(dtype, b_dir, out, half_loaded(family, dtype)[1])
    # the residual alternation writes as the per-layer maps do: each family runs it in the
    # half dtype that TURNS does not give it, so both dtypes of every such family are written
    if family in RESIDUAL:
        other = HALF[1 - HALF.index(dtype)]
        a_dir, b_dir = half_pair(family, other, lm=False)
        out2 = tmp_path / "w"
        line = _run(["match", str(a_dir), str(b_dir), "--out", str(out2), "--heads",
                     "--residual", "--rounds", "2", "--device", "cpu"], capsys)
        assert "alternation rounds" in line and f"in {str(other)[6:]} (tolerance" in line
        assert _dtypes(out2) == {other}
        assert_same_function_in(other, b_dir, out2, load_model(b_dir))


# The commands on half pairs: what is half-specific (reading, casting, the stored dtype and
# its tolerance) is the same code for every family, tested on every family above; the
# commands are run on one family of each kind of input, task and weight source, and on a
# rotary gated decoder (each family's evaluation is tested in float32 elsewhere).
COMMANDS = [(f, d) for f, d in TURNS
            if f in ("gpt2", "bert", "roberta", "vit", "timm-vit", "llama", "qwen3")]


@pytest.mark.parametrize(("family", "dtype"), COMMANDS,
                         ids=[f"{f}-{str(d)[6:]}" for f, d in COMMANDS])
def test_barrier_merge_and_eval_agree_on_half_pairs(family, dtype, half_pair, half_loaded,
                                                    data_for, tmp_path, capsys):
    a_dir, b_dir = half_pair(family, dtype)
    a, b = half_loaded(family, dtype)
    before_a, before_b = clone_state(a.state), clone_state(b.state)
    data = data_for(family)
    evals = []
    for d in (a_dir, b_dir):
        f = tmp_path / f"eval-{d.name}.json"
        _run(["eval", str(d), "--data", data, "--json", str(f), "--device", "cpu"], capsys)
        evals.append(json.loads(f.read_text()))
    # the half models are read in float32 exactly: eval equals the float32 evaluation
    want = evaluate(a, split_for(a, data, "test"))
    assert evals[0]["loss"] == pytest.approx(want["loss"], abs=1e-5)
    bf = tmp_path / "barrier.json"
    _run(["barrier", str(a_dir), str(b_dir), "--data", data, "--points", "3", "--json", str(bf),
          "--device", "cpu"], capsys)
    c = json.loads(bf.read_text())
    assert abs(c["loss"][0] - evals[0]["loss"]) <= 1e-4
    assert abs(c["loss"][-1] - evals[1]["loss"]) <= 1e-4
    assert c["distance_after"] < c["distance_before"]
    lo, hi = min(evals[0]["loss"], evals[1]["loss"]), max(c["loss"])
    assert 0 < lo <= hi < 20  # finite, sensible cross-entropies
    # the statistics-based methods read the pair in float32 whatever it is stored in: one
    # half dtype shows that they write it back in that dtype (the other runs the simple merge)
    for method in ("simple", "fisher", "regmean") if dtype == torch.float16 else ("simple",):
        out, mf = tmp_path / f"merged-{method}", tmp_path / f"merge-{method}.json"
        stats = [] if method == "simple" else ["--batches", "1", "--batch-size", "8"]
        _run(["merge", str(a_dir), str(b_dir), "--data", data, "--method", method, "--out",
              str(out), "--json", str(mf), *stats, "--device", "cpu"], capsys)
        r = json.loads(mf.read_text())
        assert _dtypes(out) == {dtype}
        assert r["anchor_loss"] == pytest.approx(evals[0]["loss"], abs=1e-4)
        assert r["source_loss"] == pytest.approx(evals[1]["loss"], abs=1e-4)
        assert 0 <= r["acc"] <= 1 and 0 < r["loss"] < 20
        if method == "simple":
            # the written merge is the float32 merge rounded to the dtype, tensor by tensor
            merged = load_model(out)
            for k, v in match_models(a, b).state.items():
                if v.is_floating_point():
                    mid = simple_average([a.state[k], v], [0.5, 0.5])
                    assert torch.equal(merged.state[k], mid.to(dtype).float()), k
    assert_untouched(a, before_a)
    assert_untouched(b, before_b)

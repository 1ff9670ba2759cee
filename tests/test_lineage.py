"""Lineages: a matching's group element, applied unchanged to the source's fine-tunes
(rotviz.symmetry.element, rotviz.match.lineage, `rotviz match --also`), and the lineage
experiment on the zoo's two lineages (docs/symmetries.md)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import ZOO, clone_state, refused, snapshot, view_of

from rotviz.cli import main
from rotviz.data.split import load_split
from rotviz.errors import RotvizError
from rotviz.evaluation import evaluate
from rotviz.match.distances import distances
from rotviz.match.lineage import check_lineage, element_of_matched, move_model, move_state
from rotviz.match.pipeline import Matched, match_models
from rotviz.match.selection import match_options
from rotviz.merging.combine import merge_states
from rotviz.sources.loading import load_model
from rotviz.sources.running import forward, probe_inputs

A, B = "zoo:vit-digits-s3", "zoo:vit-digits-s6"
A_FT, B_FT = "zoo:vit-digits-s3-ft", "zoo:vit-digits-s6-ft"


def _fine_tune(source, seed: int):
    """A stand-in fine-tune of `source`: every float tensor nudged by seeded noise of 5% of
    its own spread (a shared model is never modified: new tensors, one new Loaded)."""
    gen = torch.Generator().manual_seed(seed)
    state = {k: v + 0.05 * v.std() * torch.randn(v.shape, generator=gen, dtype=v.dtype)
             if v.is_floating_point() and v.numel() > 1 else v.clone()
             for k, v in source.state.items()}
    return replace(source, ref=f"{source.ref}-ft", state=state)


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


# seed matching (per-layer maps only), and weight matching with the residual map on an
# RMSNorm model (orthogonal Q) and a pre-norm LayerNorm one (centred Q, writer means)
CASES = [("gpt2", "seed"), ("llama", "weight"), ("vit", "weight")]


@pytest.mark.parametrize(("family", "spec"), CASES, ids=[f"{f}-{s}" for f, s in CASES])
def test_the_element_moves_the_source_and_its_fine_tune(loaded, family, spec):
    anchor, source = loaded(family, 0), loaded(family, 1)
    out = match_models(anchor, source, match_options(spec))
    assert out.preserved and out.element is not None
    assert (out.element.residual is not None) == (spec == "weight")
    # the element alone reproduces the matched source
    assert _max_diff(move_state(out.element, source), out.state) <= 1e-5
    ft = _fine_tune(source, seed=11)
    kept = clone_state(ft.state)
    moved = move_model(out, source, ft)
    assert _max_diff(ft.state, kept) == 0.0  # the fine-tune is not touched
    assert moved.failure is None and moved.max_output_diff <= 1e-4
    # an independent check on other inputs than the function check's
    x = probe_inputs(ft, n=3, seed=5)
    assert float((forward(ft, x, moved.state) - forward(ft, x, ft.state)).abs().max()) <= 1e-4
    # moved, the fine-tune sits next to the anchor as the matched source does
    va = view_of(anchor)
    d_before = distances(view_of(replace(ft, state=ft.state)), va).total
    d_after = distances(view_of(replace(ft, state=moved.state)), va).total
    assert d_after < 0.9 * d_before, (d_before, d_after)


def test_a_model_of_other_shapes_or_a_learned_match_is_refused(loaded, saved):
    anchor, source = loaded("gpt2", 0), loaded("gpt2", 1)
    out = match_models(anchor, source)
    wider = load_model(saved("gpt2", 2, ffn=96))
    with pytest.raises(RotvizError, match="cannot be moved with the element found for"):
        check_lineage(source, wider)
    with pytest.raises(RotvizError, match="cannot be moved"):
        move_model(out, source, loaded("llama", 1))
    with pytest.raises(RotvizError, match="learned"):
        element_of_matched(Matched(out.state, out.report, None))


@pytest.fixture(scope="module")
def lineage_run(tmp_path_factory):
    """`rotviz match` of the default pair, moving vit-digits-s6-ft with it: run once."""
    d = tmp_path_factory.mktemp("lineage")
    out, moved, rep = d / "s6-matched", d / "s6-ft-moved", d / "report.json"
    rc = main(["match", A, B, "--out", str(out), "--also", f"{B_FT}={moved}",
               "--report", str(rep), "--device", "cpu"])
    assert rc == 0
    return out, moved, json.loads(rep.read_text())


def test_match_also_writes_the_moved_fine_tune_and_reports_it(lineage_run, capsys):
    out, moved, report = lineage_run
    assert [e["model"] for e in report["also"]] == [B_FT]
    entry = report["also"][0]
    assert entry["output"] == str(moved) and entry["max_output_diff"] <= 1e-4
    assert (moved / "model.safetensors").is_file() and (moved / "config.json").is_file()
    ft, mv = load_model(B_FT), load_model(moved)
    # its logits on the test images equal the fine-tune's (the function is kept)
    x = {"pixel_values": load_split("digits", "test").inputs[:128]}
    assert float((forward(mv, x) - forward(ft, x)).abs().max()) <= 1e-4
    # and its weights moved: it is the fine-tune written anew, not a copy
    assert _max_diff(mv.state, ft.state) > 0.1


def test_the_lineage_experiment(lineage_run):
    """Align base s6 onto base s3, move s6's fine-tune with the same element, merge the two
    fine-tunes (simple average, weight 0.5): aligned beats unaligned on the test split."""
    _, moved, _ = lineage_run
    fa, fb, mv = load_model(A_FT), load_model(B_FT), load_model(moved)
    test = load_split("digits", "test")
    aligned = evaluate(fa, test, merge_states(fa, "simple", fa.state, mv.state, 0.5))
    unaligned = evaluate(fa, test, merge_states(fa, "simple", fa.state, fb.state, 0.5))
    print(f"lineage merge: aligned acc {aligned['acc']:.4f} loss {aligned['loss']:.4f}; "
          f"unaligned acc {unaligned['acc']:.4f} loss {unaligned['loss']:.4f}")
    # measured: aligned 0.3023 (loss 2.42), unaligned 0.1763 (loss 3.22)
    assert aligned["acc"] >= unaligned["acc"] + 0.05
    assert aligned["loss"] < unaligned["loss"] - 0.3


@pytest.mark.parametrize(("extra", "words"), [
    (["--also", B_FT], "is not MODEL=FOLDER"),
    (["--also", "=m"], "is not MODEL=FOLDER"),
    (["--also", "zoo:gpt2-pystdlib-s0=m"], "cannot be moved with the element found for"),
    (["--also", f"{B_FT}=m", "--learned", "--data", "digits"], "learned matching leaves none"),
    (["--also", f"{B_FT}=m", "--max-memory", "0"], "this match runs at size"),
    (["--also", f"{B_FT}=o"], "lies inside or on"),
    (["--also", f"{B_FT}=m", "--also", f"{A_FT}=m/x"], "lies inside or on"),
    (["--also", f"{B_FT}=full"], "already holds files"),
], ids=["no-eq", "no-model", "other-arch", "learned", "streamed", "on-out", "nested", "full"])
def test_also_refusals(ws, capfd, extra, words):
    refused(["match", A, B, "--out", "o", *extra], capfd, ws, words)


def test_an_interrupt_while_writing_a_moved_model_leaves_nothing(ws, capfd, monkeypatch):
    import rotviz.sources.writing

    real = rotviz.sources.writing.write_model
    calls = []

    def second_fails(template, state, folder, extra_files=None):
        calls.append(template.ref)
        real(template, state, folder, extra_files)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(rotviz.sources.writing, "write_model", second_fails)
    before = snapshot(ws.parent, ZOO)
    rc = main(["match", A, B, "--out", "o", "--also", f"{B_FT}=deep/m", "--no-attn"])
    assert rc == 130 and calls == [B, B_FT]
    assert "Traceback" not in capfd.readouterr().err
    assert snapshot(ws.parent, ZOO) == before

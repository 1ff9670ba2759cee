"""The compatibility matrix: every family x {today's format, the older format with the buffers
older transformers versions saved, a pickled .bin read with weights_only, every model class
transformers offers for it (headless, each head)}.

Each cell is a tiny random model saved by transformers (the buffers added where older
versions saved them). It must load; a planted symmetry element must be recovered to 1e-5
(float64) with every output of the model kept to 1e-4; the function check must see every
head (a head-only change moves it); and each measurement gives a number or a one-line
refusal, never a traceback: the loss measurements through the library on every cell, and
every registered measurement through the command line on one model of each kind of head.
docs/inputs.md shows the matrix.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rotviz.arch import FAMILIES, spec_named
from rotviz.cli import main
from rotviz.data.text import VOCAB_SIZE
from rotviz.errors import RotvizError
from rotviz.heads import head_of_config
from rotviz.match.distances import distances, norm
from rotviz.match.endpoints import from_matched, match_endpoints
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import match_models
from rotviz.measures import measurements
from rotviz.random_models import random_config, save_random
from rotviz.runner import measure
from rotviz.sources.loading import load_model
from rotviz.sources.pairs import body_patterns
from rotviz.sources.running import max_output_diff
from rotviz.symmetry.actions import apply, random_element
from rotviz.symmetry.view import read_view, write_state

F64 = torch.float64
SIZES = dict(layers=1, d=16, heads=2, ffn=32, vocab=VOCAB_SIZE, labels=10)


def head_classes(family: str) -> list[str]:
    """Every model class transformers offers for `family` (its auto mappings: headless,
    language models, pre-training, classifiers, question answering, multiple choice, ...),
    named after the family's own classes; none for timm."""
    if spec_named(family).source != "hf":
        return []
    from transformers.models.auto import modeling_auto as auto

    own = random_config(family, _sizes())["architectures"][0]  # the family's default class
    prefix = re.split("For|LMHead|Model$", own)[0]
    model_type = spec_named(family).model_types[0]
    found: list[str] = []
    for name in dir(auto):
        table = getattr(auto, name)
        if name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES") and \
                isinstance(table, dict) and isinstance(table.get(model_type), str):
            found.append(table[model_type])
    return sorted({c for c in found if c.startswith(prefix)})


def _sizes():
    from rotviz.arch import Sizes

    return Sizes(**{k: v for k, v in SIZES.items() if k != "labels"}, labels=10)


# Tensors older transformers versions saved beside the weights, by family (read past now)
def _legacy(family: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    layers = sorted({int(m.group(1)) for k in state for m in [re.search(r"\.(\d+)\.", k)] if m})
    blocks = {re.sub(r"\.\d+\..*", "", k) for k in state if re.search(r"\.\d+\.", k)}
    out: dict[str, torch.Tensor] = {}
    mask = torch.tril(torch.ones(16, 16, dtype=torch.bool)).view(1, 1, 16, 16)
    if family in ("bert", "roberta", "deberta-v2"):
        emb = next(k for k in state if k.endswith("embeddings.word_embeddings.weight"))
        out[emb.replace("word_embeddings.weight", "position_ids")] = torch.arange(32)[None]
    if family == "electra":  # BERT's position ids, saved until transformers 4.31
        out["electra.embeddings.position_ids"] = torch.arange(32)[None]
    for base in blocks:
        for i in layers:
            p = f"{base}.{i}."
            if family == "gpt2":
                out[p + "attn.bias"] = mask
                out[p + "attn.masked_bias"] = torch.tensor(-1e4)
            elif family == "gpt-neox":
                out[p + "attention.rotary_emb.inv_freq"] = torch.ones(2)
                out[p + "attention.bias"] = mask
                out[p + "attention.masked_bias"] = torch.tensor(-1e9)
            elif family in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3"):
                out[p + "self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    return out


def _cells() -> list[tuple[str, str, str]]:
    cells = []
    for family in FAMILIES:
        cells += [(family, "today", ""), (family, "bin", "")]
        if family not in ("vit", "timm-vit"):
            cells.append((family, "old", ""))
        own = random_config(family, _sizes()).get("architectures", [""])[0]
        cells += [(family, "head", c) for c in head_classes(family) if c != own]
    if "timm-vit" in FAMILIES:
        cells.append(("timm-vit", "headless", ""))
    return cells


CELLS = _cells()


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> str:
    """Plain text for the language-model heads (rotviz's characters)."""
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text("def f(x):\n    return x + 1\n" * 200)
    return f"text:{path}"


def _save(family: str, fmt: str, head: str, folder: Path) -> Path:
    """The cell's checkpoint folder, as transformers (or timm) saves it."""
    options = _options(family, head)
    sizes = {k: v for k, v in SIZES.items() if k != "labels"}
    if family == "timm-vit" and fmt == "headless":
        save_random(family, folder, **sizes)
        cfg = json.loads((folder / "config.json").read_text())
        cfg["num_classes"] = 0
        state = {k: v for k, v in load_file(folder / "model.safetensors").items()
                 if not k.startswith("head.")}
        save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(cfg))
        return folder
    save_random(family, folder, **sizes, **options)
    if fmt in ("old", "bin"):
        state = load_file(folder / "model.safetensors")
        if fmt == "old":
            state |= _legacy(family, state)
        (folder / "model.safetensors").unlink()
        if fmt == "bin":
            torch.save(state, folder / "pytorch_model.bin")
        else:
            save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def _options(family: str, head: str) -> dict:
    """random_model's options of a cell: its head class, ten labels for images (digits), 64
    positions for text (rotviz's text windows)."""
    options: dict = {"head": head} if head else {}
    if head.endswith("ForQuestionAnswering"):  # an answer's start and end
        options |= dict(labels=2)
    if spec_named(family).inputs == "pixels":
        return options | dict(labels=10)
    return options | dict(positions=64)


def _one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text and text, text
    return text


@pytest.mark.parametrize(("family", "fmt", "head"), CELLS,
                         ids=[f"{f}-{fmt}-{h or 'default'}" for f, fmt, h in CELLS])
def test_cell_loads_recovers_a_planted_element_and_keeps_every_output(
        family, fmt, head, tmp_path, text_file):
    folder = _save(family, fmt, head, tmp_path / "model")
    model = load_model(folder, dtype=F64)
    kind = head_of_config(model.config).kind
    if fmt == "old":  # the old buffers are read past; the function is the clean one's
        assert not any(k.endswith(("position_ids", "inv_freq", "masked_bias")) for k in
                       model.state if k not in dict(model.model.state_dict()))
    view = read_view(model.spec, model.config, model.state)
    element = random_element(view.dims, seed=7, heads=True)
    planted = replace(model, ref="planted", state=write_state(apply(view, element)))
    assert max_output_diff(model, model.state, planted.state) <= 1e-4  # every output kept
    assert distances(read_view(model.spec, model.config, planted.state), view).total > 0.1
    out = match_models(model, planted, MatchOptions(heads=True))
    assert out.preserved and out.report.max_output_diff <= 1e-4
    back = read_view(model.spec, model.config, out.state)
    assert distances(back, view).total / norm(view) <= 1e-5

    # the check sees each head: a change to any parameter outside the body moves it (the
    # next-sentence head of a pre-training model, a headless model's pooler, ...)
    _, body = body_patterns(model.spec)
    for k, _ in model.model.named_parameters():  # owners only: a tied alias is not run
        if not body.match(k) and not k.endswith("mask_token"):  # used on masked inputs only
            nudged = {**model.state, k: model.state[k] + 0.5}
            assert max_output_diff(model, model.state, nudged) > 1e-3, k

    # a measurement of the loss on the matched pair: a number on a head rotviz scores (a flat
    # path: one function), else one line
    data = "digits" if model.spec.inputs == "pixels" else text_file
    ends = from_matched(model, planted, out, MatchOptions(heads=True))
    try:
        from rotviz.data.reading import split_for

        split = split_for(model, data, "test")
        curve = measure("barrier", ends, split, points=3)
    except RotvizError as e:
        line = _one_line(e)
        assert kind not in ("causal-lm", "masked-lm", "pretraining", "image-cls"), line
    else:
        assert kind in ("causal-lm", "masked-lm", "pretraining", "image-cls")
        assert all(math.isfinite(x) for x in curve.loss)
        assert curve.barrier == pytest.approx(0.0, abs=1e-6)  # a planted copy: one function
    spectra = measure("spectra", ends)
    assert spectra.max_circuit_change <= 1e-6  # the circuits W_Q^T W_K, W_O W_V are kept


# ---- every measurement from the command line, on one model of each kind of head --------------


def _kinds() -> list[tuple[str, str]]:
    """One (family, class) per kind of head that the measurements' own tests do not feed
    (language models, classifiers of text and images are: test_tasks, test_landscape, ...):
    pre-training heads, and the heads no loss scores. The first family that offers it."""
    seen: dict[str, tuple[str, str]] = {}
    for family, fmt, head in CELLS:
        if fmt not in ("today", "head"):
            continue
        found = head_of_config({"architectures": [head]} if head else
                               random_config(family, _sizes()))
        if found.kind == "pretraining" or not found.scored:
            seen.setdefault(found.kind, (family, head))
    return sorted(seen.values())


KINDS = _kinds()


@pytest.mark.parametrize(("family", "head"), KINDS, ids=[f"{f}-{h or 'default'}" for f, h in KINDS])
def test_every_command_gives_a_number_or_one_line(family, head, tmp_path, text_file, capfd,
                                                  monkeypatch):
    a = _save(family, "today", head, tmp_path / "a")
    b = tmp_path / "b"
    save_random(family, b, seed=1, **{k: v for k, v in SIZES.items() if k != "labels"},
                **_options(family, head))
    monkeypatch.chdir(tmp_path)
    data = "digits" if spec_named(family).inputs == "pixels" else text_file
    small = {"barrier": ["--points", "3"], "plane": ["--grid", "3"],
             "merge_sweep": ["--points", "3"], "layerwise": ["--points", "3"],
             "slice": ["--grid", "3", "--dims", "1"], "sweeps": ["--points", "3"],
             "hessian": ["--top", "1", "--iterations", "3", "--examples", "16"],
             "bend": ["--steps", "2", "--points", "3"],
             "sharpness": ["--points", "3", "--iterations", "3", "--examples", "16"],
             "flat": ["--per-layer", "1", "--examples", "16", "--curvature", "no"],
             "rounds": ["--points", "3"],
             "teleport": ["--steps", "2", "--examples", "16", "--trace-probes", "2",
                          "--iterations", "3"],
             "teleport_train": ["--steps", "4", "--every", "2", "--eval-every", "2",
                                "--teleport-examples", "16"]}
    ran = 0
    commands = [(m.name, [m.name, str(a)] + ([str(b)] if m.pair else []) +
                 (["--data", data] if m.data else []) + small.get(m.name, []))
                for m in measurements() if m.inputs is None]  # series, N models: own tests
    commands += [("match", ["match", str(a), str(b), "--out", "matched"]),
                 ("eval", ["eval", str(a), "--data", data])]
    for name, argv in commands:
        capfd.readouterr()
        rc = main(argv)
        out, err = capfd.readouterr()
        assert "Traceback" not in err, (name, err)
        assert rc in (0, 2), (name, rc, err)
        if rc == 2:
            lines = [x for x in err.splitlines() if x.strip()]
            assert len(lines) == 1 and lines[0].startswith("rotviz: error:"), (name, err)
        else:
            assert re.search(r"\d\.\d", out), (name, out)
            ran += 1
    assert (tmp_path / "matched" / "config.json").exists()  # matching runs on every head
    views = 1 + sum(1 for m in measurements() if m.inputs is None and not m.data)
    if head_of_config(load_model(a).config).scored:
        assert ran > views  # a scored head's losses are measured too
    else:
        assert ran == views  # distances and spectra: the views of the weights


# ---- a MultiBERTs-shaped pair: two pre-training checkpoints of different seeds -----------------


@pytest.fixture(scope="module")
def multiberts(tmp_path_factory) -> tuple[Path, Path]:
    """Two BertForPreTraining models (masked-LM and next-sentence heads) of two seeds, reading
    the shipped pystdlib text as characters."""
    root = tmp_path_factory.mktemp("multiberts")
    sizes = dict(layers=2, d=32, heads=4, ffn=64, vocab=VOCAB_SIZE, positions=64,
                 head="BertForPreTraining")
    return (save_random("bert", root / "seed0", seed=0, **sizes),
            save_random("bert", root / "seed1", seed=1, **sizes))


def test_multiberts_pair_gives_a_masked_lm_barrier_from_the_command_line(
        multiberts, tmp_path, capsys):
    """The masked-LM loss of a pre-training checkpoint is its MLM head's, as transformers'
    BertForMaskedLM computes it from the same weights; the CLI's barriers, with and without
    matching, are the library's numbers."""
    import transformers as T

    from rotviz.data.reading import split_for
    from rotviz.evaluation import evaluate

    a, b = (load_model(p) for p in multiberts)
    split = split_for(a, "pystdlib", "test")
    assert split.task == "masked" and head_of_config(a.config).kind == "pretraining"
    part = split.subset(128)
    ours = evaluate(a, part)
    reference = T.BertForMaskedLM.from_pretrained(multiberts[0]).eval()
    with torch.no_grad():
        total = count = 0.0
        for x, y in part.batches(64):
            n = int((y != -100).sum())
            total += float(reference(input_ids=x, labels=y).loss) * n
            count += n
    assert ours["loss"] == pytest.approx(total / count, rel=1e-5)

    whole = evaluate(a, split)["loss"]  # the anchor's end of both paths (computed once)
    mids = []  # the masked-LM loss halfway, unmatched and matched
    for spec in ("none", "seed"):
        js = tmp_path / f"{spec}.json"
        assert main(["barrier", str(multiberts[0]), str(multiberts[1]), "--data", "pystdlib",
                     "--points", "3", "--match", spec, "--json", str(js)]) == 0
        got = json.loads(js.read_text())
        ends = (from_matched(a, b, None, None) if spec == "none"
                else match_endpoints(a, b, spec))
        want = measure("barrier", ends, split, points=3)
        assert got["loss"] == pytest.approx(want.loss, abs=1e-9)
        assert got["barrier"] == pytest.approx(want.barrier, abs=1e-9)
        mids.append(got["loss"][1])
        assert got["loss"][0] == pytest.approx(whole, rel=1e-6)
    assert abs(mids[0] - mids[1]) > 1e-4  # matching moved the path
    assert "barrier [seed]" in capsys.readouterr().out


def test_two_heads_of_one_body_match_on_what_they_share(multiberts, tmp_path, capsys):
    """A pre-training checkpoint against a classifier of another seed (and a headless
    model): matching aligns the shared body, moves the source's own head with it (its
    function kept), leaves the anchor's alone, and says so; a loss measurement refuses."""
    cls = save_random("bert", tmp_path / "cls", seed=2, layers=2, d=32, heads=4, ffn=64,
                      vocab=VOCAB_SIZE, positions=64)
    bare = save_random("bert", tmp_path / "bare", seed=3, layers=2, d=32, heads=4, ffn=64,
                       vocab=VOCAB_SIZE, positions=64, head="BertModel")
    pre = multiberts[0]
    report = tmp_path / "r.json"
    assert main(["match", str(pre), str(cls), "--match", "seed,heads", "--out",
                 str(tmp_path / "m"), "--report", str(report)]) == 0
    said = capsys.readouterr().out
    assert "heads differ (BertForPreTraining vs BertForSequenceClassification)" in said
    heads = json.loads(report.read_text())["different_heads"]
    assert heads["source_only"] == ["classifier.weight", "classifier.bias"]
    assert "cls.seq_relationship.weight" in heads["anchor_only"]
    assert heads["matched"] == 39 and "bert.pooler.dense.weight" in \
        heads["matched_outside_blocks"]
    written = load_model(tmp_path / "m")
    source = load_model(cls)
    assert max_output_diff(source, source.state, written.state) <= 1e-4
    anchor = load_model(pre)
    before = json.loads(report.read_text())["distance_before"]["total"]
    after = json.loads(report.read_text())["distance_after"]["total"]
    assert after < before
    # the reported distance is over the tensors both hold, recomputed here by name
    shared = [k for k in source.state if k in anchor.state]
    assert len(shared) == 39
    direct = sum(float(((written.state[k].double() - anchor.state[k].double()) ** 2).sum())
                 for k in shared) ** 0.5
    assert direct == pytest.approx(after, rel=1e-6)

    # a headless anchor: its body sits at the top, the source's under bert.
    assert main(["match", str(bare), str(pre), "--out", str(tmp_path / "m2")]) == 0
    assert "heads differ (BertModel vs BertForPreTraining)" in capsys.readouterr().out
    assert main(["distances", str(pre), str(cls)]) == 0
    assert main(["barrier", str(pre), str(cls), "--data", "pystdlib"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "different heads" in err[0]


def test_a_stream_the_model_outputs_takes_no_residual_map(tmp_path, capsys):
    """A headless model's output is its residual stream: a map of the stream would change it,
    so weight matching's residual map is refused in one line, in memory and streamed; seed
    matching keeps every output."""
    a, b = (save_random("gpt2", tmp_path / f"g{s}", seed=s, layers=1, d=16, heads=2, ffn=32,
                        head="GPT2Model", tie=False) for s in (0, 1))
    for extra in ([], ["--max-memory", "0"]):
        assert main(["match", str(a), str(b), "--match", "weight", "--out",
                     str(tmp_path / "w"), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "its output is the residual stream itself" in err
        assert not (tmp_path / "w").exists()
    assert main(["match", str(a), str(b), "--out", str(tmp_path / "s")]) == 0
    source, out = load_model(b), load_model(tmp_path / "s")
    assert max_output_diff(source, source.state, out.state) <= 1e-4


def test_a_head_its_class_cannot_run_is_one_line(tmp_path, capsys):
    """A question-answering config with other than two labels (its head has the answer's start
    and end): refused in one line before transformers' forward fails, in memory and streamed."""
    qa = save_random("bert", tmp_path / "qa", layers=1, d=16, heads=2, ffn=32,
                     head="BertForQuestionAnswering")  # five labels
    for extra in ([], ["--max-memory", "0"]):
        assert main(["match", str(qa), str(qa), "--out", str(tmp_path / "o"), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "question-answering model with 5 labels" in err, err

"""Plumbing must not turn right models into wrong numbers.

- Image class folders are read by name through the model's id2label: a trained ViT whose
  labels are `zero..nine` (ids in digit order, names not in sorted order) must score on
  folders named `zero..nine` what an independent loop with the right labels scores, and the
  split must not depend on the folders' names (folders `0..9` for the unnamed model: the
  same images, labels and numbers). Folders that are not the model's labels: one line.
- A folder's tokenizer.json is the truth: the tokenizer rotviz uses must encode as that file
  does (a Qwen2 folder whose tokenizer.json is a Unigram model is read wrongly by
  AutoTokenizer in transformers 5), and the loss must equal a loop with the file's ids.
- Rows whose text or label is null, a number where text is wanted, a list or an object are
  refused in one line naming the file and the row.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rotviz.cli import main
from rotviz.data.images import digits_arrays
from rotviz.data.reading import split_for
from rotviz.data.splits import tenth_split
from rotviz.data.tasks import named_labels
from rotviz.errors import RotvizError
from rotviz.evaluation import evaluate
from rotviz.sources.loading import load_model

ZOO = Path(__file__).resolve().parent.parent / "rotviz" / "assets" / "zoo"
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
PER_CLASS = 30  # images per digit: 300 in all, 30 in the test split


def _one_line(capfd) -> str:
    err = capfd.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


def _named_copy(src: Path, dst: Path, names: tuple[str, ...] | None) -> Path:
    """The zoo model's config and weights, with id2label / label2id set to `names`."""
    dst.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(src / name, dst / name)
    if names is not None:
        config = json.loads((dst / "config.json").read_text())
        config["id2label"] = {str(i): n for i, n in enumerate(names)}
        config["label2id"] = {n: i for i, n in enumerate(names)}
        (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """Trained vit-digits models (s3 with named labels, as it is, and s6 named) and the
    same digit images in folders named `zero..nine`, `0..9`, and `cat`, `dog`."""
    from PIL import Image

    root = tmp_path_factory.mktemp("digits")
    pixels, target = digits_arrays()
    images = {d: np.flatnonzero(target == d)[:PER_CLASS] for d in range(10)}
    for d, rows in images.items():
        for folder in (root / "named" / WORDS[d], root / "numbered" / str(d)):
            folder.mkdir(parents=True)
            for k, i in enumerate(rows):
                a = np.round(pixels[i].reshape(8, 8) * 255 / 16).astype(np.uint8)
                # file names that do not sort like the rows: the split orders by file name
                Image.fromarray(a, "L").save(folder / f"{(k * 7) % PER_CLASS:03d}-{i}.png")
    for name in ("cat", "dog"):
        shutil.copytree(root / "numbered" / "0", root / "pets" / name)
    return {
        "root": root,
        "named": _named_copy(ZOO / "vit-digits-s3", root / "s3-named", WORDS),
        "plain": _named_copy(ZOO / "vit-digits-s3", root / "s3-plain", None),
        "named6": _named_copy(ZOO / "vit-digits-s6", root / "s6-named", WORDS),
        "sorted6": _named_copy(ZOO / "vit-digits-s6", root / "s6-sorted", tuple(sorted(WORDS))),
        "letters6": _named_copy(ZOO / "vit-digits-s6", root / "s6-letters", tuple("abcdefghij")),
    }


def _reference(model_dir: Path, folder: Path, names: list[str]) -> tuple[float, float, float]:
    """(accuracy, loss, accuracy had the folders been numbered in sorted order) of the test
    split, computed here: files by (digit, file name), rotviz's seeded tenth, pixels / 255,
    the model run by transformers itself."""
    import transformers as T
    from PIL import Image

    files = sorted(((f, d) for d, n in enumerate(names) for f in (folder / n).iterdir()),
                   key=lambda fd: (fd[1], fd[0].name))
    idx = tenth_split(len(files), 0)["test"]
    x = torch.tensor(np.stack([np.asarray(Image.open(files[i][0]), dtype=np.float32) / 255.0
                               for i in idx]))[:, None]
    y = torch.tensor([files[i][1] for i in idx])
    model = T.ViTForImageClassification.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        logits = model(pixel_values=x).logits
    pred = logits.argmax(-1)
    by_sort = torch.tensor([sorted(names).index(names[d]) for d in y.tolist()])
    return (float((pred == y).double().mean()),
            float(torch.nn.functional.cross_entropy(logits, y)),
            float((pred == by_sort).double().mean()))


def test_named_labels_reads_id2label_and_treats_placeholders_as_unnamed():
    assert named_labels({"id2label": {"1": "b", "0": "a"}}, "m") == ("a", "b")
    assert named_labels({"id2label": {0: "LABEL_0", 1: "LABEL_1"}}, "m") is None
    assert named_labels({}, "m") is None
    for bad, says in (({"0": "a", "2": "b"}, "has the ids [0, 2], not 0..1"),
                      ({"0": "a", "1": "a"}, "names 'a' for more than one id"),
                      ({"x": "a"}, "has the id 'x'"), (["a", "b"], "is a list")):
        with pytest.raises(RotvizError,
                           match=f"^m: config id2label {re.escape(says)}.*config.json$"):
            named_labels({"id2label": bad}, "m")


def test_class_folders_are_read_by_name(digits, tmp_path, capfd):
    root = digits["root"]
    acc, loss, by_sort = _reference(digits["named"], root / "named", list(WORDS))
    assert acc > 0.8 and by_sort < 0.3  # the wrong reading would show
    out = tmp_path / "eval.json"
    assert main(["eval", str(digits["named"]), "--data", f"imagefolder:{root / 'named'}",
                 "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["n"] == 30
    assert got["acc"] == pytest.approx(acc, abs=1e-9)
    assert got["loss"] == pytest.approx(loss, abs=1e-6)
    # the unnamed model on folders 0..9: the same images, split and labels, so the same numbers
    plain = load_model(str(digits["plain"]))
    named = load_model(str(digits["named"]))
    a = split_for(named, f"imagefolder:{root / 'named'}", "test")
    b = split_for(plain, f"imagefolder:{root / 'numbered'}", "test")
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert a.label_names == WORDS and b.label_names == tuple(map(str, range(10)))
    again = evaluate(plain, b)
    assert again["acc"] == pytest.approx(acc, abs=1e-9)
    assert again["loss"] == pytest.approx(loss, abs=1e-6)
    # the train split is read the same way (datamatch and merges take it through `sibling`)
    assert torch.equal(a.sibling("train").labels, b.sibling("train").labels)


def test_folders_that_are_not_the_models_labels_are_refused(digits, tmp_path, capfd):
    root = digits["root"]
    out = tmp_path / "eval.json"
    capfd.readouterr()
    assert main(["eval", str(digits["named"]), "--data", f"imagefolder:{root / 'pets'}",
                 "--json", str(out)]) == 2
    line = _one_line(capfd)
    assert f"'{root / 'pets'}'" in line
    assert "folders with no label: cat, dog;" in line
    assert "labels with no folder: zero, one, two, three, four, five and 4 more" in line
    assert line.endswith("name one class folder after each label of the model's config.json "
                         "id2label")
    assert not out.exists()
    # numbered folders for a model that names its labels: by place would be a guess
    assert main(["eval", str(digits["named"]), "--data", f"imagefolder:{root / 'numbered'}"]
                ) == 2
    assert "folders with no label: 0, 1, 2, 3, 4, 5 and 4 more;" in _one_line(capfd)


def test_a_pairs_barrier_reads_labels_by_name(digits, tmp_path, capfd):
    root = digits["root"]
    data = f"imagefolder:{root / 'named'}"
    out = tmp_path / "barrier.json"
    refs = {m: _reference(digits[m], root / "named", list(WORDS)) for m in ("named", "named6")}
    for streamed in ([], ["--max-memory", "0"]):  # in memory, and block by block
        assert main(["barrier", str(digits["named"]), str(digits["named6"]), "--data", data,
                     "--points", "3", "--match", "none", "--json", str(out), "--overwrite",
                     *streamed]) == 0
        curve = json.loads(out.read_text())
        for end, model in ((0, "named"), (-1, "named6")):
            acc, loss, _ = refs[model]
            assert acc > 0.8
            assert curve["acc"][end] == pytest.approx(acc, abs=1e-9)
            assert curve["loss"][end] == pytest.approx(loss, abs=1e-6)
    # a source that names its outputs in another order cannot share the anchor's labels
    out.unlink()
    for streamed in ([], ["--max-memory", "0"]):
        capfd.readouterr()
        assert main(["barrier", str(digits["named"]), str(digits["sorted6"]), "--data", data,
                     "--points", "3", "--match", "none", "--json", str(out), *streamed]) == 2
        line = _one_line(capfd)
        assert line.startswith(f"rotviz: error: '{digits['named']}' and '{digits['sorted6']}'"
                               " order their labels differently (zero, one, two, three, four, "
                               "five, ... vs eight, five, four, nine, one, seven, ...)"), line
        assert not out.exists()
    # other label sets (fine-tunes for two tasks whose bodies are compared) pass, as before
    from rotviz.sources.pairs import check_compatible

    check_compatible(load_model(str(digits["named"])), load_model(str(digits["letters6"])))
    # a split read through one model's names is refused by a model that orders them otherwise
    split = split_for(load_model(str(digits["named"])), data, "test")
    with pytest.raises(RotvizError, match=f"^'{re.escape(data)}' was labelled in the order "
                       "zero, one, two, three, four, five, ... but .*s6-sorted names its "
                       "outputs eight, five, four, nine, one, seven, ...; compare models"):
        evaluate(load_model(str(digits["sorted6"])), split)


# ---- tokenizers ---------------------------------------------------------------------------

SAMPLES = ("def f(x):\n    return x + 12  # héllo", "Привет, мир 2024!", "   spaces\tand\ttabs",
           "東京 <eos> naïve café", "")


def _unigram(text: str):
    """A Unigram tokenizer trained here, offline, as a Qwen2 folder might carry one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(text.splitlines(), trainers.UnigramTrainer(
        vocab_size=128, special_tokens=["<pad>", "<unk>", "<eos>"], unk_token="<unk>",
        show_progress=False))
    return tok


def _trained_qwen2(src: Path, dst: Path, tok, text: str, seed: int, steps: int) -> Path:
    """The tiny random Qwen2 at `src`, trained a little on `text` read by `tok` (so that its
    own tokenizer's ids score well and other ids do not), saved with the tokenizer."""
    import transformers as T

    model = T.Qwen2ForCausalLM.from_pretrained(str(src))
    ids = torch.tensor(tok.encode(text).ids)
    n = (len(ids) - 1) // 32
    x, y = ids[: n * 32].reshape(n, 32), ids[1 : n * 32 + 1].reshape(n, 32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        b = torch.randint(0, n, (8,), generator=gen)
        logits = model(input_ids=x[b]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y[b].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().save_pretrained(str(dst))
    config = json.loads((dst / "config.json").read_text())
    config.pop("rotviz_vocab", None)  # the tokenizer, not rotviz's characters
    (dst / "config.json").write_text(json.dumps(config))
    tok.save(str(dst / "tokenizer.json"))
    (dst / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>", "model_max_length": 64}))
    return dst


@pytest.fixture(scope="module")
def qwen(saved, tmp_path_factory):
    from rotviz.data.text import pystdlib_text

    root = tmp_path_factory.mktemp("qwen")
    text = pystdlib_text()[:40_000]
    (root / "text.txt").write_text(text, encoding="utf-8")
    tok = _unigram(text)
    src0 = saved("qwen2", 0, vocab=128, positions=64)
    src1 = saved("qwen2", 1, vocab=128, positions=64)
    return {"root": root, "data": f"text:{root / 'text.txt'}", "tok": tok,
            "a": _trained_qwen2(src0, root / "a", tok, text, 0, 80),
            "b": _trained_qwen2(src1, root / "b", tok, text, 1, 40)}


def _lm_reference(folder: Path, data: str, ids: list[int]) -> tuple[float, float]:
    """(loss, next-token accuracy) of the test windows of `ids`, computed here: 64-token
    windows, rotviz's seeded tenth, the model run by transformers itself."""
    import transformers as T

    t = torch.tensor(ids)
    n = (len(t) - 1) // 64
    x, y = t[: n * 64].reshape(n, 64), t[1 : n * 64 + 1].reshape(n, 64)
    idx = torch.as_tensor(tenth_split(n, 0)["test"])
    model = T.Qwen2ForCausalLM.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        logits = model(input_ids=x[idx]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(),
                                             y[idx].reshape(-1))
    return float(loss), float((logits.argmax(-1) == y[idx]).double().mean())


def test_a_qwen2_folder_is_read_with_its_own_tokenizer_json(qwen, tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from rotviz.data.tokens import text_encoding

    a = qwen["a"]
    own = Tokenizer.from_file(str(a / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(str(a), local_files_only=True)
    text = (qwen["root"] / "text.txt").read_text(encoding="utf-8")
    want = own.encode(text, add_special_tokens=False).ids
    wrong = auto(text, add_special_tokens=False)["input_ids"]
    assert wrong != want, "transformers now reads this tokenizer.json: the case needs another"
    reader = text_encoding(a, json.loads((a / "config.json").read_text()), str(a))
    for sample in (*SAMPLES, text[:2000]):
        assert reader.encode(sample).tolist() == own.encode(
            sample, add_special_tokens=False).ids, sample
    assert reader.tokenizer.pad_token == "<pad>" and reader.tokenizer.eos_token == "<eos>"
    assert reader.vocab_size == own.get_vocab_size() == 128
    out = tmp_path / "eval.json"
    assert main(["eval", str(a), "--data", qwen["data"], "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    loss, acc = _lm_reference(a, qwen["data"], want)
    bad_loss, bad_acc = _lm_reference(a, qwen["data"], wrong)
    assert acc > bad_acc + 0.1 and loss < bad_loss - 0.5  # the case shows the difference
    assert got["loss"] == pytest.approx(loss, abs=1e-6)
    assert got["acc"] == pytest.approx(acc, abs=1e-9)


def test_a_pair_with_the_same_tokenizer_files_reads_alike(qwen, tmp_path):
    from tokenizers import Tokenizer

    from rotviz.data.tokens import encoding_fingerprint

    a, b = qwen["a"], qwen["b"]
    config = json.loads((a / "config.json").read_text())
    assert encoding_fingerprint(a, config, "a") == encoding_fingerprint(b, config, "b")
    ids = Tokenizer.from_file(str(a / "tokenizer.json")).encode(
        (qwen["root"] / "text.txt").read_text(encoding="utf-8"), add_special_tokens=False).ids
    out = tmp_path / "barrier.json"
    assert main(["barrier", str(a), str(b), "--data", qwen["data"], "--points", "3",
                 "--match", "none", "--json", str(out)]) == 0
    curve = json.loads(out.read_text())
    for end, folder in ((0, a), (-1, b)):
        loss, acc = _lm_reference(folder, qwen["data"], ids)
        assert curve["loss"][end] == pytest.approx(loss, abs=1e-6)
        assert curve["acc"][end] == pytest.approx(acc, abs=1e-9)


def test_a_tokenizer_that_cannot_be_made_to_agree_is_refused(qwen, tmp_path, monkeypatch,
                                                              capfd):
    import rotviz.data.tokens

    # the file's own tokenizer, as if transformers could not wrap it faithfully either
    monkeypatch.setattr(rotviz.data.tokens, "_wrapped", lambda own, path, confined: None)
    out = tmp_path / "eval.json"
    capfd.readouterr()
    assert main(["eval", str(qwen["a"]), "--data", qwen["data"], "--json", str(out)]) == 2
    assert _one_line(capfd) == (
        f"rotviz: error: the tokenizer saved in '{qwen['a']}' does not encode text as its "
        "tokenizer.json does, and the file's own tokenizer cannot be used in its place; save "
        "it again with tokenizer.save_pretrained")
    assert not out.exists()


def test_an_unreadable_tokenizer_json_is_one_line(qwen, tmp_path):
    from rotviz.data.tokens import file_tokenizer

    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"type": "Nope"}}')
    with pytest.raises(RotvizError, match=f"^cannot read the tokenizer file '{re.escape(str(bad))}"
                       r"' \(.*\); save the tokenizer again with tokenizer.save_pretrained$"):
        file_tokenizer(bad)


# ---- rows of labelled files -----------------------------------------------------------------

TOPICS = ZOO / "roberta-topics-a"  # a sequence classifier (asyncio, email, http, ...)
TAGGER = ZOO / "roberta-pytokens-a"  # a token classifier (B-KW, B-NAME, ...)
GOOD = [{"text": f"Return the message number {i} of this logger.", "label": "logging"}
        for i in range(30)]
GOOD_TAGS = [{"tokens": ["x", "=", str(i)], "ner_tags": ["B-NAME", "B-OP", "B-NUM"]}
             for i in range(30)]


def _jsonl(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return f"jsonl:{path}"


def _refused(argv: list[str], out: Path, capfd) -> str:
    """The command's one line: exit 2, nothing written."""
    capfd.readouterr()
    assert main([*argv, "--json", str(out)]) == 2, argv
    assert not out.exists()
    return _one_line(capfd)


def test_the_good_rows_evaluate(tmp_path):
    """The rows the cases below put around their one bad row evaluate (so each refusal is the
    bad row's): one eval, which each case ran alike before."""
    out = tmp_path / "eval.json"
    ok = _jsonl(tmp_path / "ok.jsonl", GOOD)
    assert main(["eval", str(TOPICS), "--data", ok, "--split", "train", "--json", str(out)]
                ) == 0


@pytest.mark.parametrize("bad, column, said", [
    ({"text": None, "label": "http"}, "text", "null"),
    ({"text": {"a": 1}, "label": "http"}, "text", "an object"),
    ({"text": 12, "label": "http"}, "text", "a number (12)"),
    ({"text": ["a", "b"], "label": "http"}, "text", "a list"),
    ({"text": True, "label": "http"}, "text", "a boolean (true)"),
    ({"text": "fine", "label": None}, "label", "null"),
    ({"text": "fine", "label": {"name": "http"}}, "label", "an object"),
    ({"text": "fine", "label": 2.0}, "label", "a number (2.0)"),
    ({"text": "fine", "label": ["http"]}, "label", "a list"),
])
def test_jsonl_rows_of_the_wrong_type_are_refused(tmp_path, capfd, bad, column, said):
    out = tmp_path / "eval.json"  # GOOD itself evaluates: test_the_good_rows_evaluate
    data = _jsonl(tmp_path / "rows.jsonl", [*GOOD[:6], bad, *GOOD[6:]])
    want = "text (a string)" if column == "text" else "a label name or id"
    # refused whichever split the row falls in, by its row in the file
    for split in ("train", "test"):
        assert _refused(["eval", str(TOPICS), "--data", data, "--split", split], out, capfd) == (
            f"rotviz: error: '{data}' row 7: column '{column}' is {said}, not {want}; fix the "
            "row or leave it out")


def test_csv_rows_with_missing_or_extra_fields_are_refused(tmp_path, capfd):
    out = tmp_path / "eval.json"
    rows = "text,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in GOOD)
    short = tmp_path / "short.csv"
    short.write_text(rows + "only a text\n", encoding="utf-8")
    assert _refused(["eval", str(TOPICS), "--data", f"csv:{short}"], out, capfd) == (
        f"rotviz: error: 'csv:{short}' row 31: column 'label' is missing (the row has fewer "
        "fields than its header), not a label name or id; fix the row or leave it out")
    extra = tmp_path / "extra.csv"
    extra.write_text("label,text\n" + "".join(f"{r['label']},{r['text']}\n" for r in GOOD[:3])
                     + "http,Send a request, then wait\n", encoding="utf-8")
    assert _refused(["eval", str(TOPICS), "--data", f"csv:{extra}"], out, capfd) == (
        f"rotviz: error: '{extra}' row 4 has 1 more field(s) than its header (from ' then "
        "wait'); quote a field that holds a comma")
    # empty trailing fields (as spreadsheets save them) are not text: read as before
    trailing = tmp_path / "trailing.csv"
    trailing.write_text("text,label\n" + "".join(f"{r['text']},{r['label']},,\n" for r in GOOD),
                        encoding="utf-8")
    assert main(["eval", str(TOPICS), "--data", f"csv:{trailing}", "--json", str(out)]) == 0


def test_tagged_rows_of_the_wrong_type_are_refused(tmp_path, capfd):
    out = tmp_path / "eval.json"
    for bad, said in (({"tokens": ["x", None], "ner_tags": ["B-NAME", "B-OP"]},
                       "'tokens' is a list holding null, not a list of words (strings)"),
                      ({"tokens": "x =", "ner_tags": ["B-NAME", "B-OP"]},
                       "'tokens' is the string 'x =', not a list of words (strings)"),
                      ({"tokens": ["x", "="], "ner_tags": ["B-NAME", {"t": 1}]},
                       "'ner_tags' is a list holding an object, not a list of tags (label "
                       "names or ids)")):
        data = _jsonl(tmp_path / "tags.jsonl", [*GOOD_TAGS[:2], bad, *GOOD_TAGS[2:]])
        assert _refused(["eval", str(TAGGER), "--data", data], out, capfd) == (
            f"rotviz: error: '{data}' row 3: column {said}; fix the row or leave it out")


def test_parquet_rows_are_checked_by_their_split(tmp_path, capfd):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "pq").mkdir()
    pq.write_table(pa.Table.from_pylist(GOOD), tmp_path / "pq" / "train-00000.parquet")
    pq.write_table(pa.Table.from_pylist([*GOOD[:4], {"text": None, "label": "xml"}]),
                   tmp_path / "pq" / "test-00000.parquet")
    out = tmp_path / "eval.json"
    data = f"hf:{tmp_path / 'pq'}"
    assert _refused(["eval", str(TOPICS), "--data", data, "--split", "train"], out, capfd) == (
        f"rotviz: error: '{data}' (test split) row 5: column 'text' is null, not text (a "
        "string); fix the row or leave it out")


def test_regression_and_multi_label_values_are_checked():
    from rotviz.data.labelled import Columns, Labelling, check_rows

    reg = Labelling("regression", ("LABEL_0",), 0, 8, Columns(label="score"))
    # fine here (two values for a one-output head are refused where the labels are made)
    check_rows([{"text": "a", "score": 1.5}, {"text": "b", "score": "-2e3"},
                {"text": "c", "score": [1, 2]}], reg, "'f'", "jsonl")
    for value, said in (("nan", "the string 'nan'"), (float("inf"), "a number (inf)"),
                        (True, "a boolean (true)"), ([1, None], "a list holding null"),
                        ("1.5.2", "the string '1.5.2'"), (None, "null")):
        with pytest.raises(RotvizError, match=re.escape(
                f"'f' row 2: column 'score' is {said}, not a finite number (or a list of "
                "them); fix the row or leave it out")):
            check_rows([{"text": "a", "score": 1}, {"text": "b", "score": value}], reg, "'f'",
                       "jsonl")
    multi = Labelling("multi-label", ("a", "b"), 0, 8, Columns(label="labels"))
    check_rows([{"text": "a", "labels": ["a", 1]}, {"text": "b", "labels": "a,b"}], multi,
               "'f'", "jsonl")
    with pytest.raises(RotvizError, match=re.escape(
            "'f' row 1: column 'labels' is a list holding a list, not label names or ids (or a "
            "list of them)")):
        check_rows([{"text": "a", "labels": [["a"]]}], multi, "'f'", "jsonl")
    pair = Labelling("seq-cls", ("a", "b"), 0, 8, Columns(pair="second"))
    with pytest.raises(RotvizError, match=re.escape(
            "'f' row 1: column 'second' is null, not text (a string)")):
        check_rows([{"text": "a", "second": None, "label": "a"}], pair, "'f'", "jsonl")

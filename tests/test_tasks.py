"""The task comes from the model's head: sequence classification (single-label,
multi-label, regression) and token classification, on the user's labelled files.

For every text family and every head, a random tiny model is saved with a tokenizer trained
here (`tokenizers`). rotviz's loss on a split must equal the model's own
`model(**batch, labels=...).loss` on a batch that an independent loop built with
`AutoTokenizer`; the commands must run on such pairs; F1 must equal scikit-learn's and
conlleval's definitions; bad data gets one line and exit 2.
"""

from __future__ import annotations

import csv
import json
import random
import re

import numpy as np
import pytest
import torch
from test_tokens import _bpe, _wordpiece

from rotviz.arch import FAMILIES as ALL_FAMILIES
from rotviz.arch import Sizes, family_module, spec_named
from rotviz.cli import main
from rotviz.data.labelled import Columns
from rotviz.data.reading import split_for, task_of
from rotviz.data.splits import IGNORE
from rotviz.data.tasks import class_f1, entities, entity_f1, task_of_config
from rotviz.errors import RotvizError
from rotviz.evaluation import evaluate
from rotviz.sources.loading import load_model

WORDS = "alpha beta gamma delta def class return import value list dict yield".split()
NAMES = ("neg", "pos", "mid")
TAGS = ("O", "B-KW", "I-KW", "B-NUM")
# every discovered text family (a new family file is covered without a line here)
FAMILIES = tuple(f for f in ALL_FAMILIES if spec_named(f).inputs == "tokens")
HEADS = ("seq-cls", "multi-label", "regression", "token-cls")


def _rows(n: int = 90, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ws = [rng.choice(WORDS) for _ in range(rng.randint(3, 10))]
        score = ws.count("alpha") + 2 * ws.count("def")
        tags = ["B-KW" if w in ("def", "class", "return", "import", "yield") else "O" for w in ws]
        tags = [("I-KW" if t == "B-KW" and j and tags[j - 1] != "O" else t)
                for j, t in enumerate(tags)]
        tags = ["B-NUM" if w == "alpha" else t for w, t in zip(ws, tags, strict=True)]
        rows.append({
            "text": " ".join(ws), "label": NAMES[score % 3],
            "labels": sorted({NAMES[score % 3], NAMES[len(ws) % 3]}),
            "score": float(score) / 3, "tokens": ws, "ner_tags": tags,
            "split": ("test", "val", "train", "train", "train")[i % 5],
        })
    return rows


def _base(family: str, vocab: int) -> dict:
    """The family's own random config (rotviz.arch.families) at this vocabulary, 64 tokens."""
    return family_module(family).random_config(Sizes(vocab=vocab), positions=64)


def _decoder(family: str) -> bool:
    """Causal language models get a byte-level BPE tokenizer, encoders a WordPiece one."""
    cfg = _base(family, 61)
    return task_of_config(spec_named(family).inputs, cfg) == "text"


def _config(family: str, vocab: int, head: str):
    """The family's random config with a classification head of `head`'s kind."""
    import transformers as T

    names = TAGS if head == "token-cls" else NAMES
    labels = dict(num_labels=1) if head == "regression" else dict(
        id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    if head == "multi-label":
        labels["problem_type"] = "multi_label_classification"
    cfg = _base(family, vocab)
    if spec_named(family).positions_after is not None:  # position ids start after the pad id
        cfg["max_position_embeddings"] = 66
    cfg |= dict(pad_token_id=0, architectures=[_head_class(family, head).__name__], **labels)
    return T.AutoConfig.for_model(**{k: v for k, v in cfg.items()
                                     if k not in ("id2label", "label2id", "num_labels")
                                     or k in labels})


def _head_name(family: str, head: str) -> str:
    """`<Family>ForSequenceClassification` / `...ForTokenClassification`, named after the
    family's own model class (GPT2LMHeadModel -> GPT2, LlamaForCausalLM -> Llama)."""
    model = _base(family, 61)["architectures"][0]
    prefix = re.split("For|LMHead", model)[0]
    kind = "TokenClassification" if head == "token-cls" else "SequenceClassification"
    return f"{prefix}For{kind}"


def _head_class(family: str, head: str):
    import transformers as T

    return getattr(T, _head_name(family, head))


def _offered(family: str, head: str) -> bool:
    """Whether transformers has the family's class for `head` (OLMo-2 has no token
    classifier). Read from the names transformers exports, not by importing the class: the
    parametrization below is computed when each pytest-xdist worker collects this file, and
    importing every family's modeling code there cost about 2 s of CPU in each."""
    import transformers as T

    return _head_name(family, head) in T.__all__


def _cases(heads) -> list[tuple[str, str]]:
    return [(f, h) for f in FAMILIES for h in heads if _offered(f, h)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("labelled")
    rows = _rows()
    with open(root / "rows.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    with open(root / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["sentence", "y", "split"])
        w.writeheader()
        w.writerows({"sentence": r["text"], "y": r["label"], "split": r["split"]} for r in rows)
    with open(root / "tags.conll", "w") as f:
        f.write("-DOCSTART- O\n\n")
        for r in rows:
            f.writelines(f"{w} X {t}\n" for w, t in zip(r["tokens"], r["ner_tags"], strict=True))
            f.write("\n")
    return root, rows


class _Models:
    """(family, head) -> the two seeds' folders, each saved with one tokenizer trained here
    when a test first asks for it (the multi-label and regression heads' seed 1 no test
    reads). The same model whatever the order: each is made right after its seed is set."""

    def __init__(self, root):
        self.root, self.toks, self.made = root, {}, {}

    def tokenizer(self, family: str):
        kind = "bpe" if _decoder(family) else "wordpiece"
        if kind not in self.toks:
            self.toks[kind] = _bpe() if kind == "bpe" else _wordpiece("[CLS]", "[SEP]")
        return self.toks[kind]

    def folder(self, family: str, head: str, seed: int):
        if (family, head, seed) not in self.made:
            tok = self.tokenizer(family)
            torch.manual_seed(seed)
            cfg = _config(family, len(tok), head)
            model = _head_class(family, head)(cfg).eval()
            d = self.root / f"{family}-{head}-{seed}"
            model.save_pretrained(d)
            tok.save_pretrained(d)
            self.made[family, head, seed] = d
        return self.made[family, head, seed]

    def __getitem__(self, key: tuple[str, str]) -> _Pair:
        return _Pair(self, *key)


class _Pair:
    """A (family, head)'s two folders, each made when first read."""

    def __init__(self, models: _Models, family: str, head: str):
        self.models, self.key = models, (family, head)

    def __getitem__(self, seed: int):
        if seed not in (0, 1):
            raise IndexError(seed)
        return self.models.folder(*self.key, seed)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(family, head) -> two seeds saved with one tokenizer trained here (made on demand)."""
    return _Models(tmp_path_factory.mktemp("heads"))


def _data(files, head: str) -> tuple[str, Columns]:
    root = files[0]
    if head == "token-cls":
        return f"jsonl:{root / 'rows.jsonl'}", Columns()
    label = {"seq-cls": "label", "multi-label": "labels", "regression": "score"}[head]
    return f"jsonl:{root / 'rows.jsonl'}", Columns(label=label)


def _reference_batch(folder, rows: list[dict], head: str, pad: int):
    """The test rows as an independent loop feeds them: AutoTokenizer, right padding."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if head != "token-cls":
        enc = tok([r["text"] for r in rows])
        labels = {"seq-cls": torch.tensor([NAMES.index(r["label"]) for r in rows]),
                  "multi-label": torch.tensor([[float(n in r["labels"]) for n in NAMES]
                                               for r in rows]),
                  "regression": torch.tensor([r["score"] for r in rows])}[head]
    else:
        try:
            enc = tok([r["tokens"] for r in rows], is_split_into_words=True)
        except (ValueError, TypeError, AssertionError):
            tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True,
                                                add_prefix_space=True)
            enc = tok([r["tokens"] for r in rows], is_split_into_words=True)
        labels = []
        for i, r in enumerate(rows):
            seen, row = set(), []
            for w in enc.word_ids(i):
                row.append(IGNORE if w is None or w in seen else TAGS.index(r["ner_tags"][w]))
                seen.add(w)
            labels.append(row)
    width = max(len(s) for s in enc["input_ids"])
    batch = {"input_ids": torch.tensor([s + [pad] * (width - len(s)) for s in enc["input_ids"]]),
             "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s))
                                             for s in enc["input_ids"]])}
    if "token_type_ids" in enc and "token_type_ids" in tok.model_input_names:
        batch["token_type_ids"] = torch.tensor([s + [0] * (width - len(s))
                                                for s in enc["token_type_ids"]])
    if head == "token-cls":
        labels = torch.tensor([r + [IGNORE] * (width - len(r)) for r in labels])
    return batch, labels


@pytest.mark.parametrize(("family", "head"), _cases(HEADS))
def test_loss_equals_the_models_own_loss(models, files, family, head):
    folder = models[family, head][0]
    loaded = load_model(str(folder))
    assert task_of(loaded) == head
    data, cols = _data(files, head)
    split = split_for(loaded, data, "test", columns=cols)
    got = evaluate(loaded, split)
    rows = [r for r in files[1] if r["split"] == "test"]
    assert split.n == len(rows)
    import transformers as T

    model = getattr(T, type(loaded.model).__name__).from_pretrained(str(folder)).eval()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    pad = tok.pad_token_id if tok.pad_token_id is not None else model.config.pad_token_id
    batch, labels = _reference_batch(folder, rows, head, pad)
    with torch.no_grad():
        want = model(**batch, labels=labels).loss.item()
    assert got["loss"] == pytest.approx(want, abs=1e-5)
    if head in ("seq-cls", "token-cls"):
        assert 0.0 <= got["macro_f1"] <= 1.0
    if head == "token-cls":
        assert 0.0 <= got["entity_f1"] <= 1.0
    if head == "multi-label":
        assert {"macro_f1", "micro_f1"} <= set(got)
    if head == "regression":
        assert np.isnan(got["acc"]) and got["mse"] == pytest.approx(got["loss"], rel=1e-6)


@pytest.mark.parametrize("family", ["roberta", "gpt2"])
def test_token_classification_from_conll_equals_jsonl(models, files, family):
    loaded = load_model(str(models[family, "token-cls"][0]))
    conll = split_for(loaded, f"conll:{files[0] / 'tags.conll'}", "test")
    jsonl = split_for(loaded, f"jsonl:{files[0] / 'rows.jsonl'}", "train")
    assert conll.task == jsonl.task == "token-cls"
    assert conll.label_names == TAGS
    # conll has no split column: seeded tenths of its 90 sentences
    assert conll.n == 9 and (conll.labels != IGNORE).any()


def test_commands_run_on_a_classifier_pair(models, files, tmp_path, capsys):
    a, b = models["roberta", "seq-cls"]
    data = f"csv:{files[0] / 'rows.csv'}"
    cols = ["--text-column", "sentence", "--label-column", "y"]
    assert main(["eval", str(a), "--data", data, *cols, "--json", str(tmp_path / "e.json")]) == 0
    ev = json.loads((tmp_path / "e.json").read_text())
    assert ev["task"] == "seq-cls" and 0 <= ev["macro_f1"] <= 1
    loaded = load_model(str(a))
    split = split_for(loaded, data, "test", columns=Columns(text="sentence", label="y"))
    assert ev["loss"] == pytest.approx(evaluate(loaded, split)["loss"], abs=1e-6)
    assert main(["barrier", str(a), str(b), "--data", data, *cols, "--points", "5",
                 "--json", str(tmp_path / "b.json")]) == 0
    br = json.loads((tmp_path / "b.json").read_text())
    assert br["loss"][0] == pytest.approx(ev["loss"], abs=1e-5)
    for method in ("simple", "fisher", "regmean"):
        out = tmp_path / f"m-{method}.json"
        stats = [] if method == "simple" else ["--batches", "2", "--batch-size", "8"]
        assert main(["merge", str(a), str(b), "--data", data, *cols, "--method", method,
                     *stats, "--json", str(out)]) == 0
        r = json.loads(out.read_text())
        assert np.isfinite(r["loss"]) and 0 <= r["scores"]["macro_f1"] <= 1
        assert r["anchor_loss"] == pytest.approx(ev["loss"], abs=1e-5)
        assert r["anchor_scores"]["macro_f1"] == pytest.approx(ev["macro_f1"])
    for flags in (["--act"], ["--learned", "--steps", "6"]):
        assert main(["match", str(a), str(b), "--out", str(tmp_path / flags[0][2:]),
                     "--data", data, *cols, *flags]) == 0
        assert (tmp_path / flags[0][2:] / "tokenizer.json").is_file()
    tb = models["bert", "token-cls"]
    assert main(["merge", str(tb[0]), str(tb[1]), "--data", f"conll:{files[0] / 'tags.conll'}",
                 "--method", "regmean", "--batches", "2", "--batch-size", "4"]) == 0


def test_f1_matches_the_reference_definitions():
    from sklearn.metrics import f1_score

    rng = np.random.default_rng(0)
    true, pred = rng.integers(0, 5, 300), rng.integers(0, 5, 300)
    pred[:100] = true[:100]
    assert class_f1(pred, true, 5) == pytest.approx(f1_score(true, pred, average="macro"))
    names = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
    # true: PER(0-2), LOC(3-4); predicted: PER(0-2) right, LOC cut short, one spurious LOC
    t = [1, 2, 0, 3, 4, 0]
    p = [1, 2, 0, 3, 0, 3]
    assert entities([names[i] for i in t]) == {("PER", 0, 2), ("LOC", 3, 5)}
    assert entity_f1([p], [t], names) == pytest.approx(2 * 1 / (3 + 2))
    # conlleval: an I- tag that does not continue a span starts one
    assert entities(["O", "I-PER", "I-PER", "B-PER"]) == {("PER", 1, 3), ("PER", 3, 4)}


def test_named_splits_from_a_datasets_folder_and_parquet(models, files, tmp_path):
    import datasets

    rows = files[1]
    cut = {k: [r for r in rows if r["split"] == k] for k in ("train", "test")}
    keep = ("text", "label")
    dd = datasets.DatasetDict({k: datasets.Dataset.from_list([{c: r[c] for c in keep}
                                                                for r in v])
                               for k, v in cut.items()})
    dd.save_to_disk(str(tmp_path / "ds"))
    loaded = load_model(str(models["bert", "seq-cls"][0]))
    test = split_for(loaded, f"hf:{tmp_path / 'ds'}", "test")
    assert test.n == len(cut["test"])
    train = split_for(loaded, f"hf:{tmp_path / 'ds'}", "train")
    val = split_for(loaded, f"hf:{tmp_path / 'ds'}", "val")  # none saved: a tenth of train
    assert train.n + val.n == len(cut["train"]) and val.n == round(len(cut["train"]) / 10)
    (tmp_path / "pq").mkdir()
    for k, ds in dd.items():
        ds.to_parquet(str(tmp_path / "pq" / f"{k}-00000.parquet"))
    pq = split_for(loaded, f"hf:{tmp_path / 'pq'}", "test")
    assert torch.equal(pq.inputs, test.inputs) and torch.equal(pq.labels, test.labels)


def test_bad_labelled_data_is_one_line(models, files, tmp_path, capsys):
    a = str(models["roberta", "seq-cls"][0])
    lm = tmp_path / "lm.txt"
    lm.write_text("x" * 400)
    (tmp_path / "odd.csv").write_text("text,label\nalpha beta,neutral\n" * 30)
    (tmp_path / "notest.csv").write_text("text,label,split\n" + "alpha,pos,train\n" * 20)
    (tmp_path / "two.jsonl").write_text(json.dumps({"text": "a", "score": [1, 2]}) + "\n")
    reg = str(models["roberta", "regression"][0])
    cases = [
        (["eval", a, "--data", f"csv:{files[0] / 'rows.csv'}"], "no column 'text'"),
        (["eval", a, "--data", f"csv:{tmp_path / 'odd.csv'}"], "label 'neutral' is not one"),
        (["eval", a, "--data", f"csv:{tmp_path / 'notest.csv'}"], "no test split"),
        (["eval", a, "--data", f"text:{lm}"], "plain text"),
        (["eval", a, "--data", "digits"], "image data"),
        (["eval", reg, "--data", f"jsonl:{tmp_path / 'two.jsonl'}", "--label-column", "score",
          "--split", "train"], "has 2 values but the model's regression head has 1"),
        (["eval", a, "--data", "digits", "--seq-len", "8"], "--seq-len applies to text"),
        (["eval", a, "--data", f"csv:{files[0] / 'rows.csv'}", "--text-column", " "],
         "--text-column is empty"),
        (["eval", a, "--data", f"csv:{files[0] / 'rows.csv'}", "--seq-len", "4096",
          "--text-column", "sentence", "--label-column", "y"], "longer than"),
        (["eval", str(models["gpt2", "seq-cls"][0]), "--data",
          f"conll:{files[0] / 'tags.conll'}"], "token-classification data"),
    ]
    for argv, pattern in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert pattern in err and len(err.splitlines()) == 1, (argv, err)
    with pytest.raises(RotvizError, match="not a text classifier"):
        split_for(load_model("zoo:gpt2-pystdlib-s0"), f"csv:{files[0] / 'rows.csv'}")


def test_language_model_batches_keep_logits_under_the_budget(monkeypatch, tmp_path):
    import inspect

    import rotviz.evaluation as E

    m = load_model("zoo:gpt2-pystdlib-s0")
    code = tmp_path / "code.txt"  # 60 kB of Python source: a test split of several windows
    code.write_text(inspect.getsource(E) * 4)
    sp = split_for(m, f"text:{code}", "test")
    assert sp.n >= 7
    whole = evaluate(m, sp)
    width = sp.inputs.shape[1] * int(m.config["vocab_size"])
    monkeypatch.setattr(E, "LOGIT_ELEMENTS", 3 * width)  # three windows' logits at a time
    assert E.fit_batch(m, sp, 512) == 3
    assert max(len(y) for _, y in E.Evaluator(m, sp).batches) == 3
    small = evaluate(m, sp)
    assert small["loss"] == pytest.approx(whole["loss"], abs=1e-6)
    assert small["acc"] == whole["acc"]


@pytest.mark.parametrize(("family", "head"), _cases(("seq-cls", "token-cls")))
def test_every_head_reads_the_mapped_stream(models, family, head):
    """A classifier head that reads the residual stream follows a planted stream map (a token
    classifier reads it at every position; BERT's sequence classifier reads the pooler
    instead, which reads the stream), so the function is kept; and weight matching, which maps
    the stream, keeps it too."""
    from rotviz import MatchOptions, match_models
    from rotviz.sources.running import max_output_diff
    from rotviz.symmetry import residual as rs
    from rotviz.symmetry.view import read_view, write_state

    a, b = (load_model(str(d)) for d in models[family, head])
    canon, _ = rs.canonicalise(read_view(b.spec, b.config, b.state))
    image = rs.apply_residual(canon, rs.random_map(canon, seed=7))
    assert max_output_diff(b, b.state, write_state(image)) <= 1e-4
    out = match_models(a, b, MatchOptions(heads=True, residual=True, rounds=3))
    assert out.preserved and out.report.max_output_diff <= 1e-4

"""Labelled text from the user's files, read the way a classifier reads it.

- `csv:FILE`, `tsv:FILE`, `jsonl:FILE`: one example per row, columns chosen by name (the text,
  an optional second text, the label; `Columns`). A `split` column (train / val / test)
  names each row's split; without one, a seeded 10% test and 10% val are drawn.
- `conll:FILE`: token classification, one `word ... tag` line per token (the first column
  is the word, the last the tag), sentences separated by blank lines, `-DOCSTART-` lines
  skipped; seeded splits.
- `hf:DIR`: a Hugging Face `datasets` folder (`save_to_disk`) or a folder of parquet files
  (named by split: `train*.parquet`, `validation*.parquet`, `test*.parquet`). Its splits
  are used; a missing val split is a seeded tenth of train.

Labels go through the model's `label2id` (names), or are ids below its number of labels.
The text goes through the model's own tokenizer (rotviz.data.tokens), truncated to the model's
length and padded on the right; for token classification each word's first token carries
its tag and every other position is IGNORE. Every problem is one line (rotviz.errors).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rotviz.confine import ANYWHERE, Confined
from rotviz.data.files import data_file, data_folder, hf_parquet, read_text
from rotviz.data.splits import IGNORE, split_indices, tenth_split
from rotviz.errors import RotvizError

ROW_KINDS = ("csv", "tsv", "jsonl")
LABELLED_KINDS = (*ROW_KINDS, "conll", "hf")
SPLIT_COLUMN = "split"
# The names a split may go by in a file or a datasets folder.
SPLIT_NAMES = {"train": "train", "training": "train", "val": "val", "valid": "val",
               "validation": "val", "dev": "val", "test": "test", "testing": "test"}

MAX_ROWS = 2_000_000  # rows read from one file (beyond: one line, not out of memory)


@dataclass(frozen=True)
class Columns:
    """The column names a labelled file is read with (`--text-column` and friends)."""

    text: str = "text"
    pair: str | None = None  # a second text (sentence pairs), or none
    label: str = "label"
    words: str = "tokens"  # token classification in a datasets folder: the words ...
    tags: str = "ner_tags"  # ... and their tags


@dataclass(frozen=True)
class Labelling:
    """What labelled data must say for one classifier: its task, its labels (names by id,
    from the config's id2label), its padding id and its longest input."""

    task: str
    names: tuple[str, ...]
    pad_id: int
    max_len: int
    columns: Columns = field(default_factory=Columns)

    @property
    def num_labels(self) -> int:
        return len(self.names)

    def label_id(self, value: Any, where: str) -> int:
        """The id of one label (a name in id2label, or an id below the number of labels)."""
        key = str(value).strip()
        if key in self.names:
            return self.names.index(key)
        try:
            i = int(key)
        except ValueError:
            i = -1
        if 0 <= i < self.num_labels and str(i) == key:
            return i
        shown = ", ".join(self.names[:8]) + (", ..." if self.num_labels > 8 else "")
        raise RotvizError(f"{where}: label '{key}' is not one of the model's "
                          f"{self.num_labels} labels ({shown}) nor an id below "
                          f"{self.num_labels}; map it to one of them")


# ---- reading rows ----------------------------------------------------------------------------


def _file(path: str, kind: str, confined: Confined) -> Path:
    return data_file(path, kind, confined)


def _read_text(p: Path, confined: Confined) -> str:
    return read_text(p, confined, "data file", "utf-8-sig")


def read_rows(kind: str, path: str, confined: Confined = ANYWHERE) -> list[dict[str, Any]]:
    """The rows of a CSV, TSV or JSON-lines file, as dicts of column -> value."""
    p = _file(path, kind, confined)
    text = _read_text(p, confined)
    if kind == "jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise RotvizError(f"'{p}' line {n} is not JSON ({e.msg}); expected one JSON "
                                  "object per line") from None
            if not isinstance(row, dict):
                raise RotvizError(f"'{p}' line {n} is a JSON {type(row).__name__}, not an "
                                  "object; expected one JSON object per line")
            rows.append(row)
    else:
        try:
            reader = csv.DictReader(text.splitlines(), delimiter="\t" if kind == "tsv" else ",")
            rows = [dict(r) for r in reader]
        except csv.Error as e:
            raise RotvizError(f"'{p}' is not a valid {kind.upper()} file ({e})") from None
        for n, row in enumerate(rows, 1):
            _no_extra_fields(row, p, kind, n)
    if len(rows) > MAX_ROWS:
        raise RotvizError(f"'{p}' has {len(rows):,} rows, above rotviz's bound of "
                          f"{MAX_ROWS:,}; use a sample of it")
    if not rows:
        raise RotvizError(f"'{p}' holds no rows; expected a header and one example per row")
    return rows


def _no_extra_fields(row: dict, p: Path, kind: str, n: int) -> None:
    """One line for a CSV / TSV row with more (non-empty) fields than its header: an
    unquoted delimiter inside a text, which would silently cut the text (csv puts the rest
    under the key None). Empty trailing fields, as spreadsheets write them, are let through."""
    extra = [x for x in row.pop(None, None) or [] if x.strip()]
    if extra:
        sep = "tab" if kind == "tsv" else "comma"
        raise RotvizError(f"'{p}' row {n} has {len(extra)} more field(s) than its header "
                          f"(from '{extra[0][:40]}'); quote a field that holds a {sep}")


def read_conll(path: str, confined: Confined = ANYWHERE) -> list[dict[str, Any]]:
    """Sentences of a CoNLL file as rows {tokens: [...], tags: [...]}."""
    p = _file(path, "conll", confined)
    rows: list[dict[str, Any]] = []
    words: list[str] = []
    tags: list[str] = []
    for n, line in enumerate(_read_text(p, confined).splitlines(), 1):
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if words:
                rows.append({"tokens": words, "tags": tags})
            words, tags = [], []
            continue
        if len(parts) < 2:
            raise RotvizError(f"'{p}' line {n} has one column; expected `word ... tag` per "
                              "line and blank lines between sentences")
        words.append(parts[0])
        tags.append(parts[-1])
    if words:
        rows.append({"tokens": words, "tags": tags})
    if not rows:
        raise RotvizError(f"'{p}' holds no sentences; expected `word ... tag` lines")
    return rows


def read_hf(path: str, confined: Confined = ANYWHERE) -> dict[str, list[dict[str, Any]]]:
    """The splits of a `datasets` folder (save_to_disk) or of a folder of parquet files, by
    rotviz's split names; {"": rows} for one unnamed split. The whole folder is checked by
    `confined` first (datasets and pyarrow open what they find in it)."""
    root = data_folder(path, "hf", confined)
    parquet = hf_parquet(root, confined)
    if parquet:
        import pyarrow.parquet as pq

        out: dict[str, list[dict[str, Any]]] = {}
        for f in parquet:
            rel = f.relative_to(root).parts
            stem = rel[0] if len(rel) > 1 else f.stem
            name = SPLIT_NAMES.get(stem.split("-")[0].split(".")[0].lower(), "")
            with confined.open(f, "parquet file") as fh:
                try:
                    table = pq.read_table(fh)
                except Exception as e:  # noqa: BLE001 - any failure is one line about the file
                    raise RotvizError(f"cannot read parquet file '{f}' ({_first_line(e)}); "
                                      "write it again (e.g. Dataset.to_parquet)") from None
            out.setdefault(name, []).extend(table.to_pylist())
        return out
    try:
        import datasets
    except ImportError:
        raise RotvizError("hf: data needs the datasets package: pip install datasets") from None
    try:  # every file in it checked above (hf_parquet)
        ds = datasets.load_from_disk(str(root), keep_in_memory=True)
    except Exception as e:  # noqa: BLE001 - any failure is one line about the folder
        raise RotvizError(f"'{root}' is not a datasets folder ({_first_line(e)}); save one "
                          "with Dataset.save_to_disk, or put parquet files in it") from None
    if isinstance(ds, datasets.DatasetDict):
        named: dict[str, list[dict[str, Any]]] = {}
        for k, v in ds.items():
            if k.lower() not in SPLIT_NAMES:
                raise RotvizError(f"'{root}' has a split '{k}'; rotviz reads train, "
                                  "validation (or val, dev) and test")
            named.setdefault(SPLIT_NAMES[k.lower()], []).extend(v.to_list())
        return named
    return {"": ds.to_list()}


def _first_line(e: BaseException) -> str:
    """An exception's message, cut to its first line (or its class name when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0][:120] if text else type(e).__name__


def split_rows(rows: dict[str, list[dict]] | list[dict], split: str, seed: int,
               where: str) -> list[dict]:
    """The rows of one split: named splits where the source has them (a `split` column, or
    the folder's splits; a missing val is a seeded tenth of train), else seeded ones."""
    if isinstance(rows, list):
        if rows and SPLIT_COLUMN in rows[0]:
            named: dict[str, list[dict]] = {}
            for n, r in enumerate(rows, 1):
                value = str(r.get(SPLIT_COLUMN, "")).strip().lower()
                if value not in SPLIT_NAMES:
                    raise RotvizError(f"{where} row {n}: split '{value}' is not train, val or "
                                      "test")
                named.setdefault(SPLIT_NAMES[value], []).append(r)
            rows = named
        else:
            idx = tenth_split(len(rows), seed)[split]
            return [rows[i] for i in idx]
    if set(rows) == {""}:
        return split_rows(rows[""], split, seed, where)
    if split == "val" and "val" not in rows and "train" in rows:
        train = rows["train"]
        k = max(1, round(len(train) / 10)) if len(train) >= 2 else 0
        return [train[i] for i in split_indices(len(train), seed, k, 0)["val"]]
    if split == "train" and "val" not in rows and "train" in rows:
        train = rows["train"]
        k = max(1, round(len(train) / 10)) if len(train) >= 2 else 0
        return [train[i] for i in split_indices(len(train), seed, k, 0)["train"]]
    if split not in rows:
        have = ", ".join(sorted(k for k in rows if k)) or "none"
        raise RotvizError(f"{where} has no {split} split (it has {have}); add one")
    return rows[split]


# ---- tokenizing -----------------------------------------------------------------------------


def _column(row: Mapping, name: str, where: str, n: int) -> Any:
    if name not in row:
        have = ", ".join(map(str, list(row)[:8]))
        raise RotvizError(f"{where} has no column '{name}' (row {n} has {have}); name the "
                          "column with --text-column, --pair-column or --label-column")
    return row[name]


def _what(value: Any, kind: str) -> str:
    """How a value of the wrong type is named in a message."""
    if value is None:
        return ("missing (the row has fewer fields than its header)" if kind in ("csv", "tsv")
                else "null")
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"the string '{value[:40]}'"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


# Each check: None for a value of the right type, else how the value is named in the message.
Check = Callable[[Any, str], str | None]


def _text(value: Any, kind: str) -> str | None:
    return None if isinstance(value, str) else _what(value, kind)


def _label(value: Any, kind: str) -> str | None:
    """A label name (a string) or id (an integer), which `Labelling.label_id` looks up (a
    boolean is looked up by its name, 'True' or 'False', as before)."""
    return None if isinstance(value, str | int) else _what(value, kind)


def _number(value: Any, kind: str) -> str | None:
    """A finite regression target: a number, or a string that is one (CSV)."""
    if not isinstance(value, bool) and isinstance(value, str | int | float):
        try:
            if math.isfinite(float(value)):
                return None
        except (ValueError, OverflowError):
            pass
    return _what(value, kind)


def _each(check: Check) -> Check:
    """A list whose every item passes `check`."""
    def checked(value: Any, kind: str) -> str | None:
        if not isinstance(value, list):
            return _what(value, kind)
        for item in value:
            problem = check(item, kind)
            if problem:
                return f"a list holding {problem}"
        return None
    return checked


def _one_or_each(check: Check) -> Check:
    """One value that passes `check`, or a list of them."""
    def checked(value: Any, kind: str) -> str | None:
        return _each(check)(value, kind) if isinstance(value, list) else check(value, kind)
    return checked


def check_rows(source: dict[str, list[dict]] | list[dict], lab: Labelling, where: str,
               kind: str) -> None:
    """Every row's values in the columns the classifier reads have the right type: a text
    is a string (not null, a number, a list or an object, which would be read as the
    strings 'None' or "{'a': 1}"), a label a name or an id (a list of them for multi-label,
    finite numbers for regression), words a list of strings and tags a list of labels.
    Checked over the whole source before any split is drawn, so a bad row is refused
    whichever split it falls in, by its number in the file (or in its split of an hf:
    folder). One line naming the file, the row and the column."""
    cols = lab.columns
    checks: list[tuple[str, Check, str]]
    if lab.task == "token-cls":
        words, tags = ("tokens", "tags") if kind == "conll" else (cols.words, cols.tags)
        checks = [(words, _each(_text), "a list of words (strings)"),
                  (tags, _each(_label), "a list of tags (label names or ids)")]
    else:
        checks = [(c, _text, "text (a string)") for c in (cols.text, cols.pair) if c]
        checks.append({
            "regression": (cols.label, _one_or_each(_number),
                           "a finite number (or a list of them)"),
            "multi-label": (cols.label, _one_or_each(_label),
                            "label names or ids (or a list of them)"),
        }.get(lab.task, (cols.label, _label, "a label name or id")))
    parts = source.items() if isinstance(source, dict) else [("", source)]
    for name, rows in parts:
        at = f"{where} ({name} split)" if name else where
        for n, row in enumerate(rows, 1):
            for col, check, want in checks:
                problem = check(_column(row, col, at, n), kind)
                if problem:
                    raise RotvizError(f"{at} row {n}: column '{col}' is {problem}, not "
                                      f"{want}; fix the row or leave it out")


def _pad(seqs: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def _encoded(enc: Mapping, tokenizer: Any, pad_id: int) -> tuple[torch.Tensor, dict]:
    """Input ids and the further inputs the tokenizer gives the model, padded on the right."""
    ids = _pad(enc["input_ids"], pad_id)
    extra = {"attention_mask": _pad([[1] * len(s) for s in enc["input_ids"]], 0)}
    names = getattr(tokenizer, "model_input_names", ["input_ids", "attention_mask"])
    if "token_type_ids" in names and "token_type_ids" in enc:
        extra["token_type_ids"] = _pad(enc["token_type_ids"], 0)
    return ids, extra


def _labels(rows: list[dict], lab: Labelling, where: str) -> torch.Tensor:
    col = lab.columns.label
    values = [_column(r, col, where, n) for n, r in enumerate(rows, 1)]
    if lab.task == "seq-cls":
        return torch.tensor([lab.label_id(v, f"{where} row {n}")
                             for n, v in enumerate(values, 1)], dtype=torch.long)
    if lab.task == "multi-label":
        out = torch.zeros(len(rows), lab.num_labels)
        for n, v in enumerate(values, 1):
            items = v if isinstance(v, list) else [x for x in str(v).split(",") if x.strip()]
            for item in items:
                out[n - 1, lab.label_id(item, f"{where} row {n}")] = 1.0
        return out
    out_rows = []
    for n, v in enumerate(values, 1):  # regression
        items = v if isinstance(v, list) else [v]
        try:
            nums = [float(x) for x in items]
        except (TypeError, ValueError):
            raise RotvizError(f"{where} row {n}: label '{v}' is not a number; the model is "
                              "a regression head") from None
        if len(nums) != lab.num_labels:
            raise RotvizError(f"{where} row {n} has {len(nums)} values but the model's "
                              f"regression head has {lab.num_labels} outputs")
        out_rows.append(nums)
    t = torch.tensor(out_rows, dtype=torch.float32)
    return t[:, 0] if lab.num_labels == 1 else t


def sequence_split(rows: list[dict], tokenizer: Any, lab: Labelling, where: str
                   ) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(input ids, labels, further inputs) of sequence-classification rows."""
    cols = lab.columns
    texts = [str(_column(r, cols.text, where, n)) for n, r in enumerate(rows, 1)]
    pairs = ([str(_column(r, cols.pair, where, n)) for n, r in enumerate(rows, 1)]
             if cols.pair else None)
    labels = _labels(rows, lab, where)
    enc = tokenizer(texts, pairs, truncation=True, max_length=lab.max_len, verbose=False)
    ids, extra = _encoded(enc, tokenizer, lab.pad_id)
    return ids, labels, extra


def token_split(rows: list[dict], tokenizer: Any, lab: Labelling, where: str,
                words_col: str, tags_col: str) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(input ids, per-token labels, further inputs) of tagged sentences: each word's first
    token carries the word's tag; the rest (specials, later pieces, padding) IGNORE."""
    words, tags = [], []
    for n, r in enumerate(rows, 1):
        w, t = _column(r, words_col, where, n), _column(r, tags_col, where, n)
        if not isinstance(w, list) or not isinstance(t, list) or len(w) != len(t):
            raise RotvizError(f"{where} sentence {n}: '{words_col}' and '{tags_col}' must be "
                              "lists of one tag per word")
        words.append([str(x) for x in w])
        tags.append([lab.label_id(x, f"{where} sentence {n}") for x in t])
    if not getattr(tokenizer, "is_fast", False):
        raise RotvizError("token classification needs a fast tokenizer (tokenizer.json), "
                          "which tells which word each token comes from; save one with "
                          "the tokenizers library")
    enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=lab.max_len,
                    verbose=False)
    labels = []
    for i, tag in enumerate(tags):
        row, prev = [], None
        for w in enc.word_ids(i):
            row.append(tag[w] if w is not None and w != prev else IGNORE)
            prev = w
        labels.append(row)
    ids, extra = _encoded(enc, tokenizer, lab.pad_id)
    return ids, _pad(labels, IGNORE), extra


def labelled_split(ref: str, split: str, seed: int, reader: Any, lab: Labelling,
                   confined: Confined = ANYWHERE
                   ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """One split of labelled data `ref` (see the module), read by `reader` (the model's
    rotviz.data.tokens.TextEncoding) for the classifier `lab` describes: input ids, labels and
    the further inputs (rotviz.data.split.load_split makes it a Split). Files are read through
    `confined`."""
    kind, _, path = ref.partition(":")
    if not path:
        raise RotvizError(f"'{ref}' names no path: write {kind}:PATH")
    where = f"'{ref}'"
    if reader is None or reader.tokenizer is None:
        raise RotvizError(f"{where} is labelled text, which rotviz reads with the model's own "
                          "tokenizer; save the tokenizer into the model folder")
    tokens = lab.task == "token-cls"
    if kind == "conll":
        if not tokens:
            raise RotvizError(f"{where} is token-classification data but the model is a "
                              f"{lab.task} head; give csv:, tsv:, jsonl: or hf: rows")
        source: Any = read_conll(path, confined)
        words_col, tags_col = "tokens", "tags"
    elif kind == "hf":
        source = read_hf(path, confined)
        words_col, tags_col = lab.columns.words, lab.columns.tags
    else:
        source = read_rows(kind, path, confined)
        words_col, tags_col = lab.columns.words, lab.columns.tags
    check_rows(source, lab, where, kind)
    rows = split_rows(source, split, seed, where)
    if not rows:
        raise RotvizError(f"the {split} split of {where} is empty; use more rows or another "
                          "split")
    tok = reader.words_tokenizer() if tokens else reader.tokenizer
    if tokens:
        ids, labels, extra = token_split(rows, tok, lab, where, words_col, tags_col)
    else:
        ids, labels, extra = sequence_split(rows, tok, lab, where)
    return ids, labels, extra


def majority_accuracy(labels: torch.Tensor) -> float:
    """The accuracy of always answering the most common label (IGNORE positions aside)."""
    y = labels.reshape(-1)
    y = y[y != IGNORE]
    if y.numel() == 0:
        return float("nan")
    return float(np.bincount(y.numpy()).max() / y.numel())

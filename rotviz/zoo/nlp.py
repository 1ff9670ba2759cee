"""The zoo's language data, made offline from this Python's standard library: the seed paper's
NLP setting (a masked-LM encoder fine-tuned for text and token classification) at a size that
trains on a CPU in minutes.

- `pydocs.txt`: an English corpus, the docstrings of the standard library (read with `ast`,
  files in sorted order), for masked-LM pretraining. It leaves out the packages the topic
  task labels, so pretraining never reads a sentence the fine-tunes are tested on.
- `pydocs-tokenizer/`: a WordPiece tokenizer trained on that corpus with RoBERTa's special
  tokens (<s> </s> <pad> <unk> <mask>) and its <s> ... </s> template, saved with
  `PreTrainedTokenizerFast.save_pretrained`; every NLP zoo model carries a copy of it.
- `pydoc-topics.jsonl`: sequence classification: which package (`TOPICS`) a docstring
  sentence comes from; rows `text`, `label`, `split`.
- `pytokens.jsonl`: token classification: the tokens of stdlib code lines labelled by
  Python's own `tokenize` (with `keyword` telling keywords from names); a string literal or
  a comment is split at its spaces into several words, tagged B-STR I-STR ... (or B-COM
  I-COM ...), so entity-level F1 means something; rows `tokens`, `ner_tags`, `split`.

The files are shipped under `rotviz/assets/data/` (the zoo trains from them, so a rebuild does not
depend on the local Python); `generate()` writes them again. They depend on the Python
version whose standard library they are read from (`meta.json` records it, with checksums).
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import keyword
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from rotviz.errors import RotvizError

DATA_DIR = "assets/data"  # relative to the package: rotviz.data.files.data_path resolves it
CORPUS = f"{DATA_DIR}/pydocs.txt"
TOKENIZER = f"{DATA_DIR}/pydocs-tokenizer"
TOPICS_FILE = f"{DATA_DIR}/pydoc-topics.jsonl"
TOKENS_FILE = f"{DATA_DIR}/pytokens.jsonl"
META_FILE = f"{DATA_DIR}/meta.json"

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # ids 0-4, RoBERTa's order
VOCAB_SIZE = 2000
MAX_TOKENS = 64  # the models' length: every example fits it, specials included
CORPUS_CHARS = 900_000  # the pretraining corpus stops at the first docstring beyond this

# The topic task: a label and the standard-library packages (or modules) it reads.
TOPICS: dict[str, tuple[str, ...]] = {
    "asyncio": ("asyncio",),
    "email": ("email",),
    "http": ("http", "urllib"),
    "logging": ("logging",),
    "tkinter": ("tkinter",),
    "xml": ("xml", "xmlrpc"),
}
PER_TOPIC = 450  # sentences per topic (every topic has more)

# The code-token task: tags by tokenize's token type; strings and comments span words.
TAGS = ("B-KW", "B-NAME", "B-NUM", "B-OP", "B-STR", "I-STR", "B-COM", "I-COM")
CODE_FILES = (
    "argparse.py", "base64.py", "bisect.py", "calendar.py", "cmd.py", "configparser.py",
    "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "difflib.py", "enum.py",
    "fnmatch.py", "fractions.py", "ftplib.py", "functools.py", "gettext.py", "glob.py",
    "gzip.py", "heapq.py", "hmac.py", "inspect.py", "ipaddress.py", "locale.py",
    "mimetypes.py", "netrc.py", "operator.py", "optparse.py", "pprint.py", "queue.py",
    "random.py", "sched.py", "secrets.py", "shlex.py", "shutil.py", "statistics.py",
    "string.py", "tempfile.py", "textwrap.py", "threading.py", "timeit.py", "trace.py",
    "uuid.py", "wave.py",
)
CODE_LINES = 4000  # labelled code lines kept
MIN_WORDS, MAX_WORDS = 4, 24  # words per code line

# Never in the pretraining corpus: tests, the IDE, third-party code
SKIP_DIRS = ("test", "tests", "idle_test", "idlelib", "site-packages", "lib2to3")


def repo_path(rel: str) -> Path:
    """A shipped data path (relative to the package, as the cards name it) as an absolute
    path."""
    from rotviz.data.files import PACKAGE

    return PACKAGE / rel


def _hash(text: str, salt: str = "") -> int:
    return int(hashlib.sha256((salt + text).encode("utf-8")).hexdigest()[:16], 16)


def split_of(text: str) -> str:
    """A fixed split from the text itself: 10% test, 10% val, the rest train."""
    k = _hash(text, "split:") % 10
    return "test" if k == 0 else "val" if k == 1 else "train"


# ---- docstrings ------------------------------------------------------------------------------


def _stdlib() -> Path:
    from rotviz.data.text import stdlib_dir

    root = stdlib_dir()
    if not (root / "ast.py").is_file():
        raise RotvizError(f"the standard library sources are missing from '{root}'; the NLP "
                          "data is made from them: use a Python install that ships its .py "
                          "files")
    return root


def _top(rel: Path) -> str:
    """The top-level package or module of a stdlib path: `email` for email/utils.py."""
    return rel.parts[0] if len(rel.parts) > 1 else rel.name


def stdlib_files(root: Path) -> list[Path]:
    """The standard library's .py files, sorted by their relative path (posix form)."""
    files = [p for p in root.rglob("*.py")
             if not set(p.relative_to(root).parts[:-1]) & set(SKIP_DIRS)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def docstrings(path: Path) -> Iterator[str]:
    """The docstrings of a module, its classes and functions, in source order."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    nodes = [n for n in ast.walk(tree)
             if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    for node in nodes:
        doc = ast.get_docstring(node)
        if doc:
            yield doc


def _clean(par: str) -> str | None:
    """A paragraph fit for the corpus: ASCII, never holding a special token's spelling."""
    par = par.strip()
    if not par or not par.isascii() or any(s in par for s in SPECIALS):
        return None
    return par


def corpus_text(root: Path | None = None, limit: int = CORPUS_CHARS) -> str:
    """The pretraining corpus: each distinct docstring paragraph once, blank lines between,
    from every stdlib file outside the topic packages, in sorted file order."""
    root = root or _stdlib()
    held_out = {p for pkgs in TOPICS.values() for p in pkgs}
    seen: set[str] = set()
    out: list[str] = []
    size = 0
    for f in stdlib_files(root):
        rel = f.relative_to(root)
        if _top(rel).removesuffix(".py") in held_out:
            continue
        for doc in docstrings(f):
            for par in re.split(r"\n\s*\n", doc):
                par = _clean(par)
                if par is None or par in seen:
                    continue
                seen.add(par)
                out.append(par)
                size += len(par) + 2
            if size >= limit:
                return "\n\n".join(out) + "\n"
    return "\n\n".join(out) + "\n"


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`'\"])")


def sentences(doc: str) -> Iterator[str]:
    """The prose sentences of a docstring (doctest paragraphs skipped), whitespace folded."""
    for par in re.split(r"\n\s*\n", doc):
        if ">>>" in par:
            continue
        for s in _SENTENCE_END.split(" ".join(par.split())):
            if 5 <= len(s.split()) <= 40 and _clean(s):
                yield s


def topic_rows(root: Path | None = None, per_topic: int = PER_TOPIC, fits=None) -> list[dict]:
    """The topic task's rows: `per_topic` distinct sentences per topic (a sentence found
    under two topics is dropped), chosen and ordered by their hash, with their split.
    `fits` (text -> bool) drops sentences the models could not read whole."""
    root = root or _stdlib()
    found: dict[str, set[str]] = {t: set() for t in TOPICS}
    for f in stdlib_files(root):
        top = _top(f.relative_to(root)).removesuffix(".py")
        for topic, pkgs in TOPICS.items():
            if top in pkgs:
                for doc in docstrings(f):
                    found[topic].update(sentences(doc))
    rows = []
    for topic, sents in found.items():
        others = set().union(*(s for t, s in found.items() if t != topic))
        mine = sorted(sents - others, key=_hash)
        if fits is not None:
            mine = [s for s in mine if fits(s)]
        if len(mine) < per_topic:
            raise RotvizError(f"topic '{topic}' has {len(mine)} sentences in this standard "
                              f"library, fewer than {per_topic}")
        rows += [{"text": s, "label": topic} for s in mine[:per_topic]]
    rows.sort(key=lambda r: _hash(r["text"], "order:"))
    for r in rows:
        r["split"] = split_of(r["text"])
    return rows


# ---- code tokens -----------------------------------------------------------------------------


def _tag(tok: tokenize.TokenInfo) -> str | None:
    if tok.type == tokenize.NAME:
        return "KW" if keyword.iskeyword(tok.string) else "NAME"
    return {tokenize.NUMBER: "NUM", tokenize.OP: "OP", tokenize.STRING: "STR",
            tokenize.COMMENT: "COM"}.get(tok.type)


def tagged_lines(source: str) -> Iterator[tuple[list[str], list[str]]]:
    """(words, BIO tags) of each code line that starts a token, in order. A token is a word,
    except a string or comment, which is split at its whitespace into words (B- then I-).
    Lines holding only a string or a comment (docstrings, comment lines) are skipped, and so
    is any line with a token tokenize cannot type."""
    line: list[tuple[str, str]] = []
    row, bad = 0, False
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return

    def flush() -> Iterator[tuple[list[str], list[str]]]:
        kinds = {t[2:] for _, t in line}
        if line and not bad and kinds - {"STR", "COM"}:
            yield [w for w, _ in line], [t for _, t in line]

    for tok in tokens:
        if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENCODING, tokenize.ENDMARKER):
            continue
        if tok.start[0] != row:
            yield from flush()
            line, row, bad = [], tok.start[0], False
        kind = _tag(tok)
        if kind is None:
            bad = True
            continue
        words = tok.string.split() if kind in ("STR", "COM") else [tok.string]
        line += [(w, ("B-" if i == 0 else "I-") + kind) for i, w in enumerate(words)]
    yield from flush()


def token_rows(root: Path | None = None, n: int = CODE_LINES, fits=None) -> list[dict]:
    """The code-token task's rows: `n` distinct ASCII code lines of CODE_FILES with
    MIN_WORDS-MAX_WORDS words, chosen and ordered by their hash, with their split. `fits`
    (words -> bool) drops lines the models could not read whole."""
    root = root or _stdlib()
    found: dict[str, tuple[list[str], list[str]]] = {}
    for name in CODE_FILES:
        path = root / name
        if not path.is_file():
            raise RotvizError(f"the code-token data needs '{path}', missing from this "
                              "standard library")
        for words, tags in tagged_lines(path.read_text(encoding="utf-8")):
            text = " ".join(words)
            if (MIN_WORDS <= len(words) <= MAX_WORDS and text.isascii()
                    and not any(s in text for s in SPECIALS)):
                found.setdefault(text, (words, tags))
    keys = sorted(found, key=_hash)
    if fits is not None:
        keys = [k for k in keys if fits(found[k][0])]
    if len(keys) < n:
        raise RotvizError(f"only {len(keys)} code lines found, fewer than {n}")
    rows = [{"tokens": found[k][0], "ner_tags": found[k][1]} for k in keys[:n]]
    rows.sort(key=lambda r: _hash(" ".join(r["tokens"]), "order:"))
    for r in rows:
        r["split"] = split_of(" ".join(r["tokens"]))
    return rows


# ---- tokenizer -------------------------------------------------------------------------------


def train_tokenizer(text: str, vocab_size: int = VOCAB_SIZE):
    """A WordPiece tokenizer of `text` with RoBERTa's specials and <s> ... </s> template, as
    a transformers PreTrainedTokenizerFast (what `save_pretrained` writes, AutoTokenizer
    loads). Case is kept: the corpus is as much code as prose."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="<unk>", max_input_chars_per_word=100))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                               show_progress=False)
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    # The trainer finds the same vocabulary every run but numbers it in a hash order that
    # varies between runs; WordPiece reads only the set (longest match first), so number it
    # canonically: the specials, then whole words, then continuations, by length and text.
    learned = sorted(set(tok.get_vocab()) - set(SPECIALS),
                     key=lambda w: (w.startswith("##"), len(w), w))
    vocab = {w: i for i, w in enumerate([*SPECIALS, *learned])}
    tok.model = models.WordPiece(vocab, unk_token="<unk>", max_input_chars_per_word=100)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", bos), ("</s>", eos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>", mask_token="<mask>", cls_token="<s>", sep_token="</s>",
        model_max_length=MAX_TOKENS, padding_side="right")


def load_tokenizer(path: str | Path = TOKENIZER):
    """The shipped tokenizer (AutoTokenizer from its own files, never remote code)."""
    from rotviz.data.tokens import _auto_tokenizer

    return _auto_tokenizer(_resolve(path))


def _resolve(path: str | Path) -> Path:
    from rotviz.data.files import data_path

    return data_path(str(path))


def tokenizer_dir() -> Path:
    """The shipped tokenizer's folder; one line when it is missing."""
    d = _resolve(TOKENIZER)
    if not (d / "tokenizer.json").is_file():
        raise RotvizError(f"the NLP zoo's tokenizer is missing ({d}); write the data again "
                          "with: python -m rotviz.zoo.nlp")
    return d


# ---- all of it -------------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=True) + "\n" for r in rows),
                    encoding="utf-8")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def generate(out: str | Path | None = None) -> dict:
    """Write the corpus, tokenizer and both labelled data sets to `out` (default the shipped
    `assets/data`), deterministically for a given standard library; returns what
    `meta.json` records (python version, sizes, checksums)."""
    import sys

    root = _stdlib()
    folder = Path(out) if out is not None else repo_path(DATA_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    text = corpus_text(root)
    (folder / "pydocs.txt").write_text(text, encoding="utf-8")
    tok = train_tokenizer(text)
    tok_dir = folder / "pydocs-tokenizer"
    tok.save_pretrained(str(tok_dir))
    tok = load_tokenizer(tok_dir)
    limit = MAX_TOKENS - 2  # room for <s> and </s>

    def text_fits(text: str) -> bool:
        return len(tok(text, add_special_tokens=False)["input_ids"]) <= limit

    def words_fit(words: list[str]) -> bool:
        ids = tok(words, is_split_into_words=True, add_special_tokens=False)["input_ids"]
        return len(ids) <= limit

    topics = topic_rows(root, fits=text_fits)
    code = token_rows(root, fits=words_fit)
    _write_jsonl(folder / "pydoc-topics.jsonl", topics)
    _write_jsonl(folder / "pytokens.jsonl", code)
    meta = {
        "python": ".".join(map(str, sys.version_info[:3])),
        "made_by": "rotviz.zoo.nlp.generate",
        "files": {name: {"bytes": (folder / name).stat().st_size, "sha256": _sha(folder / name)}
                  for name in ("pydocs.txt", "pydoc-topics.jsonl", "pytokens.jsonl",
                               "pydocs-tokenizer/tokenizer.json")},
        "topics": {t: sum(r["label"] == t for r in topics) for t in TOPICS},
        "tags": list(TAGS),
        "rows": {"pydoc-topics": len(topics), "pytokens": len(code)},
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


if __name__ == "__main__":
    print(json.dumps(generate(), indent=2))

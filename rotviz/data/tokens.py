"""How a model reads text: its own tokenizer, or rotviz's character vocabulary when it says so.

Feeding a model ids from the wrong vocabulary gives numbers that look fine and mean nothing
(a BPE model fed character ids scores a barrier of 0), so the choice is never a guess:
- a model folder with tokenizer files is read with that tokenizer (`AutoTokenizer` from the
  local files; never remote code), which must encode a probe text as the folder's
  tokenizer.json does; where it does not, the file's own tokenizer is used, or refused;
- a model whose config declares `"rotviz_vocab": "chars"` (rotviz's own character models,
  and the random test models) is read with rotviz.data.text's character vocabulary;
- any other model given text is refused in one line.

Each encoding has a fingerprint (`chars`, or `tok:` and a hash of the tokenizer files). A
split records the one it was made with, and `rotviz.data.reading.check_fits` refuses a split
whose fingerprint is not the model's, so no consumer can feed the wrong ids, and a pair of
models whose tokenizers differ is refused before anything is computed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from rotviz.confine import ANYWHERE, MAX_JSON_BYTES, Confined
from rotviz.errors import RotvizError

CHARS = "chars"  # the fingerprint (and config value) of rotviz's character vocabulary
VOCAB_KEY = "rotviz_vocab"  # the config key a character model declares it with

# Files a Hugging Face tokenizer is saved as (any one of them marks a folder as having one).
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json",
)
_MARKS = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt",
          "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")
# Files an image processor or generation settings are saved as: an output folder carries them.
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "generation_config.json")


@dataclass(frozen=True)
class TextEncoding:
    """How one model reads text. `tokenizer` is None for the character vocabulary, which
    rotviz.data.text reads itself (`load_split` without a reader): the methods below are the
    tokenizer's."""

    fingerprint: str
    tokenizer: Any = None
    vocab_size: int = 0
    path: str = ""  # the folder the tokenizer was loaded from
    # what its files are read through (words_tokenizer reads them again)
    confined: Confined = field(default=ANYWHERE, compare=False, repr=False)

    @property
    def chars(self) -> bool:
        return self.tokenizer is None

    def encode(self, text: str):
        """The ids of `text` (a 1-D long tensor), without special tokens."""
        import torch

        ids = self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def mask_id(self) -> int:
        """The id masked-LM evaluation puts in place of a hidden token."""
        mid = self.tokenizer.mask_token_id
        if mid is None:
            raise RotvizError("the model's tokenizer has no mask token, which masked-LM "
                              "evaluation needs; save the tokenizer with its mask token")
        return int(mid)

    def words_tokenizer(self) -> Any:
        """The tokenizer for text already split into words (token classification). A
        byte-level BPE tokenizer (GPT-2, RoBERTa) needs `add_prefix_space` for that, as its
        model was trained with: loaded again with it where needed."""
        try:
            self.tokenizer(["a"], is_split_into_words=True)
            return self.tokenizer
        except (ValueError, TypeError, AssertionError):
            return _auto_tokenizer(Path(self.path), self.confined, add_prefix_space=True)

    @cached_property
    def ends(self) -> tuple[list[int], list[int]]:
        """The special tokens the tokenizer puts before and after one sequence ([CLS] and
        [SEP] for BERT, <s> and </s> for RoBERTa, nothing for GPT-2), read off how it encodes
        a short text with and without them (once per encoding)."""
        probe = "a b"
        bare = self.tokenizer(probe, add_special_tokens=False)["input_ids"]
        full = self.tokenizer(probe, add_special_tokens=True)["input_ids"]
        for i in range(len(full) - len(bare) + 1):
            if full[i : i + len(bare)] == bare:
                return list(full[:i]), list(full[i + len(bare):])
        raise RotvizError("cannot tell where the tokenizer puts its special tokens; save it "
                          "again with tokenizer.save_pretrained")


def tokenizer_files(folder: Path, confined: Confined = ANYWHERE) -> list[Path]:
    """The tokenizer files saved in `folder` (empty when it has none), each checked by
    `confined`: one that links out of the roots or is no regular file is refused, not
    skipped (a FIFO would block the tokenizer's reader)."""
    folder = Path(folder)
    if not any(os.path.lexists(folder / m) for m in _MARKS):
        return []
    present = [folder / f for f in TOKENIZER_FILES if os.path.lexists(folder / f)]
    for f in present:
        confined.file(f, "tokenizer file")
    return present


def fingerprint(files: list[Path], confined: Confined = ANYWHERE) -> str:
    h = hashlib.sha256()
    for f in sorted(files, key=lambda p: p.name):
        h.update(f.name.encode() + b"\0" + confined.read_bytes(f, "tokenizer file") + b"\0")
    return "tok:" + h.hexdigest()[:16]


def declares_chars(config: Mapping) -> bool:
    return config.get(VOCAB_KEY) == CHARS


def encoding_fingerprint(path: Path, config: Mapping, ref: str,
                         confined: Confined = ANYWHERE) -> str:
    """The fingerprint of how the model at `path` reads text, without loading a tokenizer."""
    files = tokenizer_files(path, confined)
    if files:
        return fingerprint(files, confined)
    if declares_chars(config):
        return CHARS
    raise RotvizError(no_encoding(ref))


def no_encoding(ref: str) -> str:
    return (f"{ref} has no tokenizer files and does not declare rotviz's character vocabulary "
            f"(config \"{VOCAB_KEY}\": \"{CHARS}\"); save its tokenizer into the folder "
            "(tokenizer.save_pretrained) so rotviz can feed it text")


def text_encoding(path: Path, config: Mapping, ref: str,
                  confined: Confined = ANYWHERE) -> TextEncoding:
    """How the model at `path` reads text (see the module): one line when it cannot. Its
    files are read through `confined`."""
    files = tokenizer_files(path, confined)
    if not files:
        if declares_chars(config):
            from rotviz.data.text import VOCAB_SIZE

            return TextEncoding(CHARS, None, VOCAB_SIZE)
        raise RotvizError(no_encoding(ref))
    tok = _auto_tokenizer(path, confined)
    return TextEncoding(fingerprint(files, confined), tok, len(tok), str(path), confined)


def _auto_tokenizer(path: Path, confined: Confined = ANYWHERE, **kwargs: Any) -> Any:
    """The folder's tokenizer: `AutoTokenizer` from its own files (never remote code),
    verified against its tokenizer.json (`verified_tokenizer`), or one line. With `kwargs`
    (a variant asked for, such as add_prefix_space for words) it is taken as loaded, since
    such a variant encodes otherwise by design. Its files are read through `confined`."""
    tok = _transformers_tokenizer(path, confined, **kwargs)
    return tok if kwargs else verified_tokenizer(tok, path, confined)


def _transformers_tokenizer(path: Path, confined: Confined, **kwargs: Any) -> Any:
    """`AutoTokenizer` from the folder's own files (never remote code), or one line. It
    opens what it finds in the folder, so the whole folder is checked by `confined` first."""
    confined.check_tree(path, "model folder")
    try:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                             trust_remote_code=False, **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure is one line about the folder
        msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else e.__class__.__name__
        raise RotvizError(f"cannot load the tokenizer saved in '{path}' ({msg}); save it "
                          "again with tokenizer.save_pretrained") from None


# ---- verification ------------------------------------------------------------------------------

# What a tokenizer must encode as the folder's tokenizer.json does: several scripts, accents,
# digits, runs of spaces, tabs and newlines (\r\n too), punctuation and code; no leading space,
# so that a tokenizer that adds a prefix space the file does not shows at the first word.
PROBE = ("Hello, World! The year 2024: 3.14 + 42 = 45.14 (ok?) -- naïve café, Grüße; "
         "Привет, мир; Γειά σου; 東京タワー 2024年; 안녕하세요; مرحبا; שלום; हिन्दी 😀\n"
         "def f(x):\n\treturn x[0] * 2   # done...  'quoted' \"too\" {a: 1} <tag/> ~ @ $ %\r\n"
         "\n  indented, then trailing spaces  ")
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                "mask_token")


def verified_tokenizer(tok: Any, path: Path, confined: Confined = ANYWHERE) -> Any:
    """`tok` when the folder has no tokenizer.json or `tok` encodes PROBE to the same ids as
    that file does (read by the `tokenizers` library itself); else the file's own tokenizer,
    wrapped for transformers with the folder's special tokens and verified the same way; else
    one line. transformers may build a tokenizer class from other settings than the file (5.x
    reads a Qwen2 folder's Unigram tokenizer.json as Qwen2's byte-level BPE), and a model fed
    another tokenizer's ids scores as if it knew nothing."""
    file = Path(path) / "tokenizer.json"
    if not os.path.lexists(file):
        return tok
    own = file_tokenizer(file, confined)
    want = own.encode(PROBE, add_special_tokens=False).ids
    if _probe_ids(tok) == want:
        return tok
    fast = _wrapped(own, Path(path), confined)
    if _probe_ids(fast) == want:
        return fast
    raise RotvizError(f"the tokenizer saved in '{path}' does not encode text as its "
                      "tokenizer.json does, and the file's own tokenizer cannot be used in its "
                      "place; save it again with tokenizer.save_pretrained")


def file_tokenizer(file: Path, confined: Confined = ANYWHERE) -> Any:
    """A tokenizer.json as the `tokenizers` library reads it, without truncation or padding
    (a transformers tokenizer applies those per call), or one line."""
    from tokenizers import Tokenizer

    text = confined.read_text(file, "tokenizer file", MAX_JSON_BYTES)
    try:
        own = Tokenizer.from_str(text)
    except Exception as e:  # noqa: BLE001 - the library's parse errors are one line here
        msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else e.__class__.__name__
        raise RotvizError(f"cannot read the tokenizer file '{file}' ({msg}); save the "
                          "tokenizer again with tokenizer.save_pretrained") from None
    own.no_truncation()
    own.no_padding()
    return own


def _probe_ids(tok: Any) -> list[int] | None:
    """The ids `tok` (a transformers tokenizer) gives PROBE; None when it cannot encode it."""
    try:
        return list(tok(PROBE, add_special_tokens=False, verbose=False)["input_ids"])
    except Exception:  # noqa: BLE001 - a tokenizer that fails the probe fails verification
        return None


def _special_tokens(path: Path, own: Any, confined: Confined) -> dict[str, Any]:
    """The special tokens the folder's tokenizer_config.json and special_tokens_map.json name
    (the map wins, as transformers reads it), kept only where the file's vocabulary has
    them: a token added here would shift no ids but would grow the vocabulary past the
    model's embeddings. Also the config's model_max_length."""
    out: dict[str, Any] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if not os.path.lexists(path / name):
            continue
        settings = confined.read_json(path / name, "save the tokenizer again with "
                                      "tokenizer.save_pretrained", "tokenizer file")
        if not isinstance(settings, dict):
            continue
        for key in SPECIAL_KEYS:
            value = settings.get(key)
            token = value.get("content") if isinstance(value, dict) else value
            if isinstance(token, str) and own.token_to_id(token) is not None:
                out[key] = token
        length = settings.get("model_max_length")
        if isinstance(length, int) and not isinstance(length, bool) and length > 0:
            out["model_max_length"] = length
    return out


def _wrapped(own: Any, path: Path, confined: Confined) -> Any:
    """The file's own tokenizer as a transformers PreTrainedTokenizerFast (None when
    transformers refuses it: verification then fails in one line)."""
    try:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=own,
                                       **_special_tokens(path, own, confined))
    except RotvizError:
        raise
    except Exception:  # noqa: BLE001 - reported as the failed verification
        return None


# ---- images -------------------------------------------------------------------------------------

PROCESSOR_FILE = "preprocessor_config.json"


@dataclass(frozen=True)
class ImageReading:
    """How one image model reads images: its folder's image processor (resize, crop,
    normalise) and the processor's fingerprint, which splits made with it record."""

    fingerprint: str
    processor: Any

    def pixels(self, images: list) -> Any:
        """The processor's pixel values of PIL images (any sizes) as one float tensor."""
        out = self.processor(images=images, return_tensors="pt")
        return out["pixel_values"].float()


def processor_fingerprint(path: Path, confined: Confined = ANYWHERE) -> str:
    """"" for a model without an image processor, else a hash of its settings (a file that
    links out of the roots or is no regular file is refused)."""
    f = Path(path) / PROCESSOR_FILE
    if not os.path.lexists(f):
        return ""
    confined.file(f, "image processor file")
    return fingerprint([f], confined).replace("tok:", "proc:")


def image_reading(path: Path, confined: Confined = ANYWHERE) -> ImageReading | None:
    """The model folder's image processor (`AutoImageProcessor` from its local file, never
    remote code), or None when the folder has none (images are then read as they are).
    The whole folder is checked by `confined` before transformers opens what it finds."""
    fp = processor_fingerprint(path, confined)
    if not fp:
        return None
    confined.check_tree(path, "model folder")
    try:
        from transformers import AutoImageProcessor
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        proc = AutoImageProcessor.from_pretrained(str(path), local_files_only=True,
                                                  trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - any failure is one line about the folder
        msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else e.__class__.__name__
        raise RotvizError(f"cannot load the image processor saved in '{path}' ({msg}); save "
                          "it again with image_processor.save_pretrained") from None
    return ImageReading(fp, proc)

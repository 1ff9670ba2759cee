"""How a model reads text: its own tokenizer, or rotviz's character vocabulary when it says so.

Feeding a model ids from the wrong vocabulary gives numbers that look fine and mean nothing
(a BPE model fed character ids scores a barrier of 0), so the choice is never a guess:
- a model folder with tokenizer files is read with that tokenizer (`AutoTokenizer` from the
  local files; never remote code);
- a model whose config declares `"rotviz_vocab": "chars"` (rotviz's own character models,
  and the random test models) is read with `rotviz.data`'s character vocabulary;
- any other model given text is refused in one line.

Each encoding has a fingerprint (`chars`, or `tok:` and a hash of the tokenizer files). A
split records the one it was made with, and `rotviz.evaluation.check_fits` refuses a split
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

from rotviz.confine import ANYWHERE, Confined
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
    rotviz.data reads itself (`load_split` without a reader): the methods below are the
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
            from rotviz.data import VOCAB_SIZE

            return TextEncoding(CHARS, None, VOCAB_SIZE)
        raise RotvizError(no_encoding(ref))
    tok = _auto_tokenizer(path, confined)
    return TextEncoding(fingerprint(files, confined), tok, len(tok), str(path), confined)


def _auto_tokenizer(path: Path, confined: Confined = ANYWHERE, **kwargs: Any) -> Any:
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

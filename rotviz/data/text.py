"""Text data read as windows of tokens: rotviz's fixed character vocabulary (`CHARS`) for the
character models that declare it, or the model's own tokenizer (a rotviz.data.tokens reader);
the `pystdlib` corpus built from the standard library's own source files, and `text:FILE`.

The readers return a split's fields (task, tensors, vocabulary, reading); rotviz.data.split's
`load_split` makes them a `Split`.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rotviz.confine import ANYWHERE, Confined
from rotviz.data.files import data_file, read_text
from rotviz.data.splits import IGNORE
from rotviz.data.splits import tenth_split as _tenth_split
from rotviz.errors import RotvizError

MASK_RATE = 0.15  # masked-LM evaluation hides this fraction of each window's tokens (seeded)


UNK = 0
CHARS = "\t\n" + "".join(chr(c) for c in range(32, 127))  # id = 1 + position; 0 = anything else
VOCAB_SIZE = 1 + len(CHARS)
CONTEXT = 64  # characters of input per text window (the window holds one more, the last target)
_CODE = np.zeros(128, dtype=np.int64)
_CODE[[ord(c) for c in CHARS]] = np.arange(1, VOCAB_SIZE)

# Old, small, rarely edited pure-Python modules: the pystdlib corpus, in this order.
PYSTDLIB_FILES = (
    "colorsys.py", "bisect.py", "heapq.py", "fnmatch.py", "textwrap.py", "shlex.py", "sched.py",
    "queue.py", "string.py", "graphlib.py", "numbers.py", "reprlib.py", "copy.py", "operator.py",
    "abc.py", "functools.py", "difflib.py", "pprint.py", "fractions.py", "statistics.py",
)




def encode(text: str) -> torch.Tensor:
    """Character ids in the fixed vocabulary (unknown characters -> UNK = 0)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    out = np.zeros(len(codes), dtype=np.int64)
    ascii_ = codes < 128
    out[ascii_] = _CODE[codes[ascii_]]
    return torch.from_numpy(out)


def decode(ids) -> str:
    return "".join(CHARS[i - 1] if 0 < i < VOCAB_SIZE else "\ufffd" for i in map(int, ids))


def text_windows(ids: torch.Tensor, context: int = CONTEXT) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping windows: inputs ids[s : s+T], targets ids[s+1 : s+T+1], s = 0, T, 2T..."""
    n = (len(ids) - 1) // context
    if n <= 0:
        return torch.zeros(0, context, dtype=torch.long), torch.zeros(0, context, dtype=torch.long)
    x = ids[: n * context].reshape(n, context)
    y = ids[1 : n * context + 1].reshape(n, context)
    return x, y


def _text_split(name: str, text: str, split: str, seed: int, reader: Any = None,
                masked: bool = False, seq_len: int | None = None) -> dict[str, Any]:
    """Windows of `seq_len` tokens (default CONTEXT) of `text`, read by `reader` (a
    rotviz.data.tokens.TextEncoding; None: the character vocabulary), as next-token data or,
    `masked`, as seeded masked-LM data; the windows are split 80/10/10 by `seed`."""
    how = {"seed": seed, "reader": reader, "masked": masked, "seq_len": seq_len}
    length = int(seq_len or CONTEXT)
    if length < 2:
        raise RotvizError(f"text windows need at least 2 tokens, got a length of {length}")
    ids = encode(text) if reader is None else reader.encode(text)
    vocab = VOCAB_SIZE if reader is None else reader.vocab_size
    encoding = "chars" if reader is None else reader.fingerprint
    if not masked:
        x, y = text_windows(ids, length)
        task = "text"
    else:
        x, y = _masked_windows(ids, length, reader, seed, name)
        task = "masked"
    if len(x) < 3:
        raise RotvizError(
            f"'{name}' gives {len(x)} windows of {length} tokens; it needs at least 3 (train, "
            "val and test): use a longer text or shorter windows"
        )
    idx = torch.as_tensor(_tenth_split(len(x), seed)[split], dtype=torch.long)
    return {"task": task, "inputs": x[idx], "labels": y[idx], "n_classes": vocab,
            "encoding": encoding, "how": how}


def _masked_windows(ids: torch.Tensor, length: int, reader: Any, seed: int,
                    name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows as a masked LM reads them: the tokenizer's special tokens around `length`
    tokens in all, MASK_RATE of the ordinary tokens (at least one per window, chosen with
    `seed`) replaced by the mask id; the labels hold the hidden ids there, IGNORE elsewhere.
    The character vocabulary has no special tokens and no mask symbol: it masks with UNK."""
    before, after = ([], []) if reader is None else reader.ends
    body = length - len(before) - len(after)
    if body < 1:
        raise RotvizError(f"windows of {length} tokens leave no room for text beside the "
                          f"{len(before) + len(after)} special tokens; use longer windows")
    n = len(ids) // body
    if n == 0:
        return torch.zeros(0, length, dtype=torch.long), torch.zeros(0, length, dtype=torch.long)

    def column(tokens: list[int]) -> torch.Tensor:
        return torch.tensor(tokens, dtype=torch.long).expand(n, len(tokens))

    x = torch.cat([column(before), ids[: n * body].reshape(n, body), column(after)], 1)
    ordinary = torch.zeros_like(x, dtype=torch.bool)  # the text's own tokens, not specials
    ordinary[:, len(before) : len(before) + body] = True
    rng = np.random.default_rng([seed, 7919])  # one draw for the whole corpus: every split
    draw = torch.from_numpy(rng.random(x.shape))
    draw[~ordinary] = 2.0  # never chosen
    hide = draw < MASK_RATE
    first = draw.argmin(1)  # at least one hidden token in each window
    hide[torch.arange(n), first] = True
    hide &= ordinary
    y = torch.full_like(x, IGNORE)
    y[hide] = x[hide]
    x[hide] = reader.mask_id() if reader is not None else UNK
    return x, y


def stdlib_dir() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["stdlib"])


def pystdlib_text() -> str:
    """The pystdlib corpus: the files of PYSTDLIB_FILES, each preceded by a `# file:` line.

    Files are read as UTF-8 with universal newlines, so the text does not depend on the
    platform. It does depend on the Python version (patch releases occasionally edit these
    files); `pystdlib_fingerprint()` identifies the exact corpus and the zoo cards record it.
    """
    root = stdlib_dir()
    parts = []
    for name in PYSTDLIB_FILES:
        path = root / name
        if not path.is_file():
            raise RotvizError(
                f"the pystdlib corpus needs the standard library source '{path}', which is "
                "missing; use a Python install that ships its .py sources"
            )
        parts.append(f"# file: {name}\n" + read_text(path, ANYWHERE, "standard library file"))
    return "\n".join(parts)


def pystdlib_fingerprint() -> dict:
    """What the pystdlib corpus is on this machine: python version, characters, sha256."""
    text = pystdlib_text()
    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "files": list(PYSTDLIB_FILES),
        "chars": len(text),
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }


def pystdlib(split: str, seed: int = 0, **reading) -> dict[str, Any]:
    """A text corpus from the standard library's own source, in windows of CONTEXT tokens
    (`reading`: how the model reads it, see `_text_split`)."""
    return _text_split("pystdlib", pystdlib_text(), split, seed, **reading)


def text_file(path: str, split: str, seed: int = 0, confined: Confined = ANYWHERE,
              **reading) -> dict[str, Any]:
    """Any UTF-8 text file, in windows of CONTEXT tokens (10% test, 10% val, by seeded
    windows; `reading`: how the model reads it, see `_text_split`), read through
    `confined`."""
    file = data_file(path, "text", confined)
    text = read_text(file, confined, "text: data")
    need = 3 * CONTEXT + 1
    if len(text) < need:
        raise RotvizError(
            f"'{file}' has {len(text)} characters; a text data file needs at least {need} "
            f"(three {CONTEXT}-character windows for train, val and test)"
        )
    out = _text_split(f"text:{path}", text, split, seed, **reading)
    out["how"]["confined"] = confined  # its other splits are read the same way (`sibling`)
    return out


# ---- user images ------------------------------------------------------------------------------


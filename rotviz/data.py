"""Offline data sources with fixed, seeded splits.

A data reference is a short string: `digits`, `pystdlib`, `cifar10:DIR`, `imagefolder:DIR`
or `text:FILE`. `load_split(ref, split)` returns a `Split` of ready tensors.

Nothing is downloaded: `digits` is scikit-learn's bundled copy (read straight from its CSV,
which avoids importing scikit-learn), `pystdlib` is built from the Python standard library's
own source files, and the rest are the user's files. Text is read the way the model reads it
(rotviz.tokens): with its own tokenizer, or with rotviz's fixed character vocabulary (`CHARS`)
for the character models that declare it; `rotviz.evaluation.split_for` picks the reading.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import pickle
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rotviz.confine import ANYWHERE, Confined
from rotviz.datafiles import (
    CIFAR_FORMAT,
    IMAGEFOLDER_FORMAT,
    cifar_files,
    cifar_meta,
    data_file,
    data_folder,
    image_classes,
    read_text,
)
from rotviz.errors import RotvizError
from rotviz.labelled import LABELLED_KINDS, labelled_split
from rotviz.splits import IGNORE, SPLITS
from rotviz.splits import split_indices as _split_indices
from rotviz.splits import tenth_split as _tenth_split

# A batch's inputs: one tensor (the spec's input key), or named inputs (padded text)
Inputs = torch.Tensor | dict[str, torch.Tensor]
MASK_RATE = 0.15  # masked-LM evaluation hides this fraction of each window's tokens (seeded)

def map_inputs(x: Inputs, fn) -> Inputs:
    """`fn` applied to a batch's input tensor, or to each of its named inputs."""
    return fn(x) if isinstance(x, torch.Tensor) else {k: fn(v) for k, v in x.items()}


def to_device(x: Inputs, device: torch.device | str,
              dtype: torch.dtype | None = None) -> Inputs:
    """A batch's inputs on `device`; with `dtype`, floating inputs (images) in it too, as the
    module that reads them holds its weights (timm casts nothing itself: a model held in
    float64 takes float64 images)."""
    if dtype is None:
        return map_inputs(x, lambda t: t.to(device))
    return map_inputs(x, lambda t: t.to(device, dtype) if t.is_floating_point()
                      else t.to(device))


def without_padding(h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The rows of activations `h` (batch, positions, features) at real tokens, as
    (tokens, features); `h` as it is when there is no mask or it is not per position (a
    classifier head's pooled input). Statistics of activations never count padding."""
    if mask is None or h.dim() != 3 or tuple(h.shape[:2]) != tuple(mask.shape):
        return h
    return h[mask.bool()]


def cat_inputs(parts: list[Inputs]) -> Inputs:
    """Batches of one split (padded alike) as one batch."""
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def n_rows(x: Inputs) -> int:
    return int((x if isinstance(x, torch.Tensor) else x["input_ids"]).shape[0])


def token_mask(x: Inputs) -> torch.Tensor | None:
    """Which positions hold real tokens (None: every position does)."""
    return None if isinstance(x, torch.Tensor) else x.get("attention_mask")


# ---- the character vocabulary -----------------------------------------------------------------

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


@dataclass(frozen=True)
class Split:
    """One split of a data source, as tensors on the CPU.

    Images: `inputs` (N, C, H, W) float32, `labels` (N,) long, `n_classes` classes.
    Text (`task` "text", for causal LMs): `inputs` (N, T) long token ids, `labels` (N, T) the
    next token's id. Text for masked LMs (`task` "masked"): `inputs` with a seeded 15% of the
    tokens replaced by the mask id, `labels` the hidden ids there and IGNORE elsewhere.
    `n_classes` is the vocabulary's size, and `encoding` the fingerprint of the vocabulary the
    ids come from (rotviz.tokens; "" for images): models check it before they read a split.
    """

    data: str
    split: str
    task: str  # "image", "text" (next token) or "masked" (masked LM)
    inputs: torch.Tensor
    labels: torch.Tensor
    n_classes: int
    encoding: str = ""
    how: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # Further model inputs, one row per example (padded text: attention_mask, token_type_ids)
    extra: dict[str, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)
    label_names: tuple[str, ...] = ()  # a classifier's label names, by id (F1 reads BIO tags)

    @property
    def n(self) -> int:
        return int(self.inputs.shape[0])

    def batches(self, batch_size: int = 256) -> Iterator[tuple[Inputs, torch.Tensor]]:
        """Fixed-order batches (evaluation needs no shuffling): the inputs (one tensor, or
        the named inputs when the split has `extra` ones) and the labels."""
        for i in range(0, self.n, batch_size):
            yield self.inputs_at(slice(i, i + batch_size)), self.labels[i : i + batch_size]

    def inputs_at(self, index) -> Inputs:
        """The inputs of the examples at `index` (one tensor, or the named inputs)."""
        if not self.extra:
            return self.inputs[index]
        return {"input_ids": self.inputs[index], **{k: v[index] for k, v in self.extra.items()}}

    def _with(self, index) -> Split:
        return Split(self.data, self.split, self.task, self.inputs[index], self.labels[index],
                     self.n_classes, self.encoding, self.how,
                     {k: v[index] for k, v in self.extra.items()}, self.label_names)

    def subset(self, n: int) -> Split:
        return self._with(slice(0, n))

    def take(self, index: torch.Tensor) -> Split:
        """The examples at `index` (e.g. one half of the training set for a fine-tune)."""
        return self._with(index)

    def sibling(self, split: str) -> Split:
        """Another split of the same data, read the same way (vocabulary, masking, length)."""
        return load_split(self.data, split, **self.how)


# ---- digits -----------------------------------------------------------------------------------


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits (1797 x 64 pixels in 0..16, labels 0..9)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        csv = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if csv.is_file():
            table = np.loadtxt(csv, delimiter=",")
            return table[:, :-1], table[:, -1].astype(np.int64)
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise RotvizError("the digits data needs scikit-learn: pip install scikit-learn") from None
    bunch = load_digits()
    return bunch.data, bunch.target


def digits(split: str, seed: int = 0) -> Split:
    """scikit-learn's bundled 8x8 digits, scaled to [0, 1]; 397 test, 200 val, 1200 train."""
    pixels, target = _digits_arrays()
    x = torch.tensor(pixels.reshape(-1, 8, 8) / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(target, dtype=torch.long)
    idx = torch.as_tensor(_split_indices(len(y), seed, 200, 397)[split])
    return Split("digits", split, "image", x[idx], y[idx], 10, "", {"seed": seed})


# ---- text -------------------------------------------------------------------------------------


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
                masked: bool = False, seq_len: int | None = None) -> Split:
    """Windows of `seq_len` tokens (default CONTEXT) of `text`, read by `reader` (a
    rotviz.tokens.TextEncoding; None: the character vocabulary), as next-token data or,
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
    return Split(name, split, task, x[idx], y[idx], vocab, encoding, how)


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


def pystdlib(split: str, seed: int = 0, **reading) -> Split:
    """A text corpus from the standard library's own source, in windows of CONTEXT tokens
    (`reading`: how the model reads it, see `_text_split`)."""
    return _text_split("pystdlib", pystdlib_text(), split, seed, **reading)


def text_file(path: str, split: str, seed: int = 0, confined: Confined = ANYWHERE,
              **reading) -> Split:
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
    out.how["confined"] = confined  # its other splits are read the same way (`sibling`)
    return out


# ---- user images ------------------------------------------------------------------------------


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only: a data file never runs code."""

    ALLOWED = {
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("copyreg", "_reconstructor"), ("builtins", "object"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _read_cifar_batch(file: Path, confined: Confined) -> tuple[np.ndarray, np.ndarray]:
    data = confined.read_bytes(file, "CIFAR-10 batch")
    try:
        obj = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            ImportError, IndexError, KeyError, OverflowError) as e:
        raise RotvizError(
            f"cannot read '{file}' ({e.__class__.__name__}: {e}); expected {CIFAR_FORMAT}"
        ) from None
    if not isinstance(obj, dict):
        raise RotvizError(
            f"'{file}' holds a {type(obj).__name__}, not a dict; expected {CIFAR_FORMAT}"
        )
    obj = {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}
    labels = obj.get("labels", obj.get("fine_labels"))
    if "data" not in obj or labels is None:
        raise RotvizError(
            f"'{file}' has keys {sorted(map(str, obj))[:6]} but needs 'data' and 'labels'; "
            f"expected {CIFAR_FORMAT}"
        )
    data = np.asarray(obj["data"])
    labels = np.asarray(labels)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise RotvizError(
            f"'{file}': 'data' is {data.dtype} {data.shape}, expected uint8 (N, 3072) rows of "
            "3x32x32 pixels"
        )
    if labels.ndim != 1 or len(labels) != len(data) or not np.issubdtype(labels.dtype, np.integer):
        raise RotvizError(f"'{file}': 'labels' must be {len(data)} integers, one per row of "
                          f"'data'; expected {CIFAR_FORMAT}")
    return data, labels.astype(np.int64)


def cifar10(path: str, split: str, seed: int = 0, processor: Any = None,
            confined: Confined = ANYWHERE) -> Split:
    """CIFAR-10 python batches: test = test_batch, val = a seeded tenth of the train batches
    (read through `confined`)."""
    root = data_folder(path, "cifar10", confined)
    files = cifar_files(root, split, confined)
    parts = [_read_cifar_batch(f, confined) for f in files]
    data = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    n_classes = _cifar_classes(root, labels, confined)
    if split != "test":
        k = max(1, round(len(data) / 10)) if len(data) >= 2 else 0
        idx = _split_indices(len(data), seed, k, 0)[split]
        data, labels = data[idx], labels[idx]
    if processor is not None:  # the model's own resize, crop and normalisation
        from PIL import Image

        images = [Image.fromarray(a) for a in data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)]
        x = processor.pixels(images) if images else torch.zeros(0, 3, 32, 32)
    else:
        x = torch.tensor(data.reshape(-1, 3, 32, 32), dtype=torch.float32) / 255.0
    return Split(f"cifar10:{path}", split, "image", x, torch.tensor(labels), n_classes,
                 processor.fingerprint if processor is not None else "",
                 {"seed": seed, "processor": processor, "confined": confined})


def _cifar_classes(root: Path, labels: np.ndarray, confined: Confined) -> int:
    meta = cifar_meta(root, confined)  # a meta file that links out is refused, not skipped
    if meta is not None:
        data = confined.read_bytes(meta, "CIFAR-10 batches.meta")
        try:
            obj = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
            names = None
            if isinstance(obj, dict):
                names = obj.get(b"label_names", obj.get("label_names"))
            if names:
                return len(names)
        except Exception:  # an odd meta file only loses the class names: count labels instead
            pass
    return max(10, int(labels.max()) + 1 if len(labels) else 0)


# Images are refused from their header above these sizes, before anything is decoded
# (a 12000x12000 PNG decodes to 432 MB of float32 pixels per channel).
MAX_IMAGE_PIXELS = 4096 * 4096
MAX_FOLDER_PIXELS = 2**29  # all images of a folder together: 2 GiB of float32 per channel


@contextlib.contextmanager
def _open_image(f: Path, confined: Confined) -> Iterator[Any]:
    """A PIL image of the file `f`, opened through `confined` (never by path); PIL does not
    close a file object it is given, so both are closed here."""
    from PIL import Image

    with confined.open(f, "image") as fh, Image.open(fh) as im:
        yield im


def _image_size(f: Path, confined: Confined) -> tuple[int, int]:
    """Width and height from the file's header; huge or unreadable images are refused."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PIL's DecompressionBombWarning: checked below
            with _open_image(f, confined) as im:
                w, h = im.size
    except Image.DecompressionBombError:  # PIL's own bound, far above ours
        raise RotvizError(f"'{f}' is above rotviz's bound of {MAX_IMAGE_PIXELS:,} pixels per "
                          "image; resize the images") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise RotvizError(f"'{f}' is not a readable image ({e.__class__.__name__}); "
                          f"expected {IMAGEFOLDER_FORMAT}") from None
    if w * h > MAX_IMAGE_PIXELS:
        raise RotvizError(f"'{f}' is {w}x{h} pixels, above rotviz's bound of "
                          f"{MAX_IMAGE_PIXELS:,} pixels per image; resize the images")
    return w, h


def imagefolder(path: str, split: str, seed: int = 0, processor: Any = None,
                names: tuple[str, ...] | None = None,
                confined: Confined = ANYWHERE) -> Split:
    """One subfolder per class, named after the class.

    Class ids: with `names` (the model's label names by output id, rotviz.tasks.named_labels)
    a folder's id is its name's id, and the folders must be exactly those names (one line
    naming the differences otherwise); without (a model whose labels are unnamed) the sorted
    folder names are the ids, as the model cannot say otherwise.
    Without a processor: images of one size; grayscale folders give 1 channel, anything else
    RGB; pixels scaled to [0, 1]. With the model's image processor (rotviz.tokens.ImageReading):
    any sizes, as RGB, resized, cropped and normalised by it.
    Split: a seeded 10% test and 10% val over all images, ordered by (class id, file name),
    so that the split does not depend on what the folders are called: folders renamed from
    0..9 to a model's own names give the same images, with the same labels.
    Every class folder and image is read through `confined` (rotviz.datafiles.image_classes).
    """
    from PIL import UnidentifiedImageError

    root = data_folder(path, "imagefolder", confined)
    found = image_classes(root, confined)
    classes = [folder for folder, _ in found]
    class_id = _class_ids(root, [p.name for p in classes], names)
    files: list[tuple[Path, int]] = [(f, class_id[folder.name])
                                     for folder, images_of in found for f in images_of]
    files.sort(key=lambda fl: (fl[1], fl[0].name))  # by class id: the folders' names aside
    sizes = [_image_size(f, confined) for f, _ in files]  # headers only: nothing decoded yet
    first = sizes[0]
    odd = next(((f, size) for (f, _), size in zip(files, sizes, strict=True) if size != first),
               None)
    if odd is not None and processor is None:
        raise RotvizError(f"images differ in size ('{files[0][0]}' is {first[0]}x{first[1]}, "
                          f"'{odd[0]}' is {odd[1][0]}x{odd[1][1]}); resize them to one size, or "
                          "save the model's image processor (preprocessor_config.json) with it")
    if sum(w * h for w, h in sizes) > MAX_FOLDER_PIXELS:
        raise RotvizError(f"'{root}' holds {len(files)} images, more than "
                          f"{MAX_FOLDER_PIXELS:,} pixels in all; use fewer or smaller images")
    images = []
    for f, _ in files:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # sizes are bounded above
                with _open_image(f, confined) as im:
                    im.load()
                    images.append(im.copy())
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
            raise RotvizError(f"'{f}' is not a readable image ({e.__class__.__name__}); "
                              f"expected {IMAGEFOLDER_FORMAT}") from None
    y = torch.tensor([label for _, label in files], dtype=torch.long)
    idx = torch.as_tensor(_tenth_split(len(y), seed)[split], dtype=torch.long)
    how = {"seed": seed, "processor": processor, "names": names, "confined": confined}
    by_id = tuple(sorted(class_id, key=class_id.__getitem__))  # the class names, by id
    if processor is not None:  # the model's own resize, crop and normalisation
        chosen = [images[i].convert("RGB") for i in idx.tolist()]
        x = processor.pixels(chosen) if chosen else torch.zeros(0, 3, 1, 1)
        return Split(f"imagefolder:{path}", split, "image", x, y[idx], len(classes),
                     processor.fingerprint, how, label_names=by_id)
    gray = all(im.mode in ("1", "L", "I", "I;16", "F") for im in images)
    mode = "L" if gray else "RGB"
    arrays = [np.asarray(im.convert(mode), dtype=np.float32) / 255.0 for im in images]
    x = torch.tensor(np.stack(arrays))
    x = x.unsqueeze(1) if gray else x.permute(0, 3, 1, 2).contiguous()
    return Split(f"imagefolder:{path}", split, "image", x[idx], y[idx], len(classes), "", how,
                 label_names=by_id)


def _class_ids(root: Path, folders: list[str], names: tuple[str, ...] | None
               ) -> dict[str, int]:
    """Each class folder's id: its name's id among the model's label `names`, or, for a
    model without named labels, its place in sorted order. One line when the folders are
    not the model's labels (a folder no label is called, a label with no folder): reading
    them by place would score the model against labels it never meant."""
    if names is None:
        return {name: i for i, name in enumerate(sorted(folders))}
    have = set(folders)
    no_label = sorted(have - set(names))
    no_folder = [n for n in names if n not in have]
    if no_label or no_folder:
        def some(items: list[str]) -> str:
            shown = ", ".join(items[:6]) + (f" and {len(items) - 6} more" if len(items) > 6
                                            else "")
            return shown or "none"

        raise RotvizError(
            f"the class folders of '{root}' are not the model's labels (folders with no "
            f"label: {some(no_label)}; labels with no folder: {some(no_folder)}); name one "
            "class folder after each label of the model's config.json id2label")
    index = {name: i for i, name in enumerate(names)}
    return {name: index[name] for name in folders}


# ---- references -------------------------------------------------------------------------------

KNOWN = ("digits, pystdlib, cifar10:DIR, imagefolder:DIR, text:FILE, csv:FILE, tsv:FILE, "
         "jsonl:FILE, conll:FILE or hf:DIR")


TEXT_SOURCES = ("pystdlib", "text")
IMAGE_FILES = ("cifar10", "imagefolder")  # read through the model's image processor, if any


def check_ref(ref: str) -> None:
    """Refuse, in one line and before any model or data is read, a data reference
    `load_split` could never read: an unknown kind, or a kind that needs a path given none.
    The same words as `load_split`'s, which keeps the full check (the files themselves)."""
    kind, _, arg = str(ref).partition(":")
    if kind in LABELLED_KINDS or (kind in ("digits", "pystdlib") and not arg):
        return
    if kind in ("cifar10", "imagefolder", "text"):
        if not arg:
            raise RotvizError(f"'{ref}' names no path: write {kind}:PATH")
        return
    raise RotvizError(f"unknown data '{ref}': use {KNOWN}")


def load_split(ref: str, split: str = "test", seed: int = 0, reader: Any = None,
               masked: bool = False, seq_len: int | None = None,
               labelling: Any = None, processor: Any = None,
               names: tuple[str, ...] | None = None,
               confined: Confined = ANYWHERE) -> Split:
    """Load one split of a data reference. Text is read by `reader` (the model's
    rotviz.tokens.TextEncoding; None: rotviz's character vocabulary), as masked-LM data when
    `masked`, in windows of `seq_len` tokens; labelled text (rotviz.labelled) for the
    classifier `labelling` describes; image data ignores these, and an image folder's
    classes are the model's label `names` (rotviz.tasks.named_labels; None: sorted folder
    names). To read data the way a given model does, use `rotviz.evaluation.split_for`.
    Every file is read through `confined` (rotviz.confine: regular files only; in the app,
    only inside its roots)."""
    if split not in SPLITS:
        raise RotvizError(f"unknown split '{split}': use one of {', '.join(SPLITS)}")
    kind, _, arg = ref.partition(":")
    if kind in LABELLED_KINDS:
        if labelling is None:
            raise RotvizError(f"'{ref}' is labelled data, read for one classifier: load it "
                              "through the model (rotviz.evaluation.split_for)")
        ids, labels, extra = labelled_split(ref, split, seed, reader, labelling, confined)
        how = {"seed": seed, "reader": reader, "labelling": labelling, "confined": confined}
        out = Split(ref, split, labelling.task, ids, labels, labelling.num_labels,
                    reader.fingerprint, how, extra, labelling.names)
        if out.n == 0:
            raise RotvizError(f"the {split} split of '{ref}' is empty; use more rows")
        return out
    plain = {"digits": digits, "pystdlib": pystdlib}
    with_path = {"cifar10": cifar10, "imagefolder": imagefolder, "text": text_file}
    reading = ({"reader": reader, "masked": masked, "seq_len": seq_len}
               if kind in TEXT_SOURCES else {"processor": processor} if kind in IMAGE_FILES
               else {})
    if kind == "imagefolder":
        reading["names"] = names
    if kind in plain and not arg:
        out = plain[kind](split, seed, **reading)
    elif kind in with_path:
        if not arg:
            raise RotvizError(f"'{ref}' names no path: write {kind}:PATH")
        out = with_path[kind](arg, split, seed, confined=confined, **reading)
    else:
        raise RotvizError(f"unknown data '{ref}': use {KNOWN}")
    if out.n == 0:
        raise RotvizError(
            f"the {split} split of '{ref}' is empty; use a larger data set or another split"
        )
    return out

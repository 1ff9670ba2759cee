"""Which files reading a data reference opens, each resolved through a `Confined` reader.

The data loaders (rotviz.data.split, rotviz.data.labelled) open only the files these functions hand
them, and the app lists (rotviz.app.roots.discover_data) and accepts
(rotviz.app.roots.resolve_data) only the data for which `check_data` succeeds, so offered
data is checked exactly like typed data.
A `Confined` refuses anything that is not a regular file (a FIFO would block the reader, a
device such as /dev/zero never ends) and, in the app, anything that resolves outside its
roots: a linked data file, a class folder or image that links out, a parquet file that links
out of an `hf:` folder.

Nothing here reads a file's content or imports torch: the app's sidebar calls it before
anything heavy has loaded.
"""

from __future__ import annotations

import os
from pathlib import Path

from rotviz.confine import Confined
from rotviz.errors import RotvizError

# The package's own folder: the zoo's cards name their data relative to it (`assets/data/...`),
# in a source checkout and in an installed wheel alike (pyproject.toml ships the data).
PACKAGE = Path(__file__).resolve().parents[1]
SHIPPED_DATA = PACKAGE / "assets" / "data"

# What a file of each kind must be, for messages.
FILE_KINDS = {"text": "a UTF-8 text file", "csv": "a CSV file", "tsv": "a TSV file",
              "jsonl": "a JSON-lines file", "conll": "a CoNLL file"}
CIFAR_FORMAT = "a CIFAR-10 python folder (data_batch_1..5 and test_batch pickles of {data, labels})"
IMAGEFOLDER_FORMAT = "a folder with one subfolder of images (PNG, JPEG, ...) per class"
HF_FORMAT = "a datasets folder (save_to_disk) or a folder of parquet files"


def data_path(path: str) -> Path:
    """A data file's path: as given, or, when a relative path does not exist from the
    working directory, relative to the package (the zoo's cards name `assets/data/...`)."""
    p = Path(path).expanduser()
    if not p.exists() and not p.is_absolute() and (PACKAGE / p).exists():
        return PACKAGE / p
    return p


def data_file(path: str, kind: str, confined: Confined) -> Path:
    """The path of data file `path` (`kind` csv, text, ...), checked by `confined`."""
    return _checked(path, kind, f"{kind}: expects {FILE_KINDS.get(kind, 'a file')}",
                    confined.file, "file")


FOLDER_KINDS = {"imagefolder": IMAGEFOLDER_FORMAT, "cifar10": CIFAR_FORMAT, "hf": HF_FORMAT}


def data_folder(path: str, kind: str, confined: Confined) -> Path:
    """The path of data folder `path` (`kind` imagefolder, cifar10 or hf), checked by
    `confined` (the folder itself; its contents by the functions below)."""
    return _checked(path, kind, f"{kind}: expects {FOLDER_KINDS.get(kind, 'a folder')}",
                    confined.folder, "folder")


def _checked(path: str, kind: str, expected: str, check, noun: str) -> Path:
    """`path` as data of `kind`, passed through `check` (Confined.file or .folder), its
    refusal ending in what the kind expects."""
    if not path:
        raise RotvizError(f"no {noun} given; {expected}")
    p = data_path(path)
    try:
        check(p, f"data {noun}")
    except RotvizError as e:
        raise RotvizError(f"{e}; {expected}") from None
    return p


def read_text(p: Path, confined: Confined, what: str, encoding: str = "utf-8") -> str:
    """A checked text file's content, with universal newlines (\\r\\n and \\r read as \\n,
    as Python's text files read them, so the text is the same on every platform)."""
    data = confined.read_bytes(p, what)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as e:
        raise RotvizError(f"'{p}' is not UTF-8 text (byte {e.start}); save it as UTF-8"
                          ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _names(folder: Path) -> list[str]:
    """The names in `folder`, sorted, hidden ones left out."""
    try:
        return sorted(n for n in os.listdir(folder) if not n.startswith("."))
    except OSError as e:
        raise RotvizError(f"'{folder}' cannot be listed ({e.strerror or e})") from None


def image_classes(root: Path, confined: Confined) -> list[tuple[Path, list[Path]]]:
    """The class folders of image folder `root` (sorted by name) with the image files in
    each (sorted), every one checked by `confined`: a class folder or image that links out
    of the roots, or an entry that is not a regular file (a FIFO), is refused. Files at the
    top level are not classes and are left alone."""
    classes = []
    for name in _names(root):
        p = root / name
        if p.is_dir():
            confined.folder(p, "class folder")
            classes.append(p)
    if not classes:
        raise RotvizError(f"'{root}' has no class subfolders; expected {IMAGEFOLDER_FORMAT}")
    out = []
    for folder in classes:
        files, inner = [], []
        for name in _names(folder):
            f = folder / name
            if f.is_dir():
                inner.append(f)
                continue
            confined.file(f, "image")
            files.append(f)
        if not files:
            if inner:
                raise RotvizError(
                    f"'{folder}' holds folders ({', '.join(p.name for p in inner[:3])}), not "
                    f"images: point imagefolder: at the folder whose subfolders are the "
                    f"classes, e.g. imagefolder:{folder}")
            raise RotvizError(f"class folder '{folder}' is empty; expected {IMAGEFOLDER_FORMAT}")
        out.append((folder, files))
    return out


def cifar_files(root: Path, split: str, confined: Confined) -> list[Path]:
    """The CIFAR-10 batches a split reads (test: test_batch; else the data_batch_* files),
    each checked by `confined`."""
    if split == "test":
        files = [root / "test_batch"]
        if not os.path.lexists(files[0]):
            raise RotvizError(f"no test_batch in '{root}'; expected {CIFAR_FORMAT}")
    else:
        files = sorted(root.glob("data_batch_*"))
        if not files:
            raise RotvizError(f"no data_batch_* files in '{root}'; expected {CIFAR_FORMAT}")
    for f in files:
        confined.file(f, "CIFAR-10 batch")
    return files


def cifar_meta(root: Path, confined: Confined) -> Path | None:
    """The folder's batches.meta (class names), checked by `confined`, or None without one."""
    meta = root / "batches.meta"
    if not os.path.lexists(meta):
        return None
    return confined.file(meta, "CIFAR-10 batches.meta")


def hf_parquet(root: Path, confined: Confined) -> list[Path]:
    """The parquet files of `hf:` folder `root` (sorted; none for a datasets folder), after
    the whole folder is checked by `confined`: datasets and pyarrow walk it themselves."""
    confined.check_tree(root, "hf: folder")
    return sorted(root.rglob("*.parquet"))


def check_data(ref: str, confined: Confined) -> None:
    """Refuse, in one line, data `ref` whose reading would open a file `confined` refuses;
    built-in data (digits, pystdlib) passes. Opens nothing."""
    kind, _, path = ref.partition(":")
    if kind in FILE_KINDS:
        data_file(path, kind, confined)
    elif kind == "imagefolder":
        image_classes(data_folder(path, kind, confined), confined)
    elif kind == "cifar10":
        root = data_folder(path, kind, confined)
        for split in ("test", "train"):
            cifar_files(root, split, confined)
        cifar_meta(root, confined)
    elif kind == "hf":
        hf_parquet(data_folder(path, kind, confined), confined)

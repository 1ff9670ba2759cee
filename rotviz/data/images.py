"""Image data: scikit-learn's bundled digits (read straight from its CSV, which avoids
importing scikit-learn), CIFAR-10 python batches (`cifar10:DIR`) and a folder of images per
class (`imagefolder:DIR`), each file opened through a `Confined` reader.

The user's images are returned as a split's fields; rotviz.data.split's `load_split` makes
them a `Split`.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rotviz.confine import ANYWHERE, Confined
from rotviz.data.files import (
    CIFAR_FORMAT,
    IMAGEFOLDER_FORMAT,
    cifar_files,
    cifar_meta,
    data_folder,
    image_classes,
)
from rotviz.data.splits import split_indices as _split_indices
from rotviz.data.splits import tenth_split as _tenth_split
from rotviz.errors import RotvizError


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
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
            confined: Confined = ANYWHERE) -> dict[str, Any]:
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
    return {"task": "image", "inputs": x, "labels": torch.tensor(labels),
            "n_classes": n_classes,
            "encoding": processor.fingerprint if processor is not None else "",
            "how": {"seed": seed, "processor": processor, "confined": confined}}


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
                confined: Confined = ANYWHERE) -> dict[str, Any]:
    """One subfolder per class, named after the class.

    Class ids: with `names` (the model's label names by output id, rotviz.data.tasks.named_labels)
    a folder's id is its name's id, and the folders must be exactly those names (one line
    naming the differences otherwise); without (a model whose labels are unnamed) the sorted
    folder names are the ids, as the model cannot say otherwise.
    Without a processor: images of one size; grayscale folders give 1 channel, anything else
    RGB; pixels scaled to [0, 1]. With the model's image processor
    (rotviz.data.tokens.ImageReading): any sizes, as RGB, resized, cropped and normalised by it.
    Split: a seeded 10% test and 10% val over all images, ordered by (class id, file name),
    so that the split does not depend on what the folders are called: folders renamed from
    0..9 to a model's own names give the same images, with the same labels.
    Every class folder and image is read through `confined` (rotviz.data.files.image_classes).
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
        return {"task": "image", "inputs": x, "labels": y[idx], "n_classes": len(classes),
                "encoding": processor.fingerprint, "how": how, "label_names": by_id}
    gray = all(im.mode in ("1", "L", "I", "I;16", "F") for im in images)
    mode = "L" if gray else "RGB"
    arrays = [np.asarray(im.convert(mode), dtype=np.float32) / 255.0 for im in images]
    x = torch.tensor(np.stack(arrays))
    x = x.unsqueeze(1) if gray else x.permute(0, 3, 1, 2).contiguous()
    return {"task": "image", "inputs": x[idx], "labels": y[idx], "n_classes": len(classes),
            "encoding": "", "how": how, "label_names": by_id}


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

"""Data sources: fixed seeded splits, exact contents, and one clear line for every bad input.

User-data loaders run on tiny files written here: CIFAR-10 pickle batches, an image folder of
PNGs, a text file, and their malformed variants.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from rotviz.data.split import load_split
from rotviz.data.text import (
    CHARS,
    CONTEXT,
    VOCAB_SIZE,
    decode,
    encode,
    pystdlib_fingerprint,
    text_windows,
)
from rotviz.errors import RotvizError
from rotviz.zoo.recipes import RECIPES

# ---- digits -----------------------------------------------------------------------------------


def test_digits_splits_have_fixed_sizes_and_partition_the_set():
    from sklearn.datasets import load_digits

    splits = {s: load_split("digits", s) for s in ("train", "val", "test")}
    assert {s: v.n for s, v in splits.items()} == {"train": 1200, "val": 200, "test": 397}
    bunch = load_digits()
    every = torch.cat([splits[s].inputs.reshape(-1, 64) for s in ("train", "val", "test")])
    labels = torch.cat([splits[s].labels for s in ("train", "val", "test")])
    # Each image of scikit-learn's set appears exactly once, with its label, scaled to [0, 1].
    ref = torch.tensor(bunch.data / 16.0, dtype=torch.float32)
    key = lambda x: [tuple(r) for r in x.tolist()]  # noqa: E731
    assert sorted(zip(key(every), labels.tolist(), strict=True)) == sorted(
        zip(key(ref), bunch.target.tolist(), strict=True)
    )
    t = splits["test"]
    assert t.inputs.shape == (397, 1, 8, 8) and t.inputs.dtype == torch.float32
    assert float(t.inputs.min()) == 0.0 and float(t.inputs.max()) == 1.0
    assert t.n_classes == 10 and t.task == "image"


def test_digits_split_is_seeded():
    a, b = load_split("digits", "test"), load_split("digits", "test")
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    c = load_split("digits", "test", seed=1)
    assert not torch.equal(a.inputs, c.inputs)


# ---- text ------------------------------------------------------------------------------------


def test_encode_decode_round_trip_and_unknown_characters():
    text = "def f(x):\n\treturn x ** 2  # ~ok"
    ids = encode(text)
    assert decode(ids) == text
    assert int(ids.min()) >= 1 and int(ids.max()) < VOCAB_SIZE
    assert encode("é€😀").tolist() == [0, 0, 0]
    assert len(CHARS) + 1 == VOCAB_SIZE == RECIPES["gpt2-pystdlib"].model["vocab_size"]


def test_text_windows_are_next_character_pairs():
    ids = torch.arange(1, 2 * CONTEXT + 5)
    x, y = text_windows(ids)
    assert x.shape == y.shape == (2, CONTEXT)
    assert torch.equal(y, x + 1)  # the target of each position is the next character


def test_pystdlib_is_deterministic_and_splits_are_disjoint_windows():
    fp1, fp2 = pystdlib_fingerprint(), pystdlib_fingerprint()
    assert fp1 == fp2 and fp1["chars"] > 300_000
    splits = {s: load_split("pystdlib", s) for s in ("train", "val", "test")}
    n = sum(v.n for v in splits.values())
    assert n == (fp1["chars"] - 1) // CONTEXT
    assert splits["test"].n == splits["val"].n == round(n / 10)
    rows = [tuple(r) for s in splits.values() for r in s.inputs.tolist()]
    assert len(set(rows)) > 0.99 * len(rows)  # windows, not copies of each other
    t = splits["test"]
    assert t.task == "text" and t.n_classes == VOCAB_SIZE and t.inputs.shape[1] == CONTEXT
    assert torch.equal(t.labels[:, :-1], t.inputs[:, 1:])
    assert "def " in decode(t.inputs[:50].reshape(-1))


def test_text_file_loads_and_splits(tmp_path):
    f = tmp_path / "t.txt"
    text = "".join(f"line {i}: the quick brown fox\n" for i in range(200))
    f.write_text(text)
    splits = {s: load_split(f"text:{f}", s) for s in ("train", "val", "test")}
    n = (len(text) - 1) // CONTEXT
    assert sum(v.n for v in splits.values()) == n
    assert splits["test"].n == round(n / 10)
    got = sorted(tuple(r) for v in splits.values() for r in v.inputs.tolist())
    want = sorted(tuple(r) for r in text_windows(encode(text))[0].tolist())
    assert got == want
    assert splits["test"].data == f"text:{f}"


@pytest.mark.parametrize("case", ["missing", "directory", "empty", "short", "binary"])
def test_text_file_errors_name_the_file_and_format(tmp_path, case):
    f = tmp_path / "t.txt"
    if case == "directory":
        f.mkdir()
    elif case == "empty":
        f.write_text("")
    elif case == "short":
        f.write_text("x" * 100)
    elif case == "binary":
        f.write_bytes(b"\xff\xfe\x00" * 200)
    with pytest.raises(RotvizError) as e:
        load_split(f"text:{f}")
    msg = str(e.value)
    assert str(f) in msg and "\n" not in msg
    assert ("UTF-8" in msg) or ("characters" in msg)


# ---- cifar10 ---------------------------------------------------------------------------------


def _cifar_rows(n: int, seed: int) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, 10, n).tolist()


def _write_batch(path: Path, data, labels, key_data=b"data", key_labels=b"labels") -> None:
    path.write_bytes(pickle.dumps({key_data: data, key_labels: labels, b"batch_label": b"x"}))


@pytest.fixture
def cifar_dir(tmp_path) -> Path:
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    for i in (1, 2):
        _write_batch(root / f"data_batch_{i}", *_cifar_rows(15, i))
    _write_batch(root / "test_batch", *_cifar_rows(7, 9))
    names = [f"c{i}".encode() for i in range(10)]
    (root / "batches.meta").write_bytes(pickle.dumps({b"label_names": names}))
    return root


def test_cifar10_reads_batches_in_channel_major_layout(cifar_dir):
    test = load_split(f"cifar10:{cifar_dir}", "test")
    data, labels = _cifar_rows(7, 9)
    assert test.inputs.shape == (7, 3, 32, 32) and test.n_classes == 10
    assert test.labels.tolist() == labels
    # CIFAR rows hold 1024 red, then 1024 green, then 1024 blue values, each 32x32 row-major.
    assert float(test.inputs[2, 1, 3, 5]) == pytest.approx(data[2, 1024 + 3 * 32 + 5] / 255.0)
    train = load_split(f"cifar10:{cifar_dir}", "train")
    val = load_split(f"cifar10:{cifar_dir}", "val")
    assert (train.n, val.n) == (27, 3)
    every = torch.cat([train.inputs, val.inputs]).reshape(30, -1)
    want = np.concatenate([_cifar_rows(15, 1)[0], _cifar_rows(15, 2)[0]]) / 255.0
    got = sorted(map(tuple, every.numpy().round(6).tolist()))
    assert got == sorted(map(tuple, want.astype(np.float32).round(6).tolist()))


def test_cifar10_accepts_string_keys(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    _write_batch(root / "test_batch", *_cifar_rows(4, 0), key_data="data", key_labels="labels")
    assert load_split(f"cifar10:{root}", "test").n == 4


def _evil():
    import os

    return (os.system, ("touch pwned",))


class _Evil:
    def __reduce__(self):
        return _evil()


@pytest.mark.parametrize(
    "case", ["missing", "no_batches", "no_test", "bad_keys", "bad_shape", "bad_labels",
             "truncated", "not_dict", "code"]
)
def test_cifar10_errors(tmp_path, case, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "c"
    split = "test"
    if case != "missing":
        root.mkdir()
    data, labels = _cifar_rows(5, 0)
    if case == "no_batches":
        split = "train"
    elif case == "bad_keys":
        _write_batch(root / "test_batch", data, labels, key_data=b"pixels")
    elif case == "bad_shape":
        _write_batch(root / "test_batch", data[:, :100], labels)
    elif case == "bad_labels":
        _write_batch(root / "test_batch", data, labels[:3])
    elif case == "truncated":
        _write_batch(root / "test_batch", data, labels)
        blob = (root / "test_batch").read_bytes()
        (root / "test_batch").write_bytes(blob[: len(blob) // 2])
    elif case == "not_dict":
        (root / "test_batch").write_bytes(pickle.dumps([1, 2, 3]))
    elif case == "code":
        (root / "test_batch").write_bytes(pickle.dumps({b"data": _Evil(), b"labels": []}))
    with pytest.raises(RotvizError) as e:
        load_split(f"cifar10:{root}", split)
    msg = str(e.value)
    assert str(root) in msg and "\n" not in msg
    assert "CIFAR-10" in msg or "expected" in msg
    assert not (tmp_path / "pwned").exists()  # nothing in a data file is ever executed


# ---- imagefolder -----------------------------------------------------------------------------


def _png(path: Path, array: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def test_imagefolder_rgb_and_gray(tmp_path):
    rng = np.random.default_rng(0)
    rgb = tmp_path / "rgb"
    arrays = {}
    for cls in ("cat", "dog", "eel"):
        for i in range(4):
            a = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
            arrays[(cls, i)] = a
            _png(rgb / cls / f"{i}.png", a)
    splits = {s: load_split(f"imagefolder:{rgb}", s) for s in ("train", "val", "test")}
    assert {s: v.n for s, v in splits.items()} == {"train": 10, "val": 1, "test": 1}
    assert splits["test"].inputs.shape[1:] == (3, 6, 6) and splits["test"].n_classes == 3
    labels = sorted(int(y) for v in splits.values() for y in v.labels)
    assert labels == [0] * 4 + [1] * 4 + [2] * 4  # sorted folder names are the class ids
    every = {tuple(x.flatten().tolist()): int(y) for v in splits.values()
             for x, y in zip(v.inputs, v.labels, strict=True)}
    for (cls, _), a in arrays.items():
        pixels = torch.tensor(a, dtype=torch.float32).permute(2, 0, 1) / 255.0
        key = tuple(pixels.flatten().tolist())
        assert every[key] == ["cat", "dog", "eel"].index(cls)
    gray = tmp_path / "gray"
    for cls in ("a", "b"):
        for i in range(2):
            _png(gray / cls / f"{i}.png", rng.integers(0, 256, (5, 5), dtype=np.uint8))
    g = load_split(f"imagefolder:{gray}", "train")
    assert g.inputs.shape[1:] == (1, 5, 5) and g.n_classes == 2


@pytest.mark.parametrize("case", ["missing", "file", "no_classes", "empty_class", "not_image",
                                  "sizes"])
def test_imagefolder_errors(tmp_path, case):
    root = tmp_path / "imgs"
    img = np.zeros((4, 4, 3), dtype=np.uint8)
    if case == "file":
        root.write_text("x")
    elif case != "missing":
        root.mkdir()
    if case in ("empty_class", "not_image", "sizes"):
        _png(root / "a" / "0.png", img)
    if case == "empty_class":
        (root / "b").mkdir()
    elif case == "not_image":
        (root / "b").mkdir()
        (root / "b" / "notes.png").write_text("this is not a picture")
    elif case == "sizes":
        _png(root / "b" / "0.png", np.zeros((5, 4, 3), dtype=np.uint8))
    with pytest.raises(RotvizError) as e:
        load_split(f"imagefolder:{root}")
    msg = str(e.value)
    assert str(root) in msg and "\n" not in msg
    if case == "not_image":
        assert "notes.png" in msg and "not a readable image" in msg
    if case == "sizes":
        assert "differ in size" in msg


# ---- references ------------------------------------------------------------------------------


@pytest.mark.parametrize("ref, split, needle", [
    ("mnist", "test", "unknown data"),
    ("digits", "dev", "unknown split"),
    ("cifar10:", "test", "names no path"),
    ("text:", "test", "names no path"),
    ("digits:extra", "test", "unknown data"),
])
def test_bad_references(ref, split, needle):
    with pytest.raises(RotvizError, match=needle):
        load_split(ref, split)


def test_tiny_sources_refuse_empty_splits(tmp_path):
    root = tmp_path / "imgs"
    _png(root / "a" / "0.png", np.zeros((4, 4, 3), dtype=np.uint8))
    _png(root / "b" / "0.png", np.zeros((4, 4, 3), dtype=np.uint8))
    with pytest.raises(RotvizError, match="split .* is empty"):
        load_split(f"imagefolder:{root}", "test")

"""rotviz.confine and the loaders that read through it.

- A scan of rotviz's sources for raw reads of files: every read goes through a `Confined`
  reader, or is on a short allowlist with its reason, so a new loader cannot forget the check.
- Hostile data the loaders meet: FIFOs and devices (refused at once, never opened blocking),
  links out of the roots (a `Confined.under` refuses them, in one line naming the file), a
  loop of links, a corrupt parquet file.
- Reading through the resolver changes nothing for well-formed files: the text is the one
  Python's text files give (universal newlines, BOM).
"""

from __future__ import annotations

import ast
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import refused

from rotviz.app import roots as app_roots
from rotviz.confine import ANYWHERE, Confined
from rotviz.data.files import check_data, read_text
from rotviz.data.labelled import read_hf, read_rows
from rotviz.data.split import load_split
from rotviz.errors import RotvizError

SOURCES = Path(__file__).resolve().parents[1] / "rotviz"

# ---- a new loader cannot forget the check ------------------------------------------------------

# Calls that read a file by themselves (by name, or as a module's or any object's method).
LOADERS = {"load_file", "safe_open", "load_from_disk", "load_dataset", "from_pretrained"}
MODULE_READS = {("json", "load"), ("torch", "load"), ("np", "load"), ("numpy", "load"),
                ("np", "loadtxt"), ("np", "fromfile"), ("np", "memmap"), ("pickle", "load"),
                ("Image", "open"), ("io", "open"), ("os", "open"), ("codecs", "open"),
                ("gzip", "open"), ("pq", "ParquetFile")}
PATH_READS = {"read_text", "read_bytes", "read_json"}  # Path's, or a Confined's (allowed)


def _confined_receiver(node: ast.expr) -> bool:
    """A call on a Confined reader: rotviz names them `confined` (or `*_confined`) or
    ANYWHERE, so `confined.read_text(p)` passes and `Path(p).read_text()` does not."""
    name = ast.unparse(node).split(".")[-1]
    return name == "ANYWHERE" or name.lower().endswith("confined")


def _read_mode(call: ast.Call) -> bool:
    """Whether a builtin `open(...)` call may read (writers, modes w/x/a without +, pass)."""
    mode = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        return True
    if not isinstance(mode, ast.Constant) or not isinstance(mode.value, str):
        return True  # a mode rotviz cannot see: counted as a read
    return "r" in mode.value or "+" in mode.value


def raw_reads(source: str) -> list[tuple[int, str, str]]:
    """(line, enclosing function, what) for each raw read of a file in `source`."""
    tree = ast.parse(source)
    out = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{where}.{child.name}" if where else child.name
            if isinstance(child, ast.Call):
                what = _read_of(child)
                if what:
                    out.append((child.lineno, where, what))
            visit(child, inner)

    visit(tree, "")
    return out


def _read_of(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Name):
        if f.id == "open" and _read_mode(call):
            return "open"
        return f.id if f.id in LOADERS else None
    if not isinstance(f, ast.Attribute):
        return None
    base = ast.unparse(f.value)
    if f.attr in PATH_READS:
        return None if _confined_receiver(f.value) else f".{f.attr}"
    if f.attr in LOADERS:
        return f.attr
    if (base, f.attr) in MODULE_READS:
        return f"{base}.{f.attr}"
    if base in ("pd", "pandas", "pq", "pyarrow.parquet", "datasets") and (
            f.attr.startswith("read_") or f.attr.startswith("load_")):
        return f"{base}.{f.attr}"
    return None


# (file, enclosing function) -> why a raw read there is safe. Keep it short: everything else
# reads through rotviz.confine.
ALLOWED = {
    ("rotviz/confine.py", "*"): "the door itself: resolves, checks, then opens",
    ("rotviz/data/images.py", "digits_arrays"): "scikit-learn's own bundled digits CSV "
                                                "(package data found by import, never a "
                                                "user's path)",
    ("rotviz/data/images.py", "_open_image"): "Image.open on a file object from Confined.open",
    ("rotviz/data/labelled.py", "read_hf"): "pq.read_table on a file object from Confined.open; "
                                       "load_from_disk on a folder Confined.check_tree checked",
    ("rotviz/data/tokens.py", "_transformers_tokenizer"): "from_pretrained on a folder "
                                                     "Confined.check_tree checked",
    ("rotviz/data/tokens.py", "image_reading"): "from_pretrained on a folder Confined.check_tree "
                                           "checked, its processor file by Confined.file",
    ("rotviz/memory.py", "_proc_bytes"): "/proc/meminfo and cgroup files: fixed system "
                                         "paths, never a user's",
    ("rotviz/zoo/build.py", "*"): "the zoo's builder reads the repository's own assets "
                                  "(recipes name assets/data/...), not a user's path",
    ("rotviz/zoo/nlp.py", "*"): "the zoo's corpora: the repository's own assets/data and "
                                "the standard library's sources",
    ("rotviz/sources/files.py", "read_weights"): "torch.load(weights_only=True) on a file "
                                                 "object from Confined.open",
    ("rotviz/sources/hf.py", "HFSource.load"): "from_pretrained after models.check_weights "
                                               "read the checkpoint and every shard its index "
                                               "names through the Confined",
}


def _allowed(rel: str, where: str) -> bool:
    return (rel, "*") in ALLOWED or (rel, where) in ALLOWED


def test_no_loader_reads_a_file_except_through_the_resolver():
    offenders = []
    used = set()
    for path in sorted(SOURCES.rglob("*.py")):
        rel = path.relative_to(SOURCES.parent).as_posix()
        for line, where, what in raw_reads(path.read_text(encoding="utf-8")):
            key = (rel, "*") if (rel, "*") in ALLOWED else (rel, where)
            if key in ALLOWED:
                used.add(key)
            else:
                offenders.append(f"{rel}:{line} in {where or 'module'}: {what}")
    assert offenders == [], ("read these through rotviz.confine (a Confined's open, "
                             "read_bytes, read_text, read_json, or check_tree before a "
                             "library walks a folder):\n" + "\n".join(offenders))
    stale = sorted(set(ALLOWED) - used)
    assert stale == [], f"allowlist entries that no longer match a read: {stale}"


def test_the_scan_sees_raw_reads_and_lets_checked_ones_pass():
    src = '''
def f(p, confined, fh):
    Path(p).read_text()
    p.read_bytes()
    open(p)
    open(p, "rb")
    open(p, mode="r+")
    json.load(fh)
    torch.load(p)
    np.load(p)
    pd.read_csv(p)
    pq.read_table(p)
    Image.open(p)
    load_file(p)
    safe_open(p, "pt")
    datasets.load_from_disk(p)
    AutoTokenizer.from_pretrained(p)
    open(p, "w")
    open(p, "wb")
    open(p, "x")
    confined.read_text(p)
    self.confined.read_bytes(p)
    ANYWHERE.read_json(p, "x")
    json.loads(text)
'''
    found = [what for _, _, what in raw_reads(src)]
    assert found == [".read_text", ".read_bytes", "open", "open", "open", "json.load",
                     "torch.load", "np.load", "pd.read_csv", "pq.read_table", "Image.open",
                     "load_file", "safe_open", "load_from_disk", "from_pretrained"]
    assert [w for _, w, _ in raw_reads("class C:\n    def m(self):\n        open('x')\n")] == [
        "C.m"]


# ---- hostile files: refused at once, in one line naming the file ---------------------------------


def _one_line(e: pytest.ExceptionInfo, *fragments: str) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    for f in fragments:
        assert f in msg, msg
    return msg


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def _bounded(fn, seconds: float = 5.0):
    """Run `fn` in a thread and fail (not hang) when it does not return in `seconds`: a
    reader that opens a FIFO blocking would never return."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    start = time.perf_counter()
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still reading after {seconds} s: it blocked"
    out["seconds"] = time.perf_counter() - start
    return out


@pytest.mark.parametrize("kind", ["text", "csv", "tsv", "jsonl", "conll"])
def test_a_fifo_or_device_as_a_data_file_is_refused_at_once(tmp_path, kind):
    fifo = _fifo(tmp_path / f"data.{kind}")
    for target in (fifo, Path("/dev/zero")):
        ref = f"{kind}:{target}"
        got = _bounded(lambda ref=ref: check_data(ref, ANYWHERE))
        assert isinstance(got.get("error"), RotvizError), got
        msg = str(got["error"])
        assert msg == (f"data file '{target}' is not a regular file; give a regular file; "
                       f"{kind}: expects " + {"text": "a UTF-8 text file", "csv": "a CSV file",
                                              "tsv": "a TSV file", "jsonl": "a JSON-lines file",
                                              "conll": "a CoNLL file"}[kind]), msg
        assert got["seconds"] < 2.0
    reader = (lambda: load_split(f"text:{fifo}")) if kind == "text" else (
        (lambda: read_rows(kind, str(fifo))) if kind != "conll" else None)
    if reader is not None:
        got = _bounded(reader)
        assert isinstance(got.get("error"), RotvizError) and "not a regular file" in str(
            got["error"]), got


def test_data_from_dev_zero_is_refused_in_one_line_at_once(capfd, ws):
    start = time.perf_counter()
    line = refused(["eval", "zoo:vit-digits-s3", "--data", "text:/dev/zero"], capfd, ws)
    assert line == ("rotviz: error: data file '/dev/zero' is not a regular file; give a "
                    "regular file; text: expects a UTF-8 text file")
    assert time.perf_counter() - start < 10.0  # was ~20 s, with "does not exist"


def _png(path: Path, value: int = 0) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((4, 4), value, dtype=np.uint8)).save(path)


def _parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


ROWS = [{"text": f"row {i}", "label": i % 2} for i in range(20)]


def test_fifos_inside_data_folders_are_refused(tmp_path):
    imgs = tmp_path / "imgs"
    for c in ("a", "b"):
        for i in range(5):
            _png(imgs / c / f"{i}.png", 40 * i)
    assert load_split(f"imagefolder:{imgs}", "test").n == 1  # well formed: read
    fifo = _fifo(imgs / "b" / "9.png")
    got = _bounded(lambda: load_split(f"imagefolder:{imgs}", "test"))
    _one_line(_Raised(got.get("error")), f"image '{fifo}' is not a regular file")

    hf = tmp_path / "hf"
    _parquet(hf / "train.parquet", ROWS)
    assert len(read_hf(str(hf))["train"]) == 20
    fifo = _fifo(hf / "test.parquet")
    got = _bounded(lambda: read_hf(str(hf)))
    _one_line(_Raised(got.get("error")), f"hf: folder entry '{fifo}' is not a regular file")

    cifar = tmp_path / "cifar"
    cifar.mkdir()
    fifo = _fifo(cifar / "test_batch")
    got = _bounded(lambda: load_split(f"cifar10:{cifar}", "test"))
    _one_line(_Raised(got.get("error")), f"CIFAR-10 batch '{fifo}' is not a regular file")


class _Raised:
    """An error caught in a thread, shaped like pytest's ExceptionInfo for `_one_line`."""

    def __init__(self, error: BaseException | None):
        assert isinstance(error, RotvizError), error
        self.value = error


def test_a_corrupt_parquet_file_is_one_line(tmp_path):
    hf = tmp_path / "hf"
    _parquet(hf / "train.parquet", ROWS)
    (hf / "test.parquet").write_bytes(b"PAR1 this is not a parquet file at all PAR1")
    with pytest.raises(RotvizError) as e:
        read_hf(str(hf))
    _one_line(e, f"cannot read parquet file '{hf / 'test.parquet'}'", "write it again")


@pytest.mark.parametrize("harm", ["arrow", "state", "deep"])
def test_a_corrupt_datasets_folder_is_one_line(tmp_path, harm):
    import datasets

    datasets.disable_progress_bars()
    ds = tmp_path / "ds"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(ds))
    assert read_hf(str(ds)) == {"": ROWS}
    if harm == "arrow":
        for f in ds.glob("*.arrow"):
            f.write_bytes(b"not arrow " * 10)
    else:
        (ds / "state.json").write_text("[1, 2" if harm == "state" else "[" * 100_000)
    with pytest.raises(RotvizError) as e:
        read_hf(str(ds))
    _one_line(e, f"'{ds}' is not a datasets folder (", "save one with Dataset.save_to_disk")


def test_a_fifo_among_a_models_tokenizer_files_is_refused(tmp_path, saved):
    from rotviz.data.tokens import processor_fingerprint, text_encoding, tokenizer_files

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\na\n")
    assert tokenizer_files(folder) == [folder / "vocab.txt"]
    fifo = _fifo(folder / "tokenizer.json")
    got = _bounded(lambda: text_encoding(folder, {}, "m"))
    _one_line(_Raised(got.get("error")), f"tokenizer file '{fifo}' is not a regular file")
    fifo = _fifo(folder / "preprocessor_config.json")
    got = _bounded(lambda: processor_fingerprint(folder))
    _one_line(_Raised(got.get("error")), f"image processor file '{fifo}' is not a regular file")


# ---- links out of the roots ----------------------------------------------------------------------


@pytest.fixture
def linked(tmp_path):
    """A root whose data links to an outside folder, and that outside folder."""
    root, out = tmp_path / "root", tmp_path / "outside"
    (out / "b").mkdir(parents=True)
    for i in range(5):
        _png(root / "imgs" / "a" / f"{i}.png", i)
        _png(out / "b" / f"{i}.png", 100 + i)
    (root / "imgs" / "b").symlink_to(out / "b")
    (out / "leak.txt").write_text("secret " * 100)
    (out / "leak.csv").write_text("text,label\n" + "secret,0\n" * 20)
    (root / "data").mkdir()
    (root / "data" / "leak.txt").symlink_to(out / "leak.txt")
    (root / "data" / "leak.csv").symlink_to(out / "leak.csv")
    _parquet(out / "train.parquet", ROWS)
    (root / "pq").mkdir()
    (root / "pq" / "train.parquet").symlink_to(out / "train.parquet")
    return root, out


def test_the_loaders_themselves_refuse_links_out_of_the_roots(linked):
    root, out = linked
    inside = Confined.under([root])
    cases = {
        f"text:{root / 'data' / 'leak.txt'}": f"data file '{root / 'data' / 'leak.txt'}' leads "
                                             f"to '{out / 'leak.txt'}', outside the roots",
        f"imagefolder:{root / 'imgs'}": f"class folder '{root / 'imgs' / 'b'}' leads to "
                                        f"'{out / 'b'}', outside the roots",
        f"hf:{root / 'pq'}": f"hf: folder entry '{root / 'pq' / 'train.parquet'}' leads to "
                             f"'{out / 'train.parquet'}', outside the roots",
    }
    for ref, expected in cases.items():
        for read in (lambda ref=ref: check_data(ref, inside),
                     lambda ref=ref: (read_hf(ref[3:], inside) if ref.startswith("hf:")
                                      else load_split(ref, "test", confined=inside))):
            with pytest.raises(RotvizError) as e:
                read()
            _one_line(e, expected)
        check_data(ref, ANYWHERE)  # the command line reads where its user points
    with pytest.raises(RotvizError) as e:
        read_rows("csv", str(root / "data" / "leak.csv"), inside)
    _one_line(e, f"'{out / 'leak.csv'}', outside the roots")
    assert len(read_rows("csv", str(root / "data" / "leak.csv"))) == 20


def test_a_loop_of_links_is_checked_once_not_forever(tmp_path):
    hf = tmp_path / "hf"
    _parquet(hf / "train.parquet", ROWS)
    (hf / "again").symlink_to(hf)  # a link to its own folder
    (hf / "sub").mkdir()
    (hf / "sub" / "up").symlink_to(hf)
    assert Confined.under([tmp_path]).check_tree(hf) == hf.resolve()
    (hf / "self").symlink_to(hf / "self")  # a link to itself: cannot be resolved
    with pytest.raises(RotvizError) as e:
        Confined.under([tmp_path]).check_tree(hf)
    _one_line(e, "cannot be resolved")
    data = tmp_path / "data"  # what the app lists leaves such links out, without a fuss
    (data / "imgs").mkdir(parents=True)
    for link in (data / "imgs" / "a", data / "imgs" / "b", data / "text.txt"):
        link.symlink_to(link)
    (data / "ok.txt").write_text("ok")
    assert app_roots.discover_data([data]) == [f"text:{data / 'ok.txt'}"]
    assert app_roots.discover([data]) == []


# ---- the same text as before ------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"a\r\nb\rc\n", b"\xef\xbb\xbfx,y\r\n1,2\r\n", b"plain\n",
                                 "caf\u00e9\r\n".encode()])
def test_text_reads_as_python_text_files_do(tmp_path, raw):
    f = tmp_path / "t.txt"
    f.write_bytes(raw)
    assert read_text(f, ANYWHERE, "file") == f.read_text(encoding="utf-8")
    assert read_text(f, ANYWHERE, "file", "utf-8-sig") == f.read_text(encoding="utf-8-sig")


def test_typed_paths_that_cannot_be_resolved_are_one_line(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    roots = [tmp_path.resolve()]
    for typed in (str(tmp_path / "loop"), f"{tmp_path}/a\0b"):
        for check in (lambda t=typed: app_roots.resolve_choice(t, roots),
                      lambda t=typed: app_roots.resolve_data(f"csv:{t}", roots)):
            with pytest.raises(RotvizError) as e:
                check()
            _one_line(e, "NUL character" if "\0" in typed else "cannot be resolved")

"""Safetensors checkpoints read lazily and written as a stream, so that a model larger than
memory can be matched one block at a time.

`Checkpoint` knows every tensor's name, dtype and shape from the files' headers alone, checks
a sharded folder's index against its shards, and reads a few named tensors at a time with
plain file reads (nothing is memory-mapped, so a read costs the tensor's own bytes only).
`ShardWriter` writes tensors in a planned order straight to shard files: the header of each
shard is written first (every name, dtype and shape is known ahead), then each tensor's bytes
as it arrives, so no shard is ever held whole in memory. The format is safetensors' own
(an 8-byte little-endian header length, a JSON header, the raw bytes); tests read the
written files back with the `safetensors` library.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from rotviz.errors import RotvizError

Tensor = torch.Tensor

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

# safetensors' dtype names
_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
    "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}
_CHUNK = 1 << 26  # bytes read at a time when a tensor is cast as it is read


@dataclass(frozen=True)
class Entry:
    """One tensor of a checkpoint, as its header describes it: the file, dtype, shape and
    where its bytes start in the file."""

    file: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int = 0  # byte offset in the file

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _bad(path: Path, why: str) -> RotvizError:
    return RotvizError(f"cannot stream '{path}': {why}")


def _header(file: Path) -> dict[str, Entry]:
    """The tensors a safetensors file holds, from its header, each checked to lie inside the
    file with as many bytes as its dtype and shape need."""
    corrupt = "the file is corrupt or truncated"
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _bad(file, f"{corrupt} (no header)")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100_000_000):
                raise _bad(file, f"{corrupt} (header of {n} bytes)")
            header = json.loads(f.read(n))
    except OSError as e:
        raise _bad(file, f"it cannot be read ({e.strerror or e})") from None
    except (ValueError, UnicodeDecodeError):
        raise _bad(file, f"{corrupt} (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise _bad(file, f"{corrupt} (its header is not a table of tensors)")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            code, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise _bad(file, f"{corrupt} (tensor {name} is described wrongly)") from None
        dtype = _DTYPES.get(code)
        if dtype is None:
            raise _bad(file, f"tensor {name} has dtype {code}, which rotviz does not read")
        e = Entry(file.name, dtype, shape, 8 + n + int(begin))
        if int(end) - int(begin) != e.nbytes or 8 + n + int(end) > size:
            raise _bad(file, f"{corrupt} (tensor {name} does not fit its bytes)")
        out[name] = e
    return out


class Checkpoint:
    """The safetensors weights of one model folder: a single `model.safetensors`, or shards
    listed by `model.safetensors.index.json`. Headers only are read here."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        index = self.folder / INDEX
        if index.is_file():
            self.entries = self._from_index(index)
        elif (self.folder / SINGLE).is_file():
            self.entries = _header(self.folder / SINGLE)
        else:
            raise _bad(self.folder, f"it holds neither {SINGLE} nor {INDEX}; streaming reads "
                                    "safetensors only (re-save the model with "
                                    "save_pretrained)")

    def _from_index(self, index: Path) -> dict[str, Entry]:
        from rotviz.errors import read_json

        obj = read_json(index, "re-save the model")
        weight_map = obj.get("weight_map") if isinstance(obj, dict) else None
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(v, str) for v in weight_map.values()):
            raise _bad(index, "its index has no weight_map of tensor names to shard files; "
                              "re-save the model")
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (self.folder / f).is_file()]
        if missing:
            raise _bad(self.folder, f"shard {missing[0]} named by {INDEX} is missing "
                                    f"({len(missing)} of {len(files)} shards); copy the whole "
                                    "folder")
        entries: dict[str, Entry] = {}
        for f in files:
            for name, e in _header(self.folder / f).items():
                if name in entries:
                    raise _bad(self.folder, f"tensor {name} is in two shards ({entries[name].file}"
                                            f" and {f}); the shards do not match their index")
                entries[name] = e
        listed_elsewhere = [n for n, e in entries.items() if weight_map.get(n) != e.file]
        absent = [n for n, f in weight_map.items() if n not in entries]
        if absent or listed_elsewhere:
            name = (absent or listed_elsewhere)[0]
            where = (f"{INDEX} puts {name} in {weight_map[name]}, which does not hold it"
                     if absent else
                     f"{entries[name].file} holds {name}, which {INDEX} "
                     f"{'puts in ' + weight_map[name] if name in weight_map else 'does not list'}")
            raise _bad(self.folder, f"the shards do not match their index ({where}); re-save "
                                    "the model or copy it again")
        return entries

    # ---- what is there ------------------------------------------------------------------------

    def keys(self) -> list[str]:
        return list(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    @property
    def files(self) -> list[str]:
        return sorted({e.file for e in self.entries.values()})

    def largest_file_bytes(self) -> int:
        sizes: dict[str, int] = {}
        for e in self.entries.values():
            sizes[e.file] = sizes.get(e.file, 0) + e.nbytes
        return max(sizes.values())

    def meta_state(self) -> dict[str, Tensor]:
        """Every tensor as a meta tensor of its dtype and shape: enough to resolve a layout
        and the sizes of a model without reading any weights."""
        return {n: torch.empty(e.shape, dtype=e.dtype, device="meta")
                for n, e in self.entries.items()}

    # ---- reading ------------------------------------------------------------------------------

    def read(self, names: Iterable[str], dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """The named tensors, floating ones cast to `dtype` (None: as stored). Read with plain
        file reads into fresh tensors, not mapped, so a tensor costs its own bytes only."""
        by_file: dict[str, list[str]] = {}
        for n in names:
            by_file.setdefault(self.entries[n].file, []).append(n)
        out: dict[str, Tensor] = {}
        for file, group in by_file.items():
            with self._open(file) as f:
                for n in group:
                    out[n] = self._read(f, n, dtype)
        return out

    def read_rows(self, name: str, lo: int, hi: int,
                  dtype: torch.dtype | None = None) -> Tensor:
        """Rows lo:hi (first dimension) of one tensor: a slice of a large embedding without
        reading the rest of it."""
        e = self.entries[name]
        rows = e.shape[0] if e.shape else 1
        lo, hi = max(0, lo), min(rows, hi)
        row = e.nbytes // max(1, rows)
        with self._open(e.file) as f:
            return self._read(f, name, dtype, lo * row, (hi - lo) * row, (hi - lo,))

    def _open(self, file: str):
        try:
            return open(self.folder / file, "rb")
        except OSError as err:
            raise _bad(self.folder / file, f"it cannot be read ({err.strerror or err})"
                       ) from None

    def _read(self, f, name: str, dtype: torch.dtype | None, skip: int = 0,
              nbytes: int | None = None, rows: tuple[int, ...] | None = None) -> Tensor:
        e = self.entries[name]
        nbytes = e.nbytes if nbytes is None else nbytes
        shape = e.shape if rows is None else (*rows, *e.shape[1:])
        f.seek(e.start + skip)
        cast = dtype is not None and e.dtype.is_floating_point and e.dtype != dtype
        out = torch.empty(shape, dtype=dtype if cast else e.dtype)
        flat = out.reshape(-1)
        size = e.dtype.itemsize
        # a cast reads in slices, so that a tensor never sits in memory in both dtypes
        step = nbytes if not cast else max(size, (_CHUNK // size) * size)
        done = 0
        while done < nbytes:
            n = min(step, nbytes - done)
            buf = torch.empty(n, dtype=torch.uint8) if cast else flat.view(torch.uint8)[
                done:done + n]
            if f.readinto(buf.numpy()) != n:
                raise _bad(self.folder / e.file, "the file is corrupt or truncated (it ends "
                                                 f"inside tensor {name})")
            if cast:
                flat[done // size:(done + n) // size] = buf.view(e.dtype)
            done += n
        return out


# ---- writing ----------------------------------------------------------------------------------


def plan_shards(plan: list[tuple[str, torch.dtype, tuple[int, ...]]],
                max_bytes: int) -> list[list[tuple[str, torch.dtype, tuple[int, ...]]]]:
    """Tensors cut, in order, into shards of at most `max_bytes` (a larger tensor alone)."""
    shards: list[list] = [[]]
    size = 0
    for item in plan:
        n = math.prod(item[2]) * item[1].itemsize
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += n
    return shards


class ShardWriter:
    """Writes tensors, in the order of `plan` (name, dtype, shape), into safetensors shards
    of at most `max_bytes` in `folder`, plus an index when there is more than one shard (the
    names transformers' save_pretrained uses). `write` takes each tensor as it comes; `close`
    checks that all came."""

    def __init__(self, folder: Path, plan: list[tuple[str, torch.dtype, tuple[int, ...]]],
                 max_bytes: int) -> None:
        self.folder = Path(folder)
        self.shards = plan_shards(plan, max_bytes)
        n = len(self.shards)
        self.names = ([SINGLE] if n == 1 else
                      [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)])
        self.order = [(k, item) for k, shard in enumerate(self.shards) for item in shard]
        self.pos = 0
        self.file = None
        self.file_no = -1
        self.total = 0

    def _open(self, k: int) -> None:
        if self.file is not None:
            self.file.close()
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dtype, shape in self.shards[k]:
            n = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": _NAMES[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + n]}
            offset += n
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
        self.file = open(self.folder / self.names[k], "wb")  # noqa: SIM115 (closed in close)
        self.file.write(struct.pack("<Q", len(text)))
        self.file.write(text)
        self.file_no = k
        self.total += offset

    def write_parts(self, name: str, parts: Iterable[Tensor]) -> None:
        """One tensor given as consecutive slices of its rows (a large embedding computed a
        slice at a time), each in the planned dtype."""
        if self.pos >= len(self.order):
            raise RuntimeError(f"ShardWriter: {name} is not in the plan")
        k, (want, dtype, shape) = self.order[self.pos]
        if name != want:
            raise RuntimeError(f"ShardWriter: got {name}, the plan has {want} next")
        if k != self.file_no:
            self._open(k)
        rows = 0
        for t in parts:
            if t.dtype != dtype or tuple(t.shape[1:]) != tuple(shape[1:]):
                raise RuntimeError(f"ShardWriter: a slice of {name} is {t.dtype} "
                                   f"{tuple(t.shape)}, the plan has {dtype} {tuple(shape)}")
            data = t.detach().to("cpu").contiguous().reshape(-1)
            if data.numel():
                self.file.write(data.view(torch.uint8).numpy().data)
            rows += t.shape[0]
        if rows != shape[0]:
            raise RuntimeError(f"ShardWriter: {name} got {rows} rows of {shape[0]}")
        self.pos += 1

    def write(self, name: str, t: Tensor) -> None:
        if self.pos >= len(self.order):
            raise RuntimeError(f"ShardWriter: {name} is not in the plan")
        k, (want, dtype, shape) = self.order[self.pos]
        if name != want or t.dtype != dtype or tuple(t.shape) != tuple(shape):
            raise RuntimeError(f"ShardWriter: got {name} {t.dtype} {tuple(t.shape)}, the plan "
                               f"has {want} {dtype} {tuple(shape)} next")
        if k != self.file_no:
            self._open(k)
        data = t.detach().to("cpu").contiguous().reshape(-1)
        if data.numel():
            self.file.write(data.view(torch.uint8).numpy().data)
        self.pos += 1

    def close(self) -> list[str]:
        """Finish the last shard and write the index; returns the files written."""
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.pos != len(self.order):
            raise RuntimeError(f"ShardWriter: {len(self.order) - self.pos} planned tensors "
                               "were never written")
        if len(self.names) == 1:
            return list(self.names)
        index = {"metadata": {"total_size": self.total},
                 "weight_map": {name: self.names[k] for k, (name, _, _) in self.order}}
        (self.folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        return [*self.names, INDEX]

    def abort(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def save_sharded(state: Mapping[str, Tensor], folder: Path, max_bytes: int) -> list[str]:
    """`state` written as safetensors shards of at most `max_bytes` (tests and benches use
    it to make sharded checkpoints)."""
    plan = [(k, v.dtype, tuple(v.shape)) for k, v in state.items()]
    w = ShardWriter(folder, plan, max_bytes)
    try:
        for k, v in state.items():
            w.write(k, v)
        return w.close()
    finally:
        w.abort()


def copy_sharded(src: Path, dst: Path, shards: int) -> list[str]:
    """The model folder `src` copied into the new folder `dst` with its weights cut into
    `shards` safetensors shards of about equal size (other files copied as they are), one
    tensor at a time. For tests and benchmarks of sharded checkpoints."""
    import shutil

    src, dst = Path(src), Path(dst)
    checkpoint = Checkpoint(src)
    dst.mkdir(parents=True, exist_ok=False)
    weights = {INDEX, *checkpoint.files}
    for f in src.iterdir():
        if f.is_file() and f.name not in weights:
            shutil.copyfile(f, dst / f.name)
    entries = checkpoint.entries
    plan = [(n, e.dtype, e.shape) for n, e in entries.items()]
    writer = ShardWriter(dst, plan, -(-checkpoint.nbytes // shards))
    try:
        for n in entries:
            writer.write(n, checkpoint.read([n])[n])
        return writer.close()
    finally:
        writer.abort()

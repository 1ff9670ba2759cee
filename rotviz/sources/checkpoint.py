"""Safetensors checkpoints read lazily, so that a model larger than memory can be run and
matched at size, one block at a time.

`Checkpoint` knows every tensor's name, dtype and shape from the files' headers alone, checks
a sharded folder's index against its shards, and reads a few named tensors at a time with
plain file reads (nothing is memory-mapped, so a read costs the tensor's own bytes only). The
format is safetensors' own (an 8-byte little-endian header length, a JSON header, the raw
bytes). Writing checkpoints as they are made: rotviz.sources.shards.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from rotviz.confine import ANYWHERE, Confined, parse_json
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
DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
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
    return RotvizError(f"cannot read the checkpoint '{path}': {why}")


MAX_HEADER_BYTES = 100_000_000  # a safetensors header larger than this is refused unread
_REMEDY = "re-save the model with save_pretrained"


def _is_int(v: object) -> bool:
    """A JSON integer (a bool is no size or offset, and neither is 2.0 or "2")."""
    return isinstance(v, int) and not isinstance(v, bool)


def parse_header(head: bytes, data_bytes: int, file: Path) -> dict[str, Entry]:
    """The tensors a safetensors header describes, every field checked before any is used:
    bounded JSON (confine.parse_json), a table whose `__metadata__` is absent, null or text to
    text, known dtypes, shapes of non-negative integers whose element count fills the tensor's
    byte span, and integer offsets `0 <= begin <= end` that tile the `data_bytes` after the
    header exactly (no gap, no overlap): what the safetensors library itself demands, so the
    readers at size and in memory accept the same files. `start` is relative to the data."""
    corrupt = "the file is corrupt or truncated"
    header = parse_json(head, file, _REMEDY)
    if not isinstance(header, dict):
        raise _bad(file, f"{corrupt} (its header is not a table of tensors); {_REMEDY}")
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(
            isinstance(v, str) for v in meta.values())):
        raise _bad(file, f"{corrupt} (its __metadata__ is not a table of texts); {_REMEDY}")
    out: dict[str, Entry] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        wrong = f"{corrupt} (tensor {name[:80]!r} is described wrongly"
        if not isinstance(info, dict):
            raise _bad(file, f"{wrong}: not a table); {_REMEDY}")
        code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(code, str) or code not in _DTYPES:
            shown = code if isinstance(code, str) else type(code).__name__
            raise _bad(file, f"tensor {name[:80]!r} has dtype {str(shown)[:40]}, which rotviz "
                             f"does not read (it reads {', '.join(_DTYPES)}); {_REMEDY}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise _bad(file, f"{wrong}: its shape is not a list of sizes); {_REMEDY}")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(_is_int(o) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise _bad(file, f"{wrong}: its data_offsets are not two integers "
                             f"0 <= begin <= end); {_REMEDY}")
        begin, end = offsets
        dtype = _DTYPES[code]
        if math.prod(shape) * dtype.itemsize != end - begin:
            raise _bad(file, f"{corrupt} (tensor {name[:80]!r} does not fit its bytes: "
                             f"{code} {shape} is not {end - begin} bytes); {_REMEDY}")
        out[name] = Entry(file.name, dtype, tuple(shape), begin)
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            what = "overlaps the tensor before it" if begin < at else "leaves a gap before it"
            raise _bad(file, f"{corrupt} (tensor {name[:80]!r} {what}); {_REMEDY}")
        at = end
    if at != data_bytes:
        raise _bad(file, f"{corrupt} (its tensors fill {at} of the {data_bytes} bytes after "
                         f"the header); {_REMEDY}")
    return out


def _header(file: Path, confined: Confined = ANYWHERE, name: str | None = None
            ) -> dict[str, Entry]:
    """The tensors of the safetensors file `file` (opened through `confined`), from its
    header (parse_header), with `start` made absolute and `file` set to `name` (its name in
    the folder's index; default the file's own name)."""
    corrupt = "the file is corrupt or truncated"
    with confined.open(file, "weights file") as f:
        size = os.fstat(f.fileno()).st_size
        try:
            head = f.read(8)
            if len(head) < 8:
                raise _bad(file, f"{corrupt} (no header); {_REMEDY}")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise _bad(file, f"{corrupt} (header of {n} bytes); {_REMEDY}")
            text = f.read(n)
        except OSError as e:
            raise _bad(file, f"it cannot be read ({e.strerror or e})") from None
    if len(text) != n:
        raise _bad(file, f"{corrupt} (it ends inside its header); {_REMEDY}")
    entries = parse_header(text, size - 8 - n, file)
    label = name or file.name
    return {k: Entry(label, e.dtype, e.shape, 8 + n + e.start) for k, e in entries.items()}


def _index_error(index: Path, why: str) -> RotvizError:
    return RotvizError(f"index '{index}' {why}; re-save the model or copy it again")


def read_index(folder: Path, index: Path, confined: Confined = ANYWHERE) -> dict[str, str]:
    """The weight map (tensor name -> shard name) of an index file, checked: a JSON object
    whose `weight_map` is a non-empty table of tensor names to shard names, each shard a
    regular file inside `folder` (confine.Confined.inside: relative, no `..`, no link out)."""
    obj = confined.read_json(index, "re-save the model", "index")
    weight_map = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        kind = ("not a JSON object" if not isinstance(obj, dict) else
                "has no weight_map" if weight_map is None else
                "has an empty weight_map" if isinstance(weight_map, dict) else
                f"has a weight_map that is a {type(weight_map).__name__}, not a table")
        raise _index_error(index, f"is not a table of tensor names to shard files ({kind})")
    odd = [v for v in weight_map.values() if not isinstance(v, str) or not v]
    if odd:
        raise _index_error(index, f"names a shard {str(odd[0])[:40]!r} that is not a file name")
    shards = sorted(set(weight_map.values()))
    missing = [f for f in shards if _plain(f) and not _exists(folder / f)]
    if missing:
        raise _bad(folder, f"shard {missing[0]} named by {index.name} is missing "
                           f"({len(missing)} of {len(shards)} shards); copy the whole folder")
    for f in shards:
        confined.inside(folder, f, "shard")
    return weight_map


def _plain(name: str) -> bool:
    p = Path(name)
    return not p.is_absolute() and ".." not in p.parts and not name.startswith("~")


def _exists(path: Path) -> bool:
    """Whether anything (a file, a FIFO, a dangling link) sits at `path`: it is then read,
    and refused there if it is no regular file, rather than passed over."""
    return os.path.lexists(path)


class Checkpoint:
    """The safetensors weights of one model folder: a single `model.safetensors`, or shards
    listed by `model.safetensors.index.json`. Headers only are read here, and every one is
    checked (parse_header, read_index) before anything is built from them: the one reader
    both the paths at size and in memory validate a checkpoint with. Every file is
    opened through `confined` (the app passes its roots)."""

    def __init__(self, folder: str | Path, confined: Confined = ANYWHERE) -> None:
        self.folder = Path(folder)
        self.confined = confined
        # the byte ranges (tensor, offset, length) already read and found finite: a run at
        # size reads each block's tensors once per batch and each merged slice once per
        # pass, and checking them again each time took most of an evaluation's CPU
        self._finite: set[tuple[str, int, int]] = set()
        index = self.folder / INDEX
        single = self.folder / SINGLE
        has_index, has_single = _exists(index), _exists(single)
        if has_index and has_single:
            raise _bad(self.folder, f"it holds both {SINGLE} and {INDEX}, and readers differ "
                                    "on which one holds the weights (transformers reads "
                                    f"{SINGLE}); remove the one that is stale")
        if has_index:
            self.entries = self._from_index(index)
        elif has_single:
            self.entries = _header(single, confined)
        else:
            raise _bad(self.folder, f"it holds neither {SINGLE} nor {INDEX}; streaming reads "
                                    "safetensors only (re-save the model with "
                                    "save_pretrained)")

    def _from_index(self, index: Path) -> dict[str, Entry]:
        weight_map = read_index(self.folder, index, self.confined)
        files = sorted(set(weight_map.values()))
        entries: dict[str, Entry] = {}
        for f in files:
            for name, e in _header(self.folder / f, self.confined, f).items():
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
        return self.confined.open(self.folder / file, "weights file")

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
        if out.is_floating_point() and (name, skip, nbytes) not in self._finite:
            check_finite_tensor(out, name, self.folder)
            self._finite.add((name, skip, nbytes))
        return out


def check_finite_tensor(t: Tensor, name: str, where: object) -> None:
    """One line, as the in-memory sources.loading.check_finite says it, where `t` holds a NaN or
    Inf: blocks read at size are checked as they are read, so a bad late block stops the run before
    a solver meets it. Checked in slices (no copy of a large tensor) by their least and
    largest entries (`torch.aminmax`, which a NaN anywhere makes NaN and an infinity makes
    infinite): exact, with nothing to overflow, and in the tensor's own dtype several times
    faster than a float64 sum (which cast every float32 or half entry first)."""
    flat = t.reshape(-1)
    step = 1 << 22
    for lo in range(0, flat.numel(), step):
        least, largest = torch.aminmax(flat[lo:lo + step])
        if not (math.isfinite(float(least)) and math.isfinite(float(largest))):
            raise RotvizError(f"'{where}' has NaN or Inf weights in {name}; the checkpoint is "
                              "corrupt or diverged")

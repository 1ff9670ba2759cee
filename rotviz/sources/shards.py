"""Safetensors checkpoints written as a stream of shards, so that a model larger than memory
is written as it is made.

`ShardWriter` writes tensors in a planned order straight to shard files: the header of each
shard is written first (every name, dtype and shape is known ahead), then each tensor's bytes
as it arrives, so no shard is ever held whole in memory. The format is safetensors' own (read
back by rotviz.sources.checkpoint); tests read the written files back with the `safetensors`
library.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from rotviz.sources.checkpoint import DTYPE_NAMES, INDEX, SINGLE, Checkpoint

Tensor = torch.Tensor



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
        self.rows = 0  # rows of the tensor being written in slices

    def _open(self, k: int) -> None:
        if self.file is not None:
            self.file.close()
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dtype, shape in self.shards[k]:
            n = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape),
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
        self.begin(name)
        for t in parts:
            self.add(t)
        self.end()

    def begin(self, name: str) -> None:
        """Start tensor `name`, whose slices of rows `add` then takes and `end` closes (for
        slices that go to two writers at once)."""
        if self.pos >= len(self.order):
            raise RuntimeError(f"ShardWriter: {name} is not in the plan")
        k, (want, _, _) = self.order[self.pos]
        if name != want:
            raise RuntimeError(f"ShardWriter: got {name}, the plan has {want} next")
        if k != self.file_no:
            self._open(k)
        self.rows = 0

    def add(self, t: Tensor) -> None:
        _, (name, dtype, shape) = self.order[self.pos]
        if t.dtype != dtype or tuple(t.shape[1:]) != tuple(shape[1:]):
            raise RuntimeError(f"ShardWriter: a slice of {name} is {t.dtype} "
                               f"{tuple(t.shape)}, the plan has {dtype} {tuple(shape)}")
        data = t.detach().to("cpu").contiguous().reshape(-1)
        if data.numel():
            self.file.write(data.view(torch.uint8).numpy().data)
        self.rows += t.shape[0]

    def end(self) -> None:
        _, (name, _, shape) = self.order[self.pos]
        if self.rows != shape[0]:
            raise RuntimeError(f"ShardWriter: {name} got {self.rows} rows of {shape[0]}")
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

"""The one door through which rotviz reads a file.

Every file rotviz opens (weights, index entries, configs, tokenizer and processor files, data
files, the contents of data folders) is named through a `Confined` reader first. It resolves
the path (symbolic links followed) and refuses, in one line naming the file:
- anything that is not a regular file (a FIFO would block the reader forever, a device such as
  /dev/zero never ends, a folder is no file);
- in the app, anything that resolves outside its roots (`Confined(roots)`): a link out of a
  model folder, an index entry naming `../../elsewhere`, a data file that links out.

The command line reads where its user points (`ANYWHERE`: no roots), but still regular files
only. A name inside a folder (an index entry, a class folder's image) is checked relative to
that folder with `inside`, which also refuses absolute names and `..`.

Files are opened with O_NONBLOCK and checked again on the open descriptor, so a path swapped
for a FIFO between the check and the open cannot block either. rotviz's own modules never call
`open`, `read_text` or a library loader on a user's path except through here: a test scans
the sources for such calls (tests/test_confine.py), so a new loader cannot forget the check.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rotviz.errors import RotvizError

MAX_JSON_BYTES = 64_000_000  # a config, index or tokenizer file larger than this is refused
MAX_JSON_DEPTH = 64  # nesting of a JSON document that rotviz reads (headers, configs, indexes)


def json_depth(text: str | bytes) -> int:
    """The deepest nesting of brackets and braces in a JSON text, counted without parsing
    (so a document nested 100,000 deep is measured, not recursed into)."""
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogatepass")
    depth = deepest = 0
    in_string = escaped = False
    for byte in text:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def parse_json(text: str | bytes, where: str | os.PathLike, remedy: str) -> Any:
    """A JSON document, refused in one line when it is not JSON, is nested deeper than
    MAX_JSON_DEPTH, or holds NaN or Infinity (which JSON does not have)."""
    if json_depth(text) > MAX_JSON_DEPTH:
        raise RotvizError(f"cannot parse '{where}' (nested deeper than {MAX_JSON_DEPTH} "
                          f"levels); {remedy}")

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, parse_constant=constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise RotvizError(f"cannot parse '{where}' ({e.__class__.__name__}); {remedy}") from None


def cache_stores(folder: str | os.PathLike) -> tuple[Path, ...]:
    """Where the files of a Hugging Face cache snapshot may lead, besides the snapshot itself.

    huggingface_hub lays its cache out as `CACHE/models--ORG--NAME/{refs,blobs,snapshots}`:
    each file of `snapshots/COMMIT/` is a link into the repository's own `blobs/`, which may
    link on into the cache-wide store `CACHE/blobs/`. For a folder at or under such a
    snapshot (resolved), those two folders, named lexically (a `blobs/` that is itself a link
    elsewhere does not move them); () for any other folder. Any link leading elsewhere is no
    link of the cache's own."""
    real = Path(folder).resolve()
    for p in (real, *real.parents):
        repo = p.parent.parent
        if p.parent.name == "snapshots" and repo.name.startswith("models--"):
            return repo / "blobs", repo.parent / "blobs"
    return ()


@dataclass(frozen=True)
class Confined:
    """Reads regular files only, and, when `roots` is not empty, only files that resolve
    inside one of them. Immutable: pass it to whatever reads."""

    roots: tuple[Path, ...] = ()
    label: str = "roots"  # what the roots are called in a refusal ("the model roots")

    @classmethod
    def under(cls, roots: Sequence[str | os.PathLike], label: str = "roots") -> Confined:
        return cls(tuple(Path(r).expanduser().resolve() for r in roots), label)

    # ---- resolving ----------------------------------------------------------------------

    def allows(self, real: Path) -> bool:
        """Whether the resolved path `real` lies inside the roots (always, without roots)."""
        return not self.roots or any(real == r or real.is_relative_to(r) for r in self.roots)

    def _confine(self, given: str | os.PathLike, what: str) -> Path:
        text = str(given)
        if "\0" in text:
            raise RotvizError(f"{what} '{text[:80]}' holds a NUL character; give a plain path")
        try:
            real = Path(text).expanduser().resolve()
        except (OSError, RuntimeError) as e:  # a loop of links
            raise RotvizError(f"{what} '{given}' cannot be resolved ({e}); "
                              "fix or remove the link") from None
        if not self.allows(real):
            roots = ", ".join(map(str, self.roots))
            raise RotvizError(f"{what} '{given}' leads to '{real}', outside the {self.label} "
                              f"({roots}); copy it under a root or add its folder to the "
                              f"{self.label}")
        return real

    def file(self, path: str | os.PathLike, what: str = "file") -> Path:
        """The resolved path of a regular file the reader may open; one line otherwise."""
        real = self._confine(path, what)
        try:
            st = real.stat()
        except OSError:
            raise RotvizError(f"{what} '{path}' does not exist; check the path") from None
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise RotvizError(f"{what} '{path}' is {kind}; give a regular file")
        return real

    def folder(self, path: str | os.PathLike, what: str = "folder") -> Path:
        """The resolved path of a folder inside the roots; one line otherwise."""
        real = self._confine(path, what)
        if not real.is_dir():
            raise RotvizError(f"{what} '{path}' is not a folder; check the path")
        return real

    def inside(self, folder: str | os.PathLike, name: str, what: str = "file") -> Path:
        """The regular file that `name`, as written in a file of `folder` (an index entry, a
        listed shard), names: relative, no `..`, and resolving inside `folder` itself (and
        the roots), so an index cannot point a loader anywhere else. In a Hugging Face cache
        snapshot, a file may also resolve into the cache's blobs (`cache_stores`): the
        cache's own links, and only those."""
        base = Path(folder).resolve()
        if not isinstance(name, str) or not name or "\0" in name:
            raise RotvizError(f"{what} {name!r} named in '{folder}' is not a file name; "
                              "re-save the folder")
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts or name.startswith("~"):
            raise RotvizError(f"{what} '{name}' named in '{folder}' is not a plain relative "
                              "name inside the folder; re-save the folder")
        real = self.file(base / rel, what)
        if not real.is_relative_to(base) and not any(real.is_relative_to(s)
                                                     for s in cache_stores(base)):
            raise RotvizError(f"{what} '{name}' in '{folder}' leads to '{real}', outside the "
                              "folder; copy the file into the folder instead")
        return real

    def entries(self, folder: str | os.PathLike, what: str = "folder") -> Iterator[Path]:
        """The paths in `folder` (sorted, hidden names skipped) that resolve inside the
        roots and are regular files or folders; the rest (links out, FIFOs, sockets) are
        left out, as a listing must not offer what a read would refuse."""
        base = self.folder(folder, what)
        try:
            names = sorted(os.listdir(base))
        except OSError as e:
            raise RotvizError(f"{what} '{folder}' cannot be listed ({e.strerror or e})"
                              ) from None
        for name in names:
            if name.startswith("."):
                continue
            p = base / name
            try:
                real = p.resolve()
                mode = real.stat().st_mode
            except (OSError, RuntimeError):
                continue
            if self.allows(real) and (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                yield p

    def files(self, folder: str | os.PathLike, what: str = "folder") -> list[Path]:
        """The regular files directly in `folder` that the reader may open."""
        return [p for p in self.entries(folder, what) if p.is_file()]

    def check_tree(self, folder: str | os.PathLike, what: str = "folder") -> Path:
        """Every entry under `folder` checked (regular files and folders inside the roots),
        before a library that walks it itself (datasets, transformers) is handed it. Links
        to folders are followed once each, so a link to a parent cannot loop."""
        base = self.folder(folder, what)
        self._check_tree(base, what, {base})
        return base

    def _check_tree(self, base: Path, what: str, seen: set[Path]) -> None:
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            for name in [*dirnames, *filenames]:
                p = Path(dirpath) / name
                if p.is_dir() and not p.is_symlink():
                    continue  # os.walk goes into it
                real = self._confine(p, f"{what} entry")
                if real.is_dir():
                    if real not in seen:
                        seen.add(real)
                        self._check_tree(real, what, seen)
                    continue
                self.file(p, f"{what} entry")

    # ---- reading ------------------------------------------------------------------------

    def open(self, path: str | os.PathLike, what: str = "file") -> IO[bytes]:
        """A checked regular file, opened for binary reading. Opened non-blocking and
        checked again on the descriptor, so a FIFO swapped in after the check cannot block."""
        real = self.file(path, what)
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise RotvizError(f"{what} '{path}' cannot be read ({e.strerror or e})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RotvizError(f"{what} '{path}' is not a regular file; give a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")

    def read_bytes(self, path: str | os.PathLike, what: str = "file",
                   limit: int | None = None) -> bytes:
        """A checked file's bytes; a file larger than `limit` bytes is refused unread."""
        with self.open(path, what) as f:
            size = os.fstat(f.fileno()).st_size
            if limit is not None and size > limit:
                raise RotvizError(f"{what} '{path}' is {size} bytes, more than the {limit} "
                                  "rotviz reads for it; check that it is the right file")
            return f.read()

    def read_text(self, path: str | os.PathLike, what: str = "file",
                  limit: int | None = None) -> str:
        data = self.read_bytes(path, what, limit)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise RotvizError(f"{what} '{path}' is not UTF-8 text; save it as UTF-8") from None

    def read_json(self, path: str | os.PathLike, remedy: str, what: str = "file") -> Any:
        """A checked JSON file's content (bounded size and depth, no NaN); one line ending
        in `remedy` otherwise."""
        data = self.read_bytes(path, what, MAX_JSON_BYTES)
        return parse_json(data, path, remedy)


ANYWHERE = Confined()  # the command line: any path its user gives, regular files only

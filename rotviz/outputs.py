"""A command's outputs as one transaction: every path checked before any work, everything
written into temporary siblings, renamed into place only when all of it has succeeded.

rotviz never deletes what it did not write. It recognises its own output by a marker:
- a folder it wrote holds `rotviz-output.json`, which lists every file it put there;
- a JSON file it wrote has a top-level `"rotviz"` entry;
- any other text file it wrote (a mergekit YAML) starts with the line `# written by rotviz`.

A file output (`--json`, `--figure`, `--animation`, `--mergekit-config`) goes into a folder
that exists: a missing one is refused, not made. A folder output's missing parents are made
(`zoo build --out DIR` writes DIR/NAME), and removed again if the command fails.

An existing folder that holds files, or an existing file, is refused unless `overwrite` is
given, and even then only when it is a rotviz output holding nothing but what rotviz listed.
The current folder, its parents and `/` are always refused, and so is any output that equals,
holds or lies inside one of the command's inputs (a model folder, a data file or folder), even
with `overwrite`: `rotviz match A B --out B --overwrite` would otherwise replace the source in
place. New files and folders follow the umask. An interrupt (Ctrl-C, or SIGTERM as `timeout`
and torchrun send: the command line turns it into an exception) or an error while writing
leaves no temporary sibling behind and the previous output, if any, in place.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rotviz.confine import ANYWHERE
from rotviz.errors import RotvizError
from rotviz.version import __version__

MARKER = "rotviz-output.json"
JSON_KEY = "rotviz"
TEXT_STAMP = "# written by rotviz "  # the first line of a text file rotviz writes
_TMP = ".rotviz-tmp-"
_OLD = ".rotviz-old-"


def _version() -> str:
    return __version__


def json_stamp(command: str) -> dict[str, str]:
    """The entry that marks a JSON file as written by rotviz (and by which command)."""
    return {"version": _version(), "command": command}


@dataclass(frozen=True)
class Output:
    """One output path: a model folder (`folder=True`) or a file, as given by `flag`."""

    path: Path  # absolute, not resolved (a symbolic link is refused, not followed)
    flag: str
    folder: bool
    overwrite: bool
    replaces: bool  # something of ours (or an empty folder) is there and will be replaced


def _err(flag: str, path: str | os.PathLike, why: str) -> RotvizError:
    return RotvizError(f"{flag} '{path}' {why}")


def _absolute(path: str | os.PathLike, flag: str) -> Path:
    text = str(path)
    if not text.strip():
        raise RotvizError(f"{flag} is empty: give a path")
    if "\0" in text:
        raise RotvizError(f"{flag} holds a NUL character: give a plain path")
    p = Path(text).expanduser()
    return p if p.is_absolute() else Path.cwd() / p


def _nearest_existing(p: Path) -> Path:
    q = p
    while not os.path.lexists(q):
        q = q.parent
    return q


def _check_parent(p: Path, given: str | os.PathLike, flag: str) -> None:
    """The folder that will hold `p` exists or can be made, and can be written to."""
    anc = _nearest_existing(p.parent)
    if not anc.is_dir():
        raise _err(flag, given, f"lies under '{anc}', which is a file, not a folder")
    probe = anc / f"{_TMP}probe-{secrets.token_hex(4)}"
    try:  # the only sure test (root passes os.access on read-only mounts and /proc)
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as e:
        raise _err(flag, given, f"cannot be written: '{anc}' refuses new entries "
                                f"({e.strerror or e.__class__.__name__}); give another "
                                "location") from None


def _is_cwd_or_parent(p: Path) -> bool:
    real, cwd = p.resolve(), Path.cwd().resolve()
    return real == cwd or cwd.is_relative_to(real) or real == Path(real.anchor)


def listed_files(folder: Path) -> set[str] | None:
    """The files a rotviz output folder's marker lists, or None if it is not one."""
    try:  # through the one reader: a FIFO named like the marker must not block
        marker = ANYWHERE.read_json(folder / MARKER, "it is not rotviz's", "output marker")
        files = marker["files"]
    except (RotvizError, KeyError, TypeError):
        return None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return set(files) | {MARKER}


def _strangers(folder: Path, ours: set[str]) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.name not in ours or e.is_dir())


def _check_replace_folder(p: Path, given, flag: str, overwrite: bool) -> None:
    if not overwrite:
        raise _err(flag, given, "is a folder that already holds files; give a new folder, or "
                                "add --overwrite to replace an earlier rotviz output")
    ours = listed_files(p)
    if ours is None:
        raise _err(flag, given, f"was not written by rotviz (no {MARKER}), so --overwrite "
                                "will not replace it; give a new folder")
    extra = _strangers(p, ours)
    if extra:
        raise _err(flag, given, f"holds entries rotviz did not write ({', '.join(extra[:3])}); "
                                "--overwrite will not delete them: move them or give a new "
                                "folder")


def text_stamp(command: str) -> str:
    """The first line that marks a text file (not JSON) as written by rotviz's `command`."""
    return f"{TEXT_STAMP}{_version()} ({command})\n"


def is_rotviz_json(p: Path) -> bool:
    try:
        obj = ANYWHERE.read_json(p, "it is not rotviz's", "output")
    except RotvizError:
        return False
    return isinstance(obj, dict) and isinstance(obj.get(JSON_KEY), dict)


def is_rotviz_file(p: Path) -> bool:
    """A file rotviz wrote: JSON with its entry, or text whose first line is its stamp."""
    if is_rotviz_json(p):
        return True
    try:  # through the one reader (a FIFO must not block); a large file is not ours
        head = ANYWHERE.read_bytes(p, "output", 1 << 20)
    except RotvizError:
        return False
    return head.startswith(TEXT_STAMP.encode())


def _kind(p: Path) -> str:
    """What an existing non-folder path is, in words: a device such as /dev/full is no
    "file" to a user, and calling it one hides why it was refused."""
    try:
        mode = p.stat().st_mode
    except OSError:
        return "unreadable"
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refuse_missing_folder(p: Path, given: str | os.PathLike, flag: str) -> None:
    """A file lands in a folder the user names: a typo there would otherwise become a new
    folder tree, made without a word (a folder output's parents are made, as documented)."""
    if not os.path.lexists(p.parent):
        raise _err(flag, given, f"lies in '{p.parent}', which does not exist; create that "
                                "folder first, or give a path in an existing one")


def check_output(path: str | os.PathLike, flag: str, *, folder: bool,
                 overwrite: bool = False, inputs: Sequence[tuple[str, Path]] = (),
                 later: bool = False) -> Output:
    """Check one output path before any work; nothing is created or changed. An output
    apart from none of the `inputs` (what, resolved path) is refused whatever `overwrite`
    says. A file output's missing folder is refused (`later`: the caller refuses it after
    its own checks, `Outputs.add` after the outputs are known to lie apart)."""
    p = _absolute(path, flag)
    if p.is_symlink():
        raise _err(flag, path, "is a symbolic link; give the real path")
    if folder and _is_cwd_or_parent(p):
        raise _err(flag, path, "is the current folder, one of its parents or /; give a new "
                               "folder for the output")
    if not folder and not later:
        _refuse_missing_folder(p, path, flag)
    _check_parent(p, path, flag)
    exists = os.path.lexists(p)
    if exists:
        if folder and not p.is_dir():
            raise _err(flag, path, f"is {_kind(p)}, not a folder; give a folder path")
        if not folder and p.is_dir():
            raise _err(flag, path, "is a folder; give a file name")
        if not folder and not p.is_file():
            raise _err(flag, path, f"is {_kind(p)}, not a regular file; give a file name")
    for what, real in inputs:  # before --overwrite is considered: it cannot make this right
        _apart(flag, p, what, real)
    replaces = False
    if exists:
        if folder and any(os.scandir(p)):
            _check_replace_folder(p, path, flag, overwrite)
        elif not folder:
            if not overwrite:
                raise _err(flag, path, "already exists; give a new file name, or add "
                                       "--overwrite to replace an earlier rotviz output")
            if not is_rotviz_file(p):
                raise _err(flag, path, "was not written by rotviz, so --overwrite will not "
                                       "replace it; give a new file name")
        replaces = True
    return Output(p, flag, folder, overwrite, replaces)


@dataclass
class Outputs:
    """The outputs of one command: `add` checks each before any work, `write` commits them."""

    command: str
    items: list[Output] = field(default_factory=list)
    inputs: list[tuple[str, Path]] = field(default_factory=list)  # (what, resolved path)

    def reads(self, path: str | os.PathLike | None, what: str) -> None:
        """Record a file or folder the command reads (`what` names it in messages): no
        output may equal, hold or lie inside it, whatever `overwrite` says."""
        if path is None or not str(path).strip() or "\0" in str(path):
            return  # the reader says what is wrong with such a path
        real = _absolute(path, what).resolve()
        for out in self.items:
            _apart(out.flag, out.path, what, real)
        self.inputs.append((what, real))

    def add(self, path: str | os.PathLike | None, flag: str, *, folder: bool,
            overwrite: bool = False) -> Output | None:
        if path is None:
            return None
        out = check_output(path, flag, folder=folder, overwrite=overwrite,
                           inputs=self.inputs, later=True)
        for other in self.items:
            a, b = out.path.resolve(), other.path.resolve()
            if a == b or a.is_relative_to(b) or b.is_relative_to(a):
                inner, outer = (out, other) if a.is_relative_to(b) else (other, out)
                raise RotvizError(f"{inner.flag} '{inner.path}' lies inside or on "
                                  f"{outer.flag} '{outer.path}'; give paths apart")
        if not folder:  # after: `--out p --json p/r.json` is that, not a missing folder p
            _refuse_missing_folder(out.path, path, flag)
        self.items.append(out)
        return out

    @contextmanager
    def write(self) -> Iterator[Mapping[Output, Path]]:
        """Yield a temporary sibling for every output; on success rename each into place.

        On any failure, an interrupt included, the temporaries (and any parent folders made
        for them) are removed and earlier outputs stay as they were."""
        made: list[Path] = []  # parent folders created here, deepest last
        temps: dict[Output, Path] = {}
        try:
            for out in self.items:
                made += _make_parents(out.path.parent)
                tmp = out.path.parent / f"{_TMP}{out.path.name}-{secrets.token_hex(4)}"
                if out.folder:
                    os.mkdir(tmp)  # mode 0o777 less the umask
                temps[out] = tmp
            yield temps
            for out, tmp in temps.items():
                if out.folder:
                    _write_marker(tmp, self.command)
                elif not tmp.is_file():
                    raise RotvizError(f"internal: {out.flag} was not written")
            for out, tmp in temps.items():
                _commit(out, tmp)
            made.clear()
        except OSError as e:  # a full disk, a folder removed under us: say so in one line
            where = f" ({e.filename})" if e.filename else ""
            raise RotvizError(f"writing the outputs failed: {e.strerror or e}{where}; nothing "
                              "was written") from None
        except Exception as e:
            if not _is_safetensors_error(e):
                raise
            # safetensors' writer reports an OS error (a full disk) as its own type, in a
            # Rust debug string: keep the OS's words
            text = " ".join(str(e).split())
            found = re.search(r'message: \\?"([^"\\]+)', text)
            why = found.group(1) if found else text[:160]
            raise RotvizError(f"writing the outputs failed: {why}; nothing was written"
                              ) from None
        finally:
            for tmp in temps.values():
                _remove_ours(tmp)
            for d in reversed(made):
                try:
                    d.rmdir()
                except OSError:
                    pass


def _apart(flag: str, path: Path, what: str, real: Path) -> None:
    """Refuse the output `path` where it equals, holds or lies inside the input `real`."""
    mine = path.resolve()
    how = ("is" if mine == real else "lies inside" if mine.is_relative_to(real)
           else "holds" if real.is_relative_to(mine) else None)
    if how:
        raise RotvizError(f"{flag} '{path}' {how} the input {what} '{real}'; rotviz "
                          "never writes over its inputs, even with --overwrite: give a path "
                          "apart from them")


def _is_safetensors_error(e: BaseException) -> bool:
    return type(e).__name__ == "SafetensorError" or "safetensors" in type(e).__module__


def _make_parents(d: Path) -> list[Path]:
    missing = []
    while not os.path.lexists(d):
        missing.append(d)
        d = d.parent
    for m in reversed(missing):
        os.mkdir(m)
    return list(reversed(missing))


def _follow_umask(folder: Path) -> None:
    """Give every file in `folder` the mode a plain new file gets (0o666 less the umask):
    some writers (safetensors via transformers) create theirs 0o600 whatever the umask."""
    probe = folder / f"{_TMP}umask"
    with open(probe, "x"):
        pass
    mode = probe.stat().st_mode & 0o777
    probe.unlink()
    for e in os.scandir(folder):
        if e.is_file(follow_symlinks=False):
            os.chmod(e.path, mode)


def _write_marker(folder: Path, command: str) -> None:
    _follow_umask(folder)
    files = sorted(e.name for e in os.scandir(folder))
    body = {"written_by": f"rotviz {_version()}", "command": command, "files": files}
    (folder / MARKER).write_text(json.dumps(body, indent=2) + "\n")


def _commit(out: Output, tmp: Path) -> None:
    p = out.path
    if not out.folder:
        if os.path.lexists(p) and not (out.overwrite and is_rotviz_file(p)):
            raise _err(out.flag, p, "appeared while rotviz was working; nothing was replaced")
        os.replace(tmp, p)
        return
    if not os.path.lexists(p):
        os.rename(tmp, p)
        return
    if p.is_symlink() or not p.is_dir():
        raise _err(out.flag, p, "changed while rotviz was working; nothing was replaced")
    if not any(os.scandir(p)):
        os.rename(tmp, p)  # POSIX replaces an empty folder
        return
    _check_replace_folder(p, p, out.flag, out.overwrite)  # again: it may have changed
    old = p.parent / f"{_OLD}{p.name}-{secrets.token_hex(4)}"
    os.rename(p, old)
    try:
        os.rename(tmp, p)
    except BaseException:
        os.rename(old, p)
        raise
    _remove_ours(old)


def _remove_ours(path: Path) -> None:
    """Remove a temporary or replaced path that rotviz itself made."""
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            pass


def _non_finite(obj: Any, where: str = "") -> str | None:
    """The key path of the first NaN or infinity in `obj`, or None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return where or "the top level"
    items = obj.items() if isinstance(obj, dict) else (
        enumerate(obj) if isinstance(obj, (list, tuple)) else ())
    for k, v in items:
        found = _non_finite(v, f"{where}[{k}]" if isinstance(k, int) else
                            f"{where}.{k}" if where else str(k))
        if found:
            return found
    return None


def write_json_file(path: Path, obj: Any, command: str) -> None:
    """`obj` (a dict) as JSON, stamped as rotviz output, to `path` (a temporary sibling).

    Every `--json` goes through here, and it is strict JSON (allow_nan=False): Python's
    default writes NaN and Infinity, which strict parsers (JavaScript, jq, most languages'
    standard readers) reject. A statistic that is undefined is None (null) where the record
    makes it, and says so in its documentation; a non-finite number that reaches this point
    is a bug, raised (ValueError, naming the key) rather than written."""
    body = {JSON_KEY: json_stamp(command), **obj} if isinstance(obj, dict) else obj
    try:
        text = json.dumps(body, indent=2, allow_nan=False)
    except ValueError:
        where = _non_finite(body)
        if where is None:
            raise
        raise ValueError(f"internal: {command}'s JSON holds a non-finite number at {where}; "
                         "it must be null there (rotviz writes strict JSON)") from None
    with open(path, "x") as f:  # mode 0o666 less the umask
        f.write(text + "\n")

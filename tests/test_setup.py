"""`.ci/setup`, the README's set-up: safe when two run at once (the cached environment is built
under a lock), and each clone's `.venv` runs that clone's code, not the last one set up.

These tests reuse the cached environment this checkout was set up with (building one takes
minutes), so they run where `.ci/setup` made `.venv` and are skipped elsewhere.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER = ROOT / ".venv" / ".rotviz-layer"
NEEDED = (".ci", "rotviz", "pyproject.toml", "README.md", "LICENSE")


def _env_dir() -> Path:
    if not LAYER.is_file():
        pytest.skip("this checkout was not set up by .ci/setup")
    env_dir = Path(LAYER.read_text().strip())
    if not (env_dir / ".complete").is_file():
        pytest.skip("the cached environment is not complete")
    return env_dir


def _clone(dst: Path) -> Path:
    """The files set-up reads, copied: a clone as far as .ci/setup can tell."""
    dst.mkdir()
    for name in NEEDED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst / name)
    return dst


def _env(env_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["ROTVIZ_ENV_CACHE"] = str(env_dir.parent)
    return env


def _setup(clone: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(clone / ".ci" / "setup")], cwd="/", env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _own_rotviz(clone: Path) -> str:
    out = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c",
                          "import rotviz; print(rotviz.__file__)"], cwd="/",
                         capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _child_named(pid: int, name: str) -> bool:
    """Whether process `pid` has a child process called `name` (from /proc)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # it ended meanwhile
            continue
        comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:]
        if comm == name and int(rest.split()[1]) == pid:
            return True
    return False


def test_two_setups_wait_for_the_lock_then_each_run_their_own_clone(tmp_path):
    """Two set-ups started at once while another holds the cached environment's lock: neither
    touches it until the lock is let go; then both finish (each waiting for the other's hold of
    the lock), and each clone's `.venv` runs its own rotviz. One test, so that the two clones'
    set-ups (a venv and an editable install each, about 6 CPU-s) serve both checks."""
    env_dir = _env_dir()
    env = _env(env_dir)
    a, b = _clone(tmp_path / "a"), _clone(tmp_path / "b")
    listed = subprocess.run(["python3", str(ROOT / ".ci" / "requirements.py"), "dev"],
                            capture_output=True, text=True, check=True).stdout
    digest = hashlib.sha256(listed.encode()).hexdigest()[:16]
    assert env_dir.name == f"venv-{digest}"
    with open(env_dir.parent / f".lock-{digest}", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        procs = [_setup(c, env) for c in (a, b)]
        deadline = time.monotonic() + 60  # until each set-up waits in `flock` for the lock
        while time.monotonic() < deadline and not all(
                p.poll() is not None or _child_named(p.pid, "flock") for p in procs):
            time.sleep(0.05)
        time.sleep(0.3)
        waiting = all(p.poll() is None for p in procs) and not any(
            (c / ".venv").exists() for c in (a, b))
        fcntl.flock(lock, fcntl.LOCK_UN)
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert waiting, "set-up went on while another held the lock"
    assert _own_rotviz(a) == str(a / "rotviz" / "__init__.py")
    assert _own_rotviz(b) == str(b / "rotviz" / "__init__.py")
    for c in (a, b):  # the command too, and the shared environment behind it
        out = subprocess.run([str(c / ".venv" / "bin" / "rotviz"), "--help"], cwd="/",
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "match" in out.stdout, out.stderr
        assert (c / ".venv" / ".rotviz-layer").read_text().strip() == str(env_dir)
    # the cached environment holds no rotviz of any clone
    found = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                            "import importlib.util as u; print(u.find_spec('rotviz'))"],
                           cwd="/", capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert found.stdout.strip() == "None", found.stdout

"""rotviz as a user installs it: the wheel, built from the sdist, in a fresh virtual environment
that sees the dependencies and not this checkout, run from a folder outside the checkout, with
its site-packages read-only.

What a source checkout hides and these tests catch: a dependency missing from the metadata, a
module or data file left out of the wheel or the sdist, a path that only resolves inside the
repository (the app, the zoo, the shipped data), and a write into the installed package.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
import torch

import rotviz
from rotviz import zoo_registry as zoo
from rotviz.cli import main

tomllib = pytest.importorskip("tomllib")  # Python 3.11+, as .ci/setup needs

REPO = Path(__file__).resolve().parents[1]
# What the sdist is made from: everything its MANIFEST.in and pyproject.toml may name.
SOURCES = ("pyproject.toml", "README.md", "CHANGELOG.md", "LICENSE", "MANIFEST.in", "rotviz")
# Three points (0, 0.5, 1): the same code as the default 21 (the barrier is the midpoint's on
# this pair either way), with 3 evaluations of the path instead of 21, run twice (installed, here)
BARRIER = ["barrier", "zoo:vit-digits-s3", "zoo:vit-digits-s6", "--data", "digits",
           "--match", "seed", "--points", "3"]


def _build(backend: str, source: Path, out: Path) -> Path:
    """Run setuptools' PEP 517 hook `backend` (build_sdist or build_wheel) in `source`."""
    code = f"from setuptools import build_meta as b; print(b.{backend}({str(out)!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist built from a copy of the checkout's sources, the wheel built from that sdist
    (as pip builds one), and a wheel built from the sources directly, for comparison."""
    root = tmp_path_factory.mktemp("dists")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    out = root / "dist"
    out.mkdir()
    sdist = _build("build_sdist", src, out)
    with tarfile.open(sdist) as tar:
        tar.extractall(root / "unpacked", filter="data")
    (unpacked,) = (root / "unpacked").iterdir()
    wheel = _build("build_wheel", unpacked, out)
    direct = root / "direct"
    direct.mkdir()
    return {"sdist": sdist, "wheel": wheel, "direct": _build("build_wheel", src, direct)}


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if ".dist-info/" not in n}


def test_wheel_holds_the_package_its_data_and_its_dependencies(dists):
    wheel = dists["wheel"]
    names = _names(wheel)
    assert names == _names(dists["direct"])  # the sdist holds all the wheel is built from
    package = {p.relative_to(REPO).as_posix() for p in (REPO / "rotviz").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert {n for n in names if n.endswith(".py")} == package
    data = {p.relative_to(REPO).as_posix() for p in (REPO / "rotviz/assets/data").rglob("*")
            if p.is_file()}
    assert data and data <= names
    shipped = {n.split("/")[3] for n in names if n.startswith("rotviz/assets/zoo/")}
    assert shipped == set(zoo.PAIRS["default"])  # the default pair, nothing else
    for name in shipped:
        model = {p.relative_to(REPO).as_posix() for p in (zoo.SHIPPED / name).iterdir()}
        assert model <= names
    assert wheel.stat().st_size < 10 * 2**20  # well under the 100 MB a wheel may be
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"rotviz-{rotviz.__version__}.dist-info/METADATA").decode()
    requires = [line.split(": ", 1)[1] for line in meta.splitlines()
                if line.startswith("Requires-Dist: ")]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = [r for r in requires if "extra ==" not in r]
    assert [r.replace(" ", "") for r in runtime] == \
        [_canonical(r) for r in project["dependencies"]]
    for extra, reqs in project["optional-dependencies"].items():
        assert f"Provides-Extra: {extra}" in meta
        assert len([r for r in requires if r.endswith(f'extra == "{extra}"')]) == len(reqs)
    assert f"Version: {rotviz.__version__}" in meta


def _canonical(req: str) -> str:
    """A requirement as METADATA writes it: specifiers sorted the way packaging sorts them."""
    from packaging.requirements import Requirement

    return str(Requirement(req)).replace(" ", "")


@pytest.fixture(scope="module")
def installed(dists, tmp_path_factory) -> dict:
    """A fresh virtual environment with the wheel installed and the dependencies visible (the
    environment that holds torch, added as a site directory), its site-packages made
    read-only; a working folder, a home and a user cache outside the checkout."""
    root = tmp_path_factory.mktemp("installed")
    deps = Path(torch.__file__).resolve().parents[1]
    assert not (deps / "rotviz").exists(), f"{deps} holds a rotviz of its own"
    venv = root / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; "
                                "print(sysconfig.get_path('purelib'))"], capture_output=True,
                               text=True, check=True).stdout.strip())
    (site / "_deps.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                          "--no-deps", "--no-index", "--quiet", str(dists["wheel"])],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr[-3000:]
    for path in site.rglob("*"):  # read-only for whoever is not root (CI runs as root:
        mode = path.stat().st_mode  # the snapshot in `_unchanged` checks it there)
        os.chmod(path, mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    work, home, cache = root / "work", root / "home", root / "cache"
    for d in (work, home):
        d.mkdir()
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "BROWSER_PATH")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(HOME=str(home), ROTVIZ_CACHE=str(cache), HF_HUB_OFFLINE="1",
               PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    return {"root": root, "venv": venv, "site": site, "work": work, "cache": cache, "env": env,
            "before": _snapshot(site)}


def _snapshot(site: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(site).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in site.rglob("*") if p.is_file()}


def _run(inst: dict, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(inst["venv"] / "bin" / "rotviz"), *args], cwd=inst["work"],
                          env=inst["env"], capture_output=True, text=True, timeout=timeout)


def _unchanged(inst: dict) -> None:
    after = _snapshot(inst["site"])
    assert after == inst["before"], sorted(set(after.items()) ^ set(inst["before"].items()))[:5]


# The installed commands that read or build models, run one after another by one interpreter
# of the installed environment through the entry point the `rotviz` script calls
# (rotviz.cli:main): each fresh interpreter pays about 3 s of CPU importing torch and
# transformers, and a process of their own would test nothing more here (the `rotviz` script
# itself runs below for --version, zoo list and serve). Each command's stdout and stderr are
# told apart by a line of their own, written and flushed between commands; the refusal runs
# first, so that its one line of stderr is counted in a fresh interpreter, imports included.
SEVERAL = """
import json, sys
import rotviz
from rotviz.cli import main
from rotviz.data.files import data_path
print(json.dumps({"file": rotviz.__file__,
                  "data": str(data_path("assets/data/pydoc-topics.jsonl"))}), flush=True)
rcs = []
for argv in json.loads(sys.argv[1]):
    for f in (sys.stdout, sys.stderr):
        print("\\x00next", flush=True, file=f)
    rcs.append(main(argv))
    sys.stdout.flush(), sys.stderr.flush()
for f in (sys.stdout, sys.stderr):
    print("\\x00next", flush=True, file=f)
print(json.dumps(rcs), flush=True)
"""
MARK = "\x00next\n"  # the line SEVERAL writes between commands


def _several(inst: dict, *commands: list[str]) -> tuple[dict, list]:
    """Run `commands` in one interpreter of the installed environment: (where rotviz and its data
    resolve there, each command as (returncode, stdout, stderr))."""
    done = subprocess.run([str(inst["venv"] / "bin" / "python"), "-c", SEVERAL,
                           json.dumps(commands)], cwd=inst["work"], env=inst["env"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    outs, errs = done.stdout.split(MARK), done.stderr.split(MARK)
    assert len(outs) == len(errs) == len(commands) + 2, done.stderr[-3000:]
    rcs = json.loads(outs[-1])
    assert len(rcs) == len(commands)
    return json.loads(outs[0]), [subprocess.CompletedProcess(c, rc, out, err) for c, rc, out, err
                                 in zip(commands, rcs, outs[1:-1], errs[1:-1], strict=True)]


def test_installed_wheel_runs_from_anywhere(installed, tmp_path):
    inst = installed
    version = _run(inst, "--version")
    assert version.returncode == 0 and version.stdout == f"rotviz {rotviz.__version__}\n"

    listing = _run(inst, "zoo", "list")
    assert listing.returncode == 0, listing.stderr
    lines = {line.split()[0]: line for line in listing.stdout.splitlines() if line.strip()}
    assert "not built" not in lines["vit-digits-s3"] and "not built" in lines["vit-digits-s6-ft"]
    assert str(inst["cache"] / "zoo") in listing.stdout

    # a model that does not ship is built on demand into the user cache, never the package
    # (vit-digits-s6-ft: the cheapest, 57 steps from the shipped vit-digits-s6; its card's
    # numbers reproduce to 1e-4 on any CPU, its weights bit for bit only where the zoo was
    # built: tests/test_zoo.py)
    where, (again, out, built, ev) = _several(
        inst, ["zoo", "build", "vit-digits-s3"], [*BARRIER, "--json", "barrier.json"],
        ["zoo", "build", "vit-digits-s6-ft"],
        ["eval", "zoo:vit-digits-s6-ft", "--data", "digits", "--json", "ev.json"])
    assert where["file"] == str(inst["site"] / "rotviz" / "__init__.py"), where
    # the shipped data, named as the zoo's cards name it, resolves inside the installed package
    assert where["data"] == str(inst["site"] / "rotviz/assets/data/pydoc-topics.jsonl")

    # a shipped model is not built again where it would never be read: one line, exit 2
    assert again.returncode == 2 and "ships with rotviz" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1, again.stderr

    # the default pair ships: the barrier is the checkout's, to 1e-6
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads((inst["work"] / "barrier.json").read_text())
    assert main([*BARRIER, "--json", str(tmp_path / "here.json")]) == 0
    want = json.loads((tmp_path / "here.json").read_text())
    assert got["barrier"] == pytest.approx(want["barrier"], abs=1e-6)
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)
    assert got["distance_after"] == pytest.approx(want["distance_after"], abs=1e-6)

    assert built.returncode == 0, built.stderr[-3000:]
    folder = inst["cache"] / "zoo" / "vit-digits-s6-ft"
    assert str(folder) in built.stdout
    card = json.loads((folder / "card.json").read_text())
    for key in ("loss", "acc"):
        assert card["test"][key] == pytest.approx(zoo.read_card("vit-digits-s6-ft")["test"][key],
                                                  abs=1e-4)
    assert ev.returncode == 0, ev.stderr[-3000:]
    scored = json.loads((inst["work"] / "ev.json").read_text())
    assert scored["loss"] == pytest.approx(card["test"]["loss"], abs=1e-6)
    _unchanged(inst)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_installed_wheel_serves_the_app(installed):
    inst = installed
    printed = _run(inst, "serve", "--print-command")
    assert printed.returncode == 0, printed.stderr
    assert str(inst["site"] / "rotviz" / "ui" / "app.py") in printed.stdout
    port = _free_port()
    proc = subprocess.Popen([str(inst["venv"] / "bin" / "python"), "-m", "rotviz", "serve",
                             "--port", str(port), "--address", "127.0.0.1"],
                            cwd=inst["work"], env=inst["env"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline, answer = time.monotonic() + 180, ""
        while time.monotonic() < deadline and proc.poll() is None and answer != "ok":
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health",
                                            timeout=2) as r:
                    answer = r.read().decode().strip()
            except OSError:
                time.sleep(0.5)
        assert answer == "ok", (proc.poll(), proc.stderr.read() if proc.poll() else "")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _unchanged(inst)

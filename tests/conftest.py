"""Shared fixtures: tiny random models of every family, saved once per test session.

Models are 2 layers, d = 32, 4 heads, FFN 64 (see rotviz.random_models). Loaded models are
cached and shared between tests, so tests must never modify them (rotviz never does either;
several tests check exactly that).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rotviz.arch import FAMILIES
from rotviz.random_models import save_random
from rotviz.sources.loading import Loaded, load_model
from rotviz.symmetry.view import ModelView, read_view

# Keep compiled test modules (pytest's assertion rewriting, which runs after this file is
# imported) and later imports' bytecode, even where PYTHONDONTWRITEBYTECODE is set, as on the
# CI machines: otherwise each pytest-xdist worker rewrites every test module again (about
# 11 s of its collection on a 2-core machine).
sys.dont_write_bytecode = False

# The suite never reads or writes the user's cache (rotviz.user_cache: zoo models built on
# demand): each process gets a cache folder of its own, removed when it exits.
_CACHE = tempfile.TemporaryDirectory(prefix="rotviz-test-cache-")
os.environ["ROTVIZ_CACHE"] = _CACHE.name

TINY = dict(layers=2, d=32, heads=4, ffn=64)


def _scan_streamlit_components_once() -> None:
    """Each new streamlit AppTest scans the metadata of every installed package for custom
    components (0.8 s here, finding none) before its first run; the suite makes a new AppTest
    for each page it opens. The installed packages do not change during a test session, so
    the scan runs once per process and its result is reused."""
    import functools

    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:  # another streamlit: each AppTest scans as it does
        return
    scan = manifest_scanner.scan_component_manifests
    if not hasattr(scan, "cache_info"):
        manifest_scanner.scan_component_manifests = functools.cache(scan)


_scan_streamlit_components_once()

# AppTest's run waits for the script thread by checking every millisecond whether the run has
# ended, each check reading every event of the run so far (one per message sent): about
# 40,000 checks and 4.6 million event reads in tests/test_app.py alone, on the CPU the
# script's own thread needs. Checking every WAIT_S instead changes nothing the tests read.
WAIT_S = 0.02


def _require_widgets_deltas(runner, timeout: float = 3) -> None:
    """streamlit.testing.v1.local_script_runner.require_widgets_deltas, checking for the
    run's end every WAIT_S seconds, not every millisecond (same timeout, same error)."""
    import time

    t0 = time.time()
    while time.time() - t0 < timeout:
        if runner.script_stopped():
            return
        time.sleep(WAIT_S)
    runner.request_stop()
    runner.join()
    raise RuntimeError(f"AppTest script run timed out after {timeout}(s)")


def _wait_for_runs_less_often() -> None:
    """Every AppTest run of the session waits with `_require_widgets_deltas`."""
    try:
        from streamlit.testing.v1 import local_script_runner
    except ImportError:  # another streamlit: its runs wait as they do
        return
    if hasattr(local_script_runner, "require_widgets_deltas"):
        local_script_runner.require_widgets_deltas = _require_widgets_deltas


_wait_for_runs_less_often()

# Tiny models gain nothing from intra-op threads, and on a shared 2-core machine OpenMP
# spin-waiting makes each tiny op up to 100x slower when another process holds a core.
torch.set_num_threads(1)


# Families whose description is another's under other names (tests/test_arch.py checks it:
# the same spec but for its name, description and model types, and random models of the same
# tensors and shapes): the symmetry, matching and measurement code cannot tell them apart, so
# the tests that take `family` run the first; loading (every head class, old checkpoints,
# tests/test_compatibility.py, tests/test_families.py) still runs each.
ALIASES = {"mistral": "llama"}
DISTINCT = tuple(f for f in FAMILIES if f not in ALIASES)


@pytest.fixture(params=DISTINCT)
def family(request) -> str:
    """Every test that takes `family` runs once per distinct architecture family (ALIASES)."""
    return request.param


@pytest.fixture(scope="session")
def saved(tmp_path_factory) -> Callable[..., Path]:
    """`saved(family, seed, **sizes)`: the directory of a tiny saved random model (cached)."""
    root = tmp_path_factory.mktemp("models")
    cache: dict[tuple, Path] = {}

    def get(fam: str, seed: int = 0, **sizes) -> Path:
        sizes = {**TINY, **sizes}
        key = (fam, seed, tuple(sorted(sizes.items())))
        if key not in cache:
            name = f"{fam}-s{seed}-" + "-".join(f"{k}{v}" for k, v in sorted(sizes.items()))
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # tests capture stderr; keep it for rotviz
            try:
                cache[key] = save_random(fam, root / name, seed=seed, **sizes)
            finally:
                hf_logging.enable_progress_bar()
        return cache[key]

    return get


@pytest.fixture(scope="session")
def loaded(saved) -> Callable[..., Loaded]:
    """`loaded(family, seed, dtype=None)`: a cached Loaded model (shared: never modify it)."""
    cache: dict[tuple, Loaded] = {}

    def get(fam: str, seed: int = 0, dtype: torch.dtype | None = None) -> Loaded:
        key = (fam, seed, dtype)
        if key not in cache:
            cache[key] = load_model(saved(fam, seed), dtype=dtype)
        return cache[key]

    return get


def view_of(model: Loaded) -> ModelView:
    return read_view(model.spec, model.config, model.state)


def clone_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


def assert_state_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Bit-exact equality of two state dicts: keys, dtypes, shapes and values."""
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    for k in a:
        assert a[k].dtype == b[k].dtype, (k, a[k].dtype, b[k].dtype)
        assert torch.equal(a[k], b[k]), k


def changed_keys(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> set[str]:
    """Keys whose tensors differ in any bit (both dicts must have the same keys)."""
    assert set(a) == set(b)
    return {k for k in a if not torch.equal(a[k], b[k])}


def module_keys(view: ModelView, layers, roles) -> set[str]:
    """State-dict keys of the given block roles (q, k, v, qkv, o, ffn_in, ffn_out)."""
    out = set()
    for i in layers:
        prefix = view.layout.blocks[i]
        for role in roles:
            if role in view.layout.roles:
                name = prefix + view.layout.roles[role]
                out |= {f"{name}.weight", f"{name}.bias"}
    return out


ATTN_ROLES = ("q", "k", "v", "qkv", "o")
FFN_ROLES = ("ffn_in", "ffn_gate", "ffn_out")  # the gate where the FFN is gated (SwiGLU)


# ---- a user's workspace, for commands that must leave it alone --------------------------------

ZOO = Path(__file__).resolve().parents[1] / "rotviz" / "assets" / "zoo"


def snapshot(*roots: Path, contents: bool = True) -> dict[str, tuple]:
    """Every path under the roots with its kind, mode and content: a hash of each small file,
    and the inode, size and nanosecond modification time of files over 64 KB (the zoo's
    weights: a write or a replacement changes one of them, and hashing 26 MB on each of
    two thousand refusals took most of their time). With `contents=False`, every file by
    inode, size and time (the zoo, which rotviz writes only by building it: hashing its 200
    small files twice on each refusal still took 40 of a refusal's 60 ms)."""
    out: dict[str, tuple] = {}
    for root in roots:
        _walk(os.fspath(root), contents, out)
    return out


def _walk(folder: str, contents: bool, out: dict[str, tuple]) -> None:
    """Add every entry under `folder` to `out`, depth first. os.scandir's entries carry their
    lstat, so a refusal's two walks of the zoo cost about a millisecond each (Path objects
    and os.walk took ten)."""
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return
    for e in entries:
        st = e.stat(follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and (st.st_size > 65536 or not contents):
            digest = f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
        elif stat.S_ISREG(st.st_mode):
            with open(e.path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            digest = os.readlink(e.path)
        else:
            digest = ""
        out[e.path] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), digest)
        if stat.S_ISDIR(st.st_mode):
            _walk(e.path, contents, out)


def workspace(root: Path) -> Path:
    """A user's files under `root`/in: a.txt, sub/, f.txt, full/ and link (to sub/)."""
    d = root / "in"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("a user's file")
    (d / "f.txt").write_text("another")
    (d / "full").mkdir()
    (d / "full" / "keep.txt").write_text("keep me")
    (d / "link").symlink_to(d / "sub")
    return d


@pytest.fixture
def ws(tmp_path, monkeypatch):
    """A workspace (the current folder) holding a user's files (`workspace`)."""
    d = workspace(tmp_path)
    monkeypatch.chdir(d)
    return d


def refused(argv: list[str], capfd, ws: Path, *fragments: str) -> str:
    """Run the command: exit 2, one stderr line, no traceback, nothing written or removed."""
    from rotviz.cli import main

    before = snapshot(ws.parent), snapshot(ZOO, contents=False)
    capfd.readouterr()
    rc = main(argv)
    out, err = capfd.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, (out, err)
    assert len(lines) == 1 and lines[0].startswith("rotviz: error: "), err
    assert "Traceback" not in err and out == ""
    for f in fragments:
        assert f in lines[0], lines[0]
    assert (snapshot(ws.parent), snapshot(ZOO, contents=False)) == before
    return lines[0]


# ---- order: the long tests first ------------------------------------------------------------

# Tests (or one case of a test, named with its case) of 10 s or more on a 2-core machine (most
# start subprocesses: Streamlit servers with Chromium, torchrun, a fresh `python -m rotviz`),
# longest first. pytest-xdist hands each
# worker a contiguous share of the collection and lets an idle worker steal from the other's
# queue; a long test left near the end kept one worker busy for minutes after the other had
# finished. Run first, they end while the short tests still balance the two queues.
LONG_FIRST = (
    "test_every_page_then_a_users_classifier_pair_and_csv",  # Chromium: 60-120 s
    "test_installed_wheel_runs_from_anywhere",
    "test_every_command_gives_a_number_or_one_line",
    "test_default_pair_results_are_pinned",
    "test_the_tutorial_runs_and_agrees_with_the_cli",
    "test_streaming_memory_does_not_grow_with_depth",
    "test_torchrun_commands_equal_one_process_and_a_failing_rank_leaves_nothing",
    "test_sigint_leaves_no_output_and_a_rerun_succeeds",
    "test_the_readme_modules_drop_in",
    "test_rebuilding_a_fine_tune_reproduces_its_card",
    "test_top_eigenvalues_and_trace_equal_the_dense_hessian",
    "test_a_signal_leaves_nothing",
    "test_models_page_evaluates_light_models_then_computes_the_barrier_page_ahead",
    "test_landscape_slice_around_b_prime_and_its_gauge_fixed_twin",
    "test_landscape_page_computes_each_section_on_run",
    "test_models_barrier_and_merge_pages_show_the_task_and_f1",
    "test_training_page_runs_both_charts_on_the_zoo_series",
    "test_the_training_page_draws_both_runs_unmatched_and_matched",
    "test_match_equals_match_models[weight]",
    "test_subprocess_error_is_one_line",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FIRST)}  # a test, or one of its cases
    items.sort(key=lambda item: rank.get(item.name, rank.get(
        getattr(item, "originalname", item.name), len(rank))))


@contextlib.contextmanager
def app_roots_with(root: Path):
    """The app's roots (ROTVIZ_APP_ROOTS) are its default root and `root` while inside; the
    variable is put back as it was after."""
    from rotviz.app import roots as app_roots

    old = os.environ.get(app_roots.ENV_ROOTS)
    os.environ[app_roots.ENV_ROOTS] = os.pathsep.join([*map(str, app_roots.default_roots()),
                                                       str(root)])
    try:
        yield root
    finally:
        if old is None:
            os.environ.pop(app_roots.ENV_ROOTS, None)
        else:
            os.environ[app_roots.ENV_ROOTS] = old

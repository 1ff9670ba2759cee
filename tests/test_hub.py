"""Model names from the local Hugging Face cache (rotviz.sources.hf_cache): `ORG/NAME` and
`ORG/NAME@REVISION` resolve to the right snapshot of a cache laid out as huggingface_hub lays
it out (refs, snapshots of links into blobs), with the network blocked; a name that is not
cached is one line; the cache's own links are accepted and no other; the app lists the
cached models when the cache lies under a model root."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import pytest
import torch

from rotviz.errors import RotvizError
from rotviz.sources.shards import copy_sharded
from tests.conftest import refused, snapshot

MAIN, STEP, ODD, PART = "a" * 40, "b" * 40, "c" * 40, "d" * 40


def _blob_folder(src: Path, repo: Path, commit: str) -> Path:
    """`src`'s files as huggingface_hub stores a snapshot: each file a blob named by its hash
    in `repo/blobs/`, and `snapshots/COMMIT/FILE` a relative link to it."""
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in sorted(src.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(Path("..", "..", "blobs", blob.name))
    return snap


@pytest.fixture
def no_network(monkeypatch):
    """Every socket connection and name lookup fails, and is recorded."""
    tried: list = []

    def refuse(*args, **kwargs):
        tried.append(args[1:] or kwargs)
        raise OSError("the network is blocked in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return tried


def _logits(loaded) -> torch.Tensor:
    from rotviz.sources.adapters import call, source_of

    inputs = source_of(loaded.spec).probe_inputs(loaded.spec, loaded.config, loaded.model)
    with torch.no_grad():
        return call(loaded.spec, loaded.model, None, inputs)


def test_cache_names_resolve_offline_to_their_snapshots(saved, loaded, tmp_path, monkeypatch,
                                                        capfd, ws, no_network):
    """`org/tiny` (main), `org/tiny@step1` (a tag; its snapshot sharded) and `@COMMIT` load
    the snapshot's model (logits equal to the folder's); huggingface_hub's own scan reads the
    test's cache as valid. Uncached names and revisions are one line each (exit 2 from the
    CLI); an existing folder of the same path wins over a bare name, `hf-cache:` forces the
    cache; a snapshot file linking out of the cache's blobs is refused. The app lists the
    cached models only when the cache lies under a root. No connection is attempted."""
    from huggingface_hub import scan_cache_dir

    from rotviz.app import roots
    from rotviz.sources import hf_cache as hub
    from rotviz.sources.loading import load_model, resolve_ref

    a, b = saved("gpt2", 0), saved("gpt2", 1)
    cache = tmp_path / "home" / "hub"
    repo = cache / "models--org--tiny"
    _blob_folder(a, repo, MAIN)
    copy_sharded(b, tmp_path / "b-sharded", 3)
    _blob_folder(tmp_path / "b-sharded", repo, STEP)
    odd = _blob_folder(a, repo, ODD)
    part = _blob_folder(a, repo, PART)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "step1").write_text(STEP)
    # the file listings huggingface_hub caches beside a snapshot it downloaded (its own
    # writer): step1 was fetched with --include (no pickled weights, no flax), which is
    # complete for rotviz; PART lacks a tokenizer file its listing names
    from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache

    def listing(commit: str, names: list[str]) -> None:
        write_tree_cache(str(repo), commit, {n: TreeCacheEntry(1, "0" * 40) for n in names})

    listing(STEP, [p.name for p in (repo / "snapshots" / STEP).iterdir()]
            + ["pytorch_model.bin", "flax_model.msgpack", "onnx/model.onnx"])
    listing(PART, [p.name for p in part.iterdir()] + ["tokenizer.json"])
    scan = scan_cache_dir(cache)
    assert not scan.warnings
    assert {(r.commit_hash, r.refs) for r in next(iter(scan.repos)).revisions} == {
        (MAIN, frozenset({"main"})), (STEP, frozenset({"step1"})), (ODD, frozenset()),
        (PART, frozenset())}

    before = snapshot(cache)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(cache.parent))  # HF_HOME/hub
    assert hub.cache_dir() == cache
    assert resolve_ref("org/tiny") == repo.resolve() / "snapshots" / MAIN
    assert resolve_ref("org/tiny@step1") == resolve_ref(f"org/tiny@{STEP}") \
        == repo.resolve() / "snapshots" / STEP
    for name, seed in (("org/tiny", 0), ("org/tiny@step1", 1)):
        m = load_model(name)
        assert m.ref == name and torch.equal(_logits(m), _logits(loaded("gpt2", seed)))

    # not cached: one line saying where rotviz looked and how to fetch it
    with pytest.raises(RotvizError, match=r"holds the revisions main, step1 but not step9.*"
                                          r"`hf download org/tiny --revision step9`"):
        resolve_ref("org/tiny@step9")
    line = refused(["match", "org/absent", "org/tiny", "--out", "o"], capfd, ws,
                   "'org/absent' is not in the local Hugging Face cache",
                   str(cache / "models--org--absent"), "`hf download org/absent`")
    assert "never downloads" in line
    refused(["match", "org/tiny", "org/tiny@step1", "--out", str(repo / "out")], capfd, ws,
            "lies inside the input model", str(repo.resolve()))
    assert snapshot(cache) == before  # resolving and loading wrote nothing into the cache

    # precedence: a folder at the path wins; hf-cache: always means the cache
    (ws / "org" / "tiny").mkdir(parents=True)
    assert resolve_ref("org/tiny") == Path("org/tiny")
    assert resolve_ref("hf-cache:org/tiny") == repo.resolve() / "snapshots" / MAIN

    with pytest.raises(RotvizError, match=r"snapshot of 'org/tiny@d{40}' \(commit d{12}\) "
                                          "is incomplete.*`hf download org/tiny --revision d"):
        resolve_ref(f"org/tiny@{PART}")

    # the cache's own links only: a snapshot file leading out of its blobs is refused
    (odd / "config.json").unlink()
    (odd / "config.json").symlink_to(a / "config.json")
    with pytest.raises(RotvizError, match="which is no blob of the cache"):
        resolve_ref(f"org/tiny@{ODD}")

    # the app: cached models listed by name when the cache is under a root, and not walked
    # as folders; outside the roots, neither listed nor read
    found = roots.discover([tmp_path / "home"])
    assert found == ["hf-cache:org/tiny", "hf-cache:org/tiny@step1"]
    assert roots.resolve_choice("org/tiny@step1", [tmp_path / "home"]) \
        == "hf-cache:org/tiny@step1"
    assert roots.cached_models([tmp_path / "b-sharded"]) == []
    with pytest.raises(RotvizError, match="outside the model roots"):
        roots.resolve_choice("hf-cache:org/tiny", [tmp_path / "b-sharded"])
    assert no_network == []

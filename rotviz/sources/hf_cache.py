"""Model names from the local Hugging Face cache: `ORG/NAME` and `ORG/NAME@REVISION`.

Wherever rotviz takes a model folder it also takes the name of a model that
huggingface_hub has already downloaded: `ORG/NAME` (the revision `main`) or
`ORG/NAME@REVISION`, a branch or tag the cache recorded under `refs/` (Pythia's training
checkpoints are its tags `step1000`, ...) or a full 40-character commit hash. The name
resolves to its snapshot folder in the cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else
`~/.cache/huggingface/hub`), found with huggingface_hub's own cache functions
(`repo_folder_name`, `snapshot_download(local_files_only=True)`, which also refuses a
snapshot lacking a file rotviz reads that its cached file listing names). Nothing is ever
downloaded and no network call is made: a name that is not cached is one line saying where
rotviz looked and how the user fetches it.

Precedence: a folder that exists at the given path wins (as transformers' `from_pretrained`
does), so `org/name` typed in a folder holding `org/name/` reads that folder. `hf-cache:`
before a name (`hf-cache:ORG/NAME@REV`) always means the cache.

The snapshot then goes through the same confined reader and checks as any folder. Its files
are links into the repository's `blobs/` (and on into the cache-wide `blobs/` store): those
links, and no other, are accepted (`rotviz.confine.cache_stores`); a snapshot file leading
anywhere else is refused. The ref files the cache keeps are read through the confined reader
too (bounded, regular files), so in the app a cache is only read when it lies under the
model roots.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from rotviz.confine import ANYWHERE, Confined, cache_stores
from rotviz.errors import RotvizError

PREFIX = "hf-cache:"  # names the cache whatever folders exist
# how help texts name a model reference (CLI arguments, the app's model fields)
MODEL_HELP = "a model directory, zoo:NAME or ORG/NAME[@REVISION] (the local Hugging Face cache)"
MAIN = "main"  # huggingface_hub's default revision
COMMIT = re.compile(r"[0-9a-f]{40}")
# the shape of ORG/NAME[@REVISION]: huggingface_hub's repository id characters, one slash,
# each part starting and ending with a letter, digit or underscore (so ./x and ../x are paths)
_PART = r"\w(?:[\w.-]*\w)?"
_NAME = re.compile(rf"({_PART}/{_PART})(?:@(\S+))?")
_REF_BYTES = 256  # a ref file holds a commit hash
_TREE_BYTES = 64_000_000  # the cached file listing of a commit (read by huggingface_hub)


@dataclass(frozen=True)
class CacheName:
    """A model named in the local Hugging Face cache."""

    repo_id: str  # ORG/NAME
    revision: str | None = None  # a ref name or a commit hash; None: main
    explicit: bool = False  # written with the hf-cache: prefix

    @property
    def text(self) -> str:
        """The name as rotviz writes it back (what the app lists and a report shows)."""
        at = f"@{self.revision}" if self.revision else ""
        return f"{PREFIX if self.explicit else ''}{self.repo_id}{at}"

    def __str__(self) -> str:
        return self.text

    def forced(self) -> CacheName:
        """The same name written `hf-cache:...`, which no folder can shadow (what the app
        hands on once it has resolved a typed name)."""
        return replace(self, explicit=True)

    def fetch_hint(self) -> str:
        """How the user puts it into the cache (huggingface_hub's own command line)."""
        rev = f" --revision {self.revision}" if self.revision else ""
        return f"`hf download {self.repo_id}{rev}`"


def parse(ref: str | os.PathLike) -> CacheName | None:
    """The cache name `ref` spells (`ORG/NAME`, `ORG/NAME@REV`, either after `hf-cache:`),
    by its shape alone; None for anything else. A malformed `hf-cache:` name is refused."""
    text = str(ref)
    explicit = text.startswith(PREFIX)
    body = text[len(PREFIX):] if explicit else text
    m = None if "\0" in body else _NAME.fullmatch(body)
    if m is None or "--" in m.group(1) or ".." in m.group(1):
        if explicit:
            raise RotvizError(f"'{text}' is not hf-cache:ORG/NAME[@REVISION]; give a Hugging "
                              "Face model name such as hf-cache:EleutherAI/pythia-70m@step1000")
        return None
    return CacheName(m.group(1), m.group(2), explicit)


def cache_ref(ref: str | os.PathLike) -> CacheName | None:
    """The cache name a model reference means, or None when it means a folder (or is no
    name): an existing folder at the path wins over a bare `ORG/NAME`."""
    name = parse(ref)
    if name is None or name.explicit:
        return name
    return None if Path(str(ref)).expanduser().is_dir() else name


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The hub cache huggingface_hub reads, from the environment as it is now: HF_HUB_CACHE
    (or the older HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, else
    XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    env = os.environ if env is None else env

    def path(text: str) -> Path:
        return Path(os.path.expandvars(os.path.expanduser(text)))

    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return path(env[key])
    if env.get("HF_HOME"):
        return path(env["HF_HOME"]) / "hub"
    home = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return path(home) / "huggingface" / "hub"


def repo_folder(repo_id: str, cache: Path | None = None) -> Path:
    """The cache's folder of model repository `repo_id` (huggingface_hub's own naming,
    `models--ORG--NAME`); one line for an id huggingface_hub refuses."""
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise RotvizError(f"'{repo_id}' is not a Hugging Face model name ({e}); give "
                          "ORG/NAME") from None
    return (cache_dir() if cache is None else cache) / repo_folder_name(repo_id=repo_id,
                                                                          repo_type="model")


def repository(name: CacheName, confined: Confined = ANYWHERE,
               cache: Path | None = None) -> Path:
    """The cache's folder of `name`'s repository, inside `confined`'s roots; one line when
    the cache holds no such repository."""
    repo = repo_folder(name.repo_id, cache)
    if not repo.is_dir():
        raise _not_cached(name, repo)
    confined.folder(repo, "Hugging Face cache folder")
    return repo


def _not_cached(name: CacheName, where: Path, why: str = "") -> RotvizError:
    """One line: not cached, where rotviz looked (and why not there), how to fetch it."""
    folder = "" if name.explicit else f"no folder at '{name.text}' and "
    return RotvizError(f"{folder}'{name.text}' is not in the local Hugging Face cache "
                       f"(searched {where}{why}); rotviz never downloads: fetch it with "
                       f"{name.fetch_hint()} and run again")


def revisions(repo: Path, confined: Confined = ANYWHERE) -> dict[str, str]:
    """The refs the cache recorded for repository folder `repo` (`main`, tags such as
    `step1000`, `refs/pr/1`), each with the commit it names; every ref file read through
    `confined`, and one that holds no commit hash refused."""
    refs = repo / "refs"
    out: dict[str, str] = {}
    if not refs.is_dir():
        return out
    refs = confined.folder(refs, "Hugging Face cache refs")  # resolved, as entries yields
    todo = [refs]
    while todo:
        folder = todo.pop()
        for p in confined.entries(folder, "Hugging Face cache refs"):
            if p.is_dir():
                if not p.is_symlink():  # the cache writes no linked folders; never loops
                    todo.append(p)
                continue
            out[p.relative_to(refs).as_posix()] = _commit_in(p, confined)
    return dict(sorted(out.items()))


def _commit_in(ref_file: Path, confined: Confined) -> str:
    commit = confined.read_text(ref_file, "Hugging Face cache ref", _REF_BYTES).strip()
    if not COMMIT.fullmatch(commit):
        raise RotvizError(f"cache ref '{ref_file}' holds no commit hash; fetch the revision "
                          "again")
    return commit


def _commit(name: CacheName, repo: Path, confined: Confined) -> str:
    """The commit `name`'s revision names: itself when it is a full commit hash, else the
    hash in the ref file the cache wrote for it (read through `confined`)."""
    rev = name.revision or MAIN
    if COMMIT.fullmatch(rev):
        return rev
    ref_file = repo / "refs" / rev
    if not os.path.lexists(ref_file):
        known = ", ".join(revisions(repo, confined)) or "none"
        raise _not_cached(name, repo, f", which holds the revisions {known} but not {rev}")
    return _commit_in(confined.inside(repo / "refs", rev, "Hugging Face cache ref"), confined)


def locate(ref: str | CacheName, confined: Confined = ANYWHERE,
           cache: Path | None = None) -> Path:
    """The snapshot folder of cache name `ref` in the local Hugging Face cache (`cache`:
    default `cache_dir()`), with no network call; its every file checked to be a regular file
    or one of the cache's own links. One line when it is not cached, is incomplete, or lies
    outside `confined`'s roots."""
    name = ref if isinstance(ref, CacheName) else parse(ref)
    if name is None:
        raise RotvizError(f"'{ref}' is not ORG/NAME[@REVISION]; give a Hugging Face model "
                          "name")
    cache = cache_dir() if cache is None else cache
    repo = repository(name, confined, cache)
    commit = _commit(name, repo, confined)
    tree = repo / "trees" / f"{commit}.json"  # huggingface_hub reads it: checked first
    if os.path.lexists(tree):
        confined.inside(repo, f"trees/{commit}.json", "Hugging Face cache listing")
        if tree.stat().st_size > _TREE_BYTES:
            raise RotvizError(f"cache listing '{tree}' is larger than {_TREE_BYTES} bytes; "
                              f"fetch the revision again with {name.fetch_hint()}")
    from huggingface_hub import errors, snapshot_download

    # huggingface_hub 1.x has no cached file listings, hence no IncompleteSnapshotError
    incomplete = getattr(errors, "IncompleteSnapshotError", ())
    try:
        folder = snapshot_download(name.repo_id, revision=commit, cache_dir=cache,
                                   local_files_only=True,
                                   allow_patterns=_wanted(name, commit, cache, repo))
    except incomplete:
        raise RotvizError(f"the cached snapshot of '{name.text}' (commit {commit[:12]}) is "
                          "incomplete: the file listing huggingface_hub cached with it names "
                          "files rotviz reads that it lacks; fetch it again with "
                          f"{name.fetch_hint()}") from None
    except errors.LocalEntryNotFoundError:
        raise _not_cached(name, repo, f", whose revision {name.revision or MAIN} names "
                          f"snapshot {commit[:12]}, which it does not hold") from None
    snap = Path(folder)
    check_snapshot(snap, name, confined)
    return snap


def _wanted(name: CacheName, commit: str, cache: Path, repo: Path) -> list[str] | None:
    """Which files of the commit's cached file listing the snapshot must hold, as patterns
    for `snapshot_download`'s completeness check (None: no listing is cached, nothing to
    check): what rotviz reads, at the snapshot's top: config.json, the tokenizer and
    processor files, and the weights in the format the snapshot holds (safetensors when it
    holds any, else the pickled checkpoint). A snapshot fetched with `--include` (only the
    safetensors and JSON files, say) lacks the rest of the listing and is complete for
    rotviz."""
    import glob

    from huggingface_hub import errors

    from rotviz.data.tokens import PROCESSOR_FILES, TOKENIZER_FILES

    try:
        from huggingface_hub import get_cached_repo_tree

        listing = [f.path for f in get_cached_repo_tree(name.repo_id, revision=commit,
                                                        cache_dir=cache)]
    except (ImportError, getattr(errors, "CachedRepoTreeNotFoundError", ImportError)):
        return None
    top = [f for f in listing if "/" not in f]
    safe = [f for f in top if f.endswith(".safetensors") or f == "model.safetensors.index.json"]
    pickled = [f for f in top if f.startswith("pytorch_model")
               and f.endswith((".bin", ".bin.index.json"))]
    snap = repo / "snapshots" / commit

    def held(files: list[str]) -> bool:
        return any(os.path.lexists(snap / f) for f in files)

    weights = safe if held(safe) or (safe and not held(pickled)) else pickled
    reading = {"config.json", *TOKENIZER_FILES, *PROCESSOR_FILES}
    return [glob.escape(f) for f in top if f in reading] + [glob.escape(f) for f in weights]


def check_snapshot(snap: Path, name: CacheName | str, confined: Confined = ANYWHERE) -> None:
    """Every entry of snapshot folder `snap` is a folder, a regular file (a cache on a file
    system without links holds copies) or a link to a regular file in the cache's blobs
    (`cache_stores`), and readable through `confined`; one line naming the first that is not.
    """
    confined.check_tree(snap, "cached model folder")
    stores = cache_stores(snap)
    for dirpath, dirnames, filenames in os.walk(snap, followlinks=False):
        for entry in [*dirnames, *filenames]:
            p = Path(dirpath) / entry
            if not p.is_symlink():
                continue  # a folder os.walk goes into, or a file check_tree accepted
            real = p.resolve()
            if not real.is_file() or not any(real.is_relative_to(s) for s in stores):
                raise RotvizError(f"'{p}' in the cached snapshot of '{name}' leads to "
                                  f"'{real}', which is no blob of the cache; the cache is not "
                                  "as huggingface_hub writes it: fetch the model again")


def cached_names(confined: Confined = ANYWHERE, cache: Path | None = None,
                 check: Callable[[Path], None] | None = None) -> list[str]:
    """Every model in the cache as rotviz names it, each checked as `locate` checks it (and
    by `check`, given the snapshot folder): `ORG/NAME` for the revision main, `ORG/NAME@REF`
    for every other ref, and `ORG/NAME@COMMIT` for a snapshot no ref names. Repositories
    whose reading would be refused, and snapshots without a config.json, are left out: a
    listing offers only what a read accepts."""
    cache = cache_dir() if cache is None else cache
    if not cache.is_dir():
        return []
    out: list[str] = []
    for repo in confined.entries(cache, "Hugging Face cache"):
        parts = repo.name.split("--")
        if len(parts) != 3 or parts[0] != "models" or not repo.is_dir():
            continue
        repo_id = f"{parts[1]}/{parts[2]}"
        try:
            refs = revisions(repo, confined)
            snaps = [p.name for p in confined.entries(repo / "snapshots")
                     if COMMIT.fullmatch(p.name)] if (repo / "snapshots").is_dir() else []
        except RotvizError:
            continue
        named = set(refs.values())
        found = [CacheName(repo_id, None if r == MAIN else r) for r in refs]
        found += [CacheName(repo_id, c) for c in snaps if c not in named]
        for name in found:
            try:
                snap = locate(name, confined, cache)
                if (snap / "config.json").is_file():
                    if check is not None:
                        check(snap)
                    out.append(name.text)
            except RotvizError:
                continue
    return out

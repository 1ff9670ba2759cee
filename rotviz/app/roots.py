"""Where the app's models and data may come from: the model roots, what is found under
them, and the checks on what is typed.

Nothing here imports streamlit or torch (the app's first paint reads it), so the tests and
the command line can use it too. The app only offers models from the zoo and from folders
under the configured model roots (`ROTVIZ_MODEL_ROOTS`, a `os.pathsep`-separated list;
default the zoo's folders: `default_roots`): a path typed into a browser must never reach an
arbitrary folder of the server. Everything the app reads goes through `app_confined()`
(rotviz.confine): files that resolve inside the roots (and the zoo's and the shipped data's
own folders), regular files only. What the sidebar offers (`discover`, `discover_data`) is
checked exactly as what is typed (`resolve_choice`, `resolve_data`): a folder or data whose
reading would be refused is not listed. The local Hugging Face cache
(rotviz.sources.hf_cache) is read only when it lies under a root; its models are then
offered by name, `hf-cache:ORG/NAME[@REVISION]`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rotviz.confine import Confined
from rotviz.data.files import SHIPPED_DATA, check_data
from rotviz.errors import RotvizError
from rotviz.sources import hf_cache as hub

ENV_ROOTS = "ROTVIZ_MODEL_ROOTS"
# SHIPPED_DATA (rotviz.data.files): the data the zoo's cards name (read as "auto" data).
# Relative paths (typed, or in ROTVIZ_MODEL_ROOTS) are taken from the folder the app was
# started in: the checkout for the README's launch command, the user's for `rotviz serve`.
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


# ---- where models may come from -----------------------------------------------------------


def default_roots() -> list[Path]:
    """The model roots when none are configured: the zoo's folders (the package's shipped
    models, then the user cache's: rotviz.zoo_registry.zoo_dirs)."""
    dirs = getattr(_zoo(), "zoo_dirs", None)
    return [Path(d) for d in dirs()] if dirs is not None else []


def model_roots(env: Mapping[str, str] | None = None) -> list[Path]:
    """The folders the app may load models from, resolved (symlinks followed)."""
    env = os.environ if env is None else env
    raw = env.get(ENV_ROOTS, "")
    parts = [p for p in raw.split(os.pathsep) if p.strip()] or [str(p) for p in default_roots()]
    out: list[Path] = []
    for p in parts:
        path = Path(p.strip()).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        out.append(path.resolve())
    return out


def app_confined(roots: Sequence[Path] | None = None) -> Confined:
    """What the app reads through: the model roots (default `model_roots()`), the zoo's
    folder (zoo models are offered whatever the roots) and the shipped data (the zoo's
    cards name it), nothing else; regular files only."""
    allowed = list(roots if roots is not None else model_roots())
    allowed += default_roots()
    allowed.append(SHIPPED_DATA)
    return Confined.under(allowed, "model roots")


def _zoo():
    try:
        from rotviz import zoo_registry as zoo
    except ImportError:
        return None
    return zoo


def _entry_name(entry: Any) -> str:
    """The name of a zoo entry (a string, a mapping with 'name', or an object with .name)."""
    if isinstance(entry, str):
        return entry[4:] if entry.startswith("zoo:") else entry
    if isinstance(entry, Mapping):
        return str(entry["name"])
    return str(entry.name)


def _as_ref(item: Any) -> str:
    """A model reference from what the zoo hands out: a Loaded, a path, `zoo:NAME`, a bare
    zoo name, a mapping or an entry object."""
    if hasattr(item, "ref") and hasattr(item, "state"):  # a Loaded model
        return str(item.ref)
    if isinstance(item, os.PathLike):
        return str(item)
    if isinstance(item, str):
        if item.startswith("zoo:") or os.sep in item or Path(item).is_dir():
            return item
        return f"zoo:{item}"
    return f"zoo:{_entry_name(item)}"


def zoo_refs() -> list[str]:
    """`zoo:NAME` for every zoo entry whose files are present."""
    zoo = _zoo()
    if zoo is None or not hasattr(zoo, "entries"):
        return []
    refs = []
    for entry in zoo.entries():
        name = _entry_name(entry)
        try:
            if Path(zoo.path_of(name)).is_dir():
                refs.append(f"zoo:{name}")
        except RotvizError:
            continue
    return refs


def _built(ref: str) -> bool:
    """Whether a model reference can be loaded now (zoo model built, or folder present)."""
    if ref.startswith("zoo:"):
        check = getattr(_zoo(), "is_built", None)
        try:
            return True if check is None else bool(check(ref[4:]))
        except RotvizError:
            return False
    return Path(ref).is_dir()


def default_pair(roots: Sequence[Path] | None = None) -> tuple[str, str]:
    """The pair the app opens on: the zoo's default, else another built zoo pair, else the
    first two models found under the roots."""
    zoo = _zoo()
    if zoo is not None and hasattr(zoo, "default_pair"):
        try:
            a, b = (_as_ref(x) for x in tuple(zoo.default_pair())[:2])
            if _built(a) and _built(b):
                return a, b
        except (RotvizError, OSError, LookupError):  # zoo files missing: look further
            pass
    for pair in zoo_pairs().values():
        return pair
    found = zoo_refs() + discover(roots if roots is not None else model_roots())
    if len(found) < 2:
        raise RotvizError(
            "no model pair found: put two save_pretrained folders under ROTVIZ_MODEL_ROOTS "
            f"(now {os.pathsep.join(map(str, roots or model_roots()))})"
        )
    return found[0], found[1]


def zoo_pairs() -> dict[str, tuple[str, str]]:
    """The zoo's named pairs whose two models are built, e.g. {"default": (zoo:a, zoo:b)}."""
    zoo = _zoo()
    built = set(zoo_refs())
    out: dict[str, tuple[str, str]] = {}
    for name, (a, b) in (getattr(zoo, "PAIRS", None) or {}).items():
        refs = (f"zoo:{_entry_name(a)}", f"zoo:{_entry_name(b)}")
        if all(r in built for r in refs):
            out[str(name)] = refs
    return out


def card_of(ref: str) -> dict | None:
    """The zoo card (recipe, seed, data, metrics) of a model, if it has one."""
    zoo = _zoo()
    if zoo is None or not hasattr(zoo, "read_card"):
        return None
    try:
        return zoo.read_card(ref[4:] if ref.startswith("zoo:") else ref)
    except (RotvizError, OSError, ValueError):
        return None


def recorded_card(ref: str, data: str, seed: int, n_eval: int) -> dict | None:
    """The test loss and accuracy the zoo card of `ref` recorded when the model was built,
    when they are what the Models page computes for (data, seed, n_eval): the card's data,
    its whole test split drawn with the same seed (n_eval 0, or the split's size), data that
    is the same on every machine (not a corpus read from this machine's Python, whose card
    records its fingerprint). None otherwise. The page shows them while torch loads and the
    model is evaluated again; tests/test_zoo.py checks that every shipped model still gives
    its card's numbers."""
    card = card_of(ref) or {}
    d, test = card.get("data"), card.get("test")
    if not isinstance(d, Mapping) or not isinstance(test, Mapping):
        return None
    n = test.get("n")
    if (d.get("ref") != data or d.get("split_seed") != seed or d.get("subset", "all") != "all"
            or d.get("corpus") is not None or not isinstance(n, int) or n_eval not in (0, n)):
        return None
    try:
        return {"ref": ref, "loss": float(test["loss"]), "acc": float(test["acc"]), "n": n,
                "built": str(card.get("built", ""))}
    except (KeyError, TypeError, ValueError):
        return None


def data_of(ref: str, default: str = "digits") -> str:
    """The data a model was trained on, from its card; `default` without one."""
    card = card_of(ref) or {}
    data = card.get("data")
    if isinstance(data, Mapping) and data.get("ref"):
        return str(data["ref"])
    recipe = card.get("recipe")
    if isinstance(recipe, Mapping) and recipe.get("data"):
        return str(recipe["data"])
    return default


def auto_data(ref: str) -> tuple[str, str]:
    """What the sidebar's "auto" data means for model `ref`, and why in a few words: its
    card's data (a zoo model), else the built-in data of its inputs, read off its
    config.json through the app's roots: digits for an image model, pystdlib (read by
    the model's own tokenizer, or as characters) for a text model. A user's MultiBERTs
    folder then opens on text, not on images it cannot read; a model whose config cannot
    be read gets digits, and its page says what is wrong with it."""
    if card_of(ref):
        return data_of(ref), "from the model card"
    from rotviz.arch import spec_for

    try:
        confined = app_confined()
        name = cache_name(ref)  # a model of the Hugging Face cache: its snapshot's folder
        folder = hub.locate(name, confined) if name is not None else Path(ref)
        config = confined.read_json(Path(folder) / "config.json", "re-save the model",
                                    "model config")
        pixels = spec_for(config).inputs == "pixels"
    except (RotvizError, OSError, ValueError, TypeError, AttributeError):
        return "digits", "the default"
    return ("digits", "for an image model") if pixels else ("pystdlib", "for a text model")


def discover(roots: Iterable[Path], max_depth: int = 3) -> list[str]:
    """Model folders (holding config.json) under the roots, as paths, then the models of the
    local Hugging Face cache when it lies under a root (`cached_models`); zoo folders
    excluded. Only what `resolve_choice` accepts is listed (`check_model_folder`)."""
    roots = [Path(r) for r in roots]
    confined = Confined.under(roots, "model roots")
    cache = _resolved(hub.cache_dir())
    found: list[str] = []
    for root in roots:
        if not root.is_dir():
            continue
        base = len(root.parts)
        for dirpath, dirnames, filenames in os.walk(root):
            if _resolved(Path(dirpath)) == cache:  # listed by name below, not as folders
                dirnames[:] = []
                continue
            depth = len(Path(dirpath).parts) - base
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            if depth >= max_depth:
                dirnames[:] = []
            if "config.json" in filenames and any(
                f.endswith(".safetensors") or f.endswith(".bin") for f in filenames
            ):
                dirnames[:] = []
                try:
                    check_model_folder(Path(dirpath), confined)
                except RotvizError:
                    continue  # offered only what a load would accept
                found.append(str(Path(dirpath)))
    return sorted(set(found)) + cached_models(roots)


def _resolved(p: Path) -> Path | None:
    try:
        return p.expanduser().resolve()
    except (OSError, RuntimeError):
        return None


def cached_models(roots: Sequence[Path]) -> list[str]:
    """The models of the local Hugging Face cache (rotviz.sources.hf_cache: HF_HUB_CACHE, else
    HF_HOME/hub), as `hf-cache:ORG/NAME[@REVISION]`, when the cache lies under one of the
    roots; none otherwise (the app reads nothing outside them). Each is checked as a typed
    name is (`resolve_choice`)."""
    cache = _resolved(hub.cache_dir())
    if cache is None or not cache.is_dir() or not _under(cache, roots):
        return []
    confined = Confined.under(roots, "model roots")
    names = hub.cached_names(confined, cache, lambda snap: check_model_folder(snap, confined))
    return [n.forced().text for n in map(hub.parse, names) if n is not None]


# File endings the app offers as data, by data kind (rotviz.data.split, rotviz.data.labelled).
DATA_FILES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".conll": "conll", ".txt": "text"}
BUILTIN_DATA = ("digits", "pystdlib")
IMAGE_ENDINGS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


def discover_data(roots: Iterable[Path], max_depth: int = 3) -> list[str]:
    """The user's data under the roots, as data references: text and labelled files
    (csv:, tsv:, jsonl:, conll:, text:), datasets folders and parquet folders (hf:), and
    image folders with one subfolder per class (imagefolder:). Model folders are skipped,
    and so is data whose reading would be refused (`resolve_data`: a file or folder that
    links out of the roots, a FIFO): offered data is checked exactly like typed data."""
    roots = [Path(r) for r in roots]
    confined = Confined.under(roots)
    found: list[str] = []

    def offer(ref: str) -> None:
        try:
            check_data(ref, confined)
        except RotvizError:
            return
        found.append(ref)

    for root in roots:
        if not root.is_dir():
            continue
        base = len(root.parts)
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            depth = len(here.parts) - base
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            if "config.json" in filenames:  # a model folder (its README is not data)
                dirnames[:] = []
                continue
            if {"dataset_dict.json", "state.json"} & set(filenames) or any(
                    f.endswith(".parquet") for f in filenames):
                offer(f"hf:{here}")
                dirnames[:] = []
                continue
            classes = [here / d for d in dirnames]
            # a class folder that links out is not even looked into (refused below)
            if (len(classes) >= 2 and all(_inside(confined, c) for c in classes)
                    and all(any(f.suffix.lower() in IMAGE_ENDINGS for f in c.iterdir()
                                if f.is_file()) for c in classes)):
                offer(f"imagefolder:{here}")
                dirnames[:] = []
                continue
            for f in sorted(filenames):
                kind = DATA_FILES.get(Path(f).suffix.lower())
                if kind and not f.startswith("."):
                    offer(f"{kind}:{here / f}")
            if depth >= max_depth:
                dirnames[:] = []
    return sorted(set(found))


def _inside(confined: Confined, p: Path) -> bool:
    """Whether `p` resolves inside the roots (a loop of links does not)."""
    try:
        return confined.allows(p.resolve())
    except (OSError, RuntimeError):
        return False


def resolve_data(ref: str, roots: Sequence[Path] | None = None) -> str:
    """A data reference the app may read: a built-in one, or a file or folder under the
    roots whose every file a read would open lies under them too and is a regular file
    (rotviz.data.files.check_data; the app reads nothing outside them)."""
    ref = (ref or "").strip()
    kind, _, path = ref.partition(":")
    if ref in BUILTIN_DATA:
        return ref
    known = (*DATA_FILES.values(), "hf", "imagefolder", "cifar10")
    if kind not in known or not path:
        raise RotvizError(f"unknown data '{ref}': use {', '.join(BUILTIN_DATA)} or KIND:PATH "
                          f"with KIND one of {', '.join(known)}")
    roots = list(roots if roots is not None else model_roots())
    p = _typed_path(path)
    if not _under(p, roots):
        raise RotvizError(f"'{path}' is outside the roots ({', '.join(map(str, roots))}); "
                          f"move the data there or add its folder to {ENV_ROOTS}")
    if not p.exists():
        raise RotvizError(f"no file or folder at '{path}'")
    check_data(f"{kind}:{p}", Confined.under(roots))
    return f"{kind}:{p}"


def _typed_path(path: str | os.PathLike) -> Path:
    """A path typed into the app (or its URL), resolved against the folder the app was started
    in: one line for one that cannot be (a NUL character, a loop of links)."""
    text = str(path)
    if "\0" in text:
        raise RotvizError(f"'{text[:80]}' holds a NUL character; give a plain path")
    p = Path(text).expanduser()
    try:
        return (p if p.is_absolute() else Path.cwd() / p).resolve()
    except (OSError, RuntimeError, ValueError) as e:
        raise RotvizError(f"'{text}' cannot be resolved ({e}); fix or remove the link"
                          ) from None


def check_under_roots(path: str | os.PathLike, roots: Sequence[Path]) -> Path:
    """The resolved folder, if it lies inside one of the roots; a clear error otherwise."""
    p = _typed_path(path)
    if not _under(p, roots):
        raise RotvizError(
            f"'{path}' is outside the model roots ({', '.join(map(str, roots))}); "
            f"move the model there or add its folder to {ENV_ROOTS}"
        )
    if not p.is_dir():
        raise RotvizError(
            f"no model folder at '{path}': give a save_pretrained folder under the model roots"
        )
    check_model_folder(p, Confined.under(roots, "model roots"))
    return p


def check_model_folder(folder: Path, confined: Confined) -> None:
    """Refuse, in one line, a model folder whose loading could read a file `confined`
    refuses: any entry under it (a shard in a subfolder too) that links out of the roots or
    is no regular file, and an index whose entries are not plain names inside the folder
    (`../../elsewhere`, absolute paths, links out). Transformers opens whatever the index
    names, so the names are checked before it is handed the folder."""
    confined.check_tree(folder, "model folder")
    for name in INDEX_FILES:
        index_file = folder / name
        if not os.path.lexists(index_file):
            continue
        index = confined.read_json(index_file, "re-save the model", "model index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise RotvizError(f"'{index_file}' has no weight_map of tensor names to files; "
                              "re-save the model")
        seen: set[str] = set()
        for shard in weight_map.values():
            if isinstance(shard, str) and shard in seen:
                continue
            confined.inside(folder, shard, "shard")  # a non-name is refused too
            seen.add(shard)


def _under(p: Path, roots: Sequence[Path]) -> bool:
    return any(p == r or p.is_relative_to(r) for r in roots)


def cache_name(choice: str) -> hub.CacheName | None:
    """The Hugging Face cache name a typed choice means, or None: a folder at the typed path
    (resolved against the checkout, as the app resolves paths) wins over a bare
    `ORG/NAME`; `hf-cache:ORG/NAME` always means the cache."""
    name = hub.parse(choice)
    if name is None or name.explicit:
        return name
    try:
        return None if _typed_path(choice).is_dir() else name
    except RotvizError:
        return name


def resolve_choice(choice: str, roots: Sequence[Path] | None = None) -> str:
    """A model reference the app may load: `zoo:NAME` from the zoo, a folder under the
    roots, or a model of the local Hugging Face cache (`ORG/NAME[@REVISION]`, when the
    cache lies under the roots), returned as `hf-cache:ORG/NAME[@REVISION]` so that every
    later read means the cache."""
    choice = (choice or "").strip()
    if not choice:
        raise RotvizError("no model chosen: pick a zoo entry or a folder under the model roots")
    if choice.startswith("zoo:"):
        if choice not in zoo_refs():
            known = ", ".join(zoo_refs()) or "none"
            raise RotvizError(f"'{choice}' is not in the zoo; pick one of {known}")
        return choice
    roots = roots if roots is not None else model_roots()
    name = cache_name(choice)
    if name is not None:
        confined = Confined.under(roots, "model roots")
        check_model_folder(hub.locate(name, confined), confined)
        return name.forced().text
    return str(check_under_roots(choice, roots))


def model_label(ref: str) -> str:
    """A unique, readable label for a model choice (also its value in the app's URL):
    `zoo:NAME`, or the folder relative to the folder the app was started in when inside it,
    else its full path."""
    if ref.startswith(("zoo:", hub.PREFIX)):
        return ref
    p = Path(ref)
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def short_name(ref: str) -> str:
    """A label for a model reference: the zoo name, or the folder name."""
    return ref[4:] if ref.startswith("zoo:") else Path(ref).name

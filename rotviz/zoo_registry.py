"""The zoo's registry (a leaf: it imports nothing of rotviz but its errors and its file
reader): the shipped models and pairs, where they live, and their cards. It sits in the models
layer, apart from the zoo package, because `rotviz.sources.loading` resolves `zoo:NAME` with it and
the app lists the zoo with it, neither needing what builds the models. Building them is
`rotviz.zoo.build`.

The model zoo: small trained models, each rebuildable from its recipe. Every entry is a model
directory (config.json + model.safetensors, Hugging Face format) with a card (`card.json`)
recording its recipe, seed, data split, test metrics, training time and library versions.
`zoo:NAME` works wherever rotviz takes a model.

Where they live (`zoo_dirs`): the package's own `rotviz/assets/zoo/` (a wheel ships the default
pair there; a source checkout holds every model), then the per-user cache's `zoo/` folder
(rotviz.user_cache), where `rotviz zoo build NAME` writes the others on demand: never into the
installed package, which may be read-only. `ROTVIZ_ZOO` replaces both with one folder, read
and written.

Pairs:
- default (`vit-digits-s3`, `vit-digits-s6`): independent seeds, the generalized-LMC setting;
- seeds (`vit-digits-s7`, `vit-digits-s8`): two more seeds of the default recipe; with the
  default pair, four independent seeds (`SEEDS`) for aligning many models at once
  (rotviz.measures.many);
- finetuned (`vit-digits-ft-a`, `vit-digits-ft-b`): two fine-tunes of `vit-digits-base` on
  different halves of the training split with different hyperparameters, the seed paper's setting;
- lineage (`vit-digits-s3-ft`, `vit-digits-s6-ft`): the default pair's two seeds as pretrained
  bases, each fine-tuned briefly on one half of the training split: two lineages that
  symmetry separates (move one with its base's matching element: `rotviz match --also`);
- depths (`vit-digits-s3`, `vit-digits-deep`): different depths (4 and 6 blocks, one width):
  the deeper one is `vit-digits-s6` grown by two identity blocks and trained on; `rotviz merge`
  pairs their blocks and brings them to one depth (docs/merging.md, "depths");
- gpt2 (`gpt2-pystdlib-s0`, `gpt2-pystdlib-s1`): independent seeds of a character LM;
- nlp-mlm (`roberta-pydocs-s0`, `roberta-pydocs-s1`): RoBERTa masked LMs pretrained on the
  standard library's docstrings from two seeds (like the seed paper's MultiBERTs);
- nlp-cls (`roberta-topics-a`, `roberta-topics-b`) and nlp-tok (`roberta-pytokens-a`,
  `roberta-pytokens-b`): the seed paper's Table 1 setting, one text-classification and one
  token-classification task, each fine-tuned from the two differently seeded encoders on the
  two halves of its training split.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rotviz.confine import ANYWHERE
from rotviz.errors import RotvizError
from rotviz.user_cache import cache_dir

ENV_ZOO = "ROTVIZ_ZOO"
# The models that ship inside the package (all of them in a source checkout; the default pair in
# a wheel: pyproject.toml's package data).
SHIPPED = Path(__file__).resolve().parent / "assets" / "zoo"


@dataclass(frozen=True)
class Entry:
    name: str
    recipe: str
    seed: int
    pair: str  # which shipped pair it belongs to ("base" for the fine-tunes' start)
    description: str

    @property
    def ref(self) -> str:
        return f"zoo:{self.name}"


ENTRIES: tuple[Entry, ...] = (
    Entry("vit-digits-s3", "vit-digits", 3, "default", "ViT on digits, seed 3"),
    Entry("vit-digits-s6", "vit-digits", 6, "default", "ViT on digits, seed 6"),
    Entry("vit-digits-s7", "vit-digits", 7, "seeds", "ViT on digits, seed 7"),
    Entry("vit-digits-s8", "vit-digits", 8, "seeds", "ViT on digits, seed 8"),
    Entry("vit-digits-base", "vit-digits-base", 2, "base", "shared base of the fine-tuned pair"),
    Entry("vit-digits-ft-a", "vit-digits-ft-even", 3, "finetuned",
          "vit-digits-base fine-tuned on the even half, lr 5e-4, batch 32"),
    Entry("vit-digits-ft-b", "vit-digits-ft-odd", 4, "finetuned",
          "vit-digits-base fine-tuned on the odd half, lr 1e-3, weight decay 0.1"),
    Entry("vit-digits-s3-ft", "vit-digits-lineage-even", 7, "lineage",
          "vit-digits-s3 fine-tuned on the even half, 3 epochs, lr 1e-3"),
    Entry("vit-digits-s6-ft", "vit-digits-lineage-odd", 8, "lineage",
          "vit-digits-s6 fine-tuned on the odd half, 3 epochs, lr 1e-3"),
    Entry("vit-digits-deep", "vit-digits-deep", 9, "depths",
          "vit-digits-s6 grown to 6 blocks and trained on: the depths pair's deeper model"),
    Entry("gpt2-pystdlib-s0", "gpt2-pystdlib", 0, "gpt2", "GPT-2 character LM, seed 0"),
    Entry("gpt2-pystdlib-s1", "gpt2-pystdlib", 1, "gpt2", "GPT-2 character LM, seed 1"),
    Entry("roberta-pydocs-s0", "roberta-pydocs", 0, "nlp-mlm",
          "RoBERTa masked LM on stdlib docstrings, seed 0"),
    Entry("roberta-pydocs-s1", "roberta-pydocs", 1, "nlp-mlm",
          "RoBERTa masked LM on stdlib docstrings, seed 1"),
    Entry("roberta-topics-a", "roberta-topics-even", 10, "nlp-cls",
          "roberta-pydocs-s0 fine-tuned to tell a docstring sentence's package, even half"),
    Entry("roberta-topics-b", "roberta-topics-odd", 11, "nlp-cls",
          "roberta-pydocs-s1 fine-tuned to tell a docstring sentence's package, odd half"),
    Entry("roberta-pytokens-a", "roberta-pytokens-even", 20, "nlp-tok",
          "roberta-pydocs-s0 fine-tuned to tag code tokens (tokenize's types), even half"),
    Entry("roberta-pytokens-b", "roberta-pytokens-odd", 21, "nlp-tok",
          "roberta-pydocs-s1 fine-tuned to tag code tokens (tokenize's types), odd half"),
)
_BY_NAME = {e.name: e for e in ENTRIES}
PAIRS = {
    "default": ("vit-digits-s3", "vit-digits-s6"),
    "seeds": ("vit-digits-s7", "vit-digits-s8"),
    "finetuned": ("vit-digits-ft-a", "vit-digits-ft-b"),
    "lineage": ("vit-digits-s3-ft", "vit-digits-s6-ft"),
    # models of different depths: the default pair's first seed (4 blocks) and a 6-block
    # ViT grown from the second seed (rotviz merge brings them to one depth)
    "depths": ("vit-digits-s3", "vit-digits-deep"),
    "gpt2": ("gpt2-pystdlib-s0", "gpt2-pystdlib-s1"),
    "nlp-mlm": ("roberta-pydocs-s0", "roberta-pydocs-s1"),
    "nlp-cls": ("roberta-topics-a", "roberta-topics-b"),
    "nlp-tok": ("roberta-pytokens-a", "roberta-pytokens-b"),
}
# Four independent seeds of one recipe: the default pair and the `seeds` pair.
SEEDS: tuple[str, ...] = (*PAIRS["default"], *PAIRS["seeds"])




# ---- the spawn series (Frankle et al., 2020): a parent run and children spawned from it --------


@dataclass(frozen=True)
class SpawnEntry:
    """A spawn folder of the zoo (rotviz.zoo.spawn builds it, rotviz.measures.training reads
    it): a parent run of `recipe` initialised from `seed` in data order `parent_order`;
    at each step of `spawn_steps` (the last is the run's end) two children trained to the
    end in the data orders `orders`; the two children spawned at 0 kept at `series_steps`."""

    name: str
    recipe: str
    seed: int
    parent_order: int
    orders: tuple[int, int]
    spawn_steps: tuple[int, ...]
    series_steps: tuple[int, ...]
    description: str


SPAWNS: tuple[SpawnEntry, ...] = (
    SpawnEntry("vit-digits-spawn", "vit-digits-spawn", 3, 0, (1, 2), (0, 16, 64, 304),
               (0, 16, 64, 160, 304),
               "ViT on digits (vit-digits-s3's architecture), 304 steps; children spawned at "
               "steps 0, 16, 64 and 304, each trained to the end in two data orders"),
)


@dataclass(frozen=True)
class RunEntry:
    """A short series of the zoo on its own (rotviz.zoo.series builds it): one run of `recipe`
    from `seed` in data order `order` (or, with `start`, from that checkpoint of another
    series of the zoo, `(series, step)`, with the recipe's optimiser fresh), its checkpoints
    kept at `steps` counted from its own start (the last is where it stops), written as
    `NAME/checkpoint-<step>/` with the series' card."""

    name: str
    recipe: str
    seed: int
    order: int
    steps: tuple[int, ...]
    description: str
    start: tuple[str, int] | None = None


RUNS: tuple[RunEntry, ...] = (
    # from run a's step 64 (AdamW has left the plateau at chance there; plain SGD from the
    # initialisation stays on it for hundreds of steps at any stable rate, so it would show
    # conservation only because nothing moves)
    RunEntry("vit-digits-sgd", "vit-digits-sgd", 3, 1, (0, 25, 50, 100, 200),
             "vit-digits-run-a's checkpoint at step 64 trained on for 200 steps by plain SGD "
             "without weight decay: the model learns, the conserved quantities stay put",
             start=("vit-digits-run-a", 64)),
)
# Series of checkpoints (Hugging Face Trainer's checkpoint-<step>/ layout) in the zoo: name ->
# (spawn folder or run, the folder inside it).
SERIES: dict[str, tuple[str, str]] = {
    "vit-digits-run-a": ("vit-digits-spawn", "run-a"),
    "vit-digits-run-b": ("vit-digits-spawn", "run-b"),
    **{e.name: (e.name, "") for e in RUNS},
}


def run_entry(name: str) -> RunEntry:
    for e in RUNS:
        if e.name == name:
            return e
    raise RotvizError(f"unknown zoo series '{name}': known are {', '.join(e.name for e in RUNS)}")


def spawn_entry(name: str) -> SpawnEntry:
    for e in SPAWNS:
        if e.name == name:
            return e
    raise RotvizError(f"unknown zoo spawn folder '{name}': known are "
                      f"{', '.join(e.name for e in SPAWNS)}")


def collection_path(name: str) -> Path:
    """The folder of a zoo spawn folder or series (`zoo:NAME`), built."""
    top, inner = SERIES[name] if name in SERIES else (spawn_entry(name).name, "")
    folder = _found(top, "card.json")
    if folder is None:
        raise RotvizError(f"zoo series '{name}' is not built (no {top} in {_searched()}); run: "
                          f"rotviz zoo build {top}")
    return folder / inner if inner else folder


def zoo_dirs() -> list[Path]:
    """The folders a zoo model is looked for in, in order: `ROTVIZ_ZOO` alone when set, else
    the package's shipped models, then the user cache's (where `build_dir` writes)."""
    env = os.environ.get(ENV_ZOO, "").strip()
    if env:
        return [Path(env).expanduser().absolute()]
    return [SHIPPED, cache_dir() / "zoo"]


def build_dir() -> Path:
    """Where `rotviz zoo build` writes a model when given no `--out`: `ROTVIZ_ZOO` when set,
    else the user cache's `zoo/` folder (never the installed package)."""
    return zoo_dirs()[-1]


def shipped(name: str) -> bool:
    """Whether model or series `name` ships with the package (read before the user cache, so a
    build of it there would never be read)."""
    return not os.environ.get(ENV_ZOO, "").strip() and (SHIPPED / name / "card.json").is_file()


def refuse_shipped(name: str) -> None:
    """Refuse to build `name` into the build folder when it ships with the package: the build
    would never be read (the shipped folder comes first)."""
    if shipped(name):
        raise RotvizError(f"zoo model '{name}' ships with rotviz (at {SHIPPED / name}): build "
                          f"it elsewhere with --out DIR, or set {ENV_ZOO}=DIR to use a zoo "
                          "folder of your own")


def _found(name: str, marker: str) -> Path | None:
    """The first folder `name` of the zoo folders that holds `marker`, or None."""
    for d in zoo_dirs():
        if (d / name / marker).is_file():
            return d / name
    return None


def _searched() -> str:
    return " or ".join(str(d) for d in zoo_dirs())


def entries() -> list[Entry]:
    return list(ENTRIES)


def entry(name: str) -> Entry:
    if name not in _BY_NAME:
        raise RotvizError(f"unknown zoo model '{name}': known are {', '.join(_BY_NAME)}")
    return _BY_NAME[name]


def path_of(name: str) -> Path:
    """The directory of a built zoo model."""
    name = entry(name).name
    path = _found(name, "config.json")
    if path is None:
        raise RotvizError(f"zoo model '{name}' is not built (no {name} in {_searched()}); "
                          f"run: rotviz zoo build {name}")
    return path


def is_built(name: str) -> bool:
    return _found(entry(name).name, "config.json") is not None


def where(name: str) -> Path:
    """The folder zoo model or series `name` is read from when built, else where a build
    without `--out` writes it (for messages and listings)."""
    return _found(name, "card.json") or _found(name, "config.json") or build_dir() / name


def default_pair() -> tuple[str, str]:
    """The pair the app and the demos open on, as two `zoo:NAME` references."""
    a, b = PAIRS["default"]
    return f"zoo:{a}", f"zoo:{b}"


def pair(kind: str) -> tuple[str, str]:
    if kind not in PAIRS:
        raise RotvizError(f"unknown pair '{kind}': use one of {', '.join(PAIRS)}")
    a, b = PAIRS[kind]
    return f"zoo:{a}", f"zoo:{b}"


# ---- cards ------------------------------------------------------------------------------------


def read_card(name_or_dir: str | os.PathLike) -> dict:
    """The card of a zoo model (by name) or of a model directory."""
    d = Path(name_or_dir) if Path(name_or_dir).is_dir() else path_of(str(name_or_dir))
    f = d / "card.json"
    if not f.is_file():
        raise RotvizError(f"no card.json in '{d}'; rebuild it with rotviz zoo build")
    return ANYWHERE.read_json(f, "rebuild the model", "zoo card")

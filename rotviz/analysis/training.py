"""Barriers over training and spawn instability (Frankle et al., ICML 2020).

Two measurements that take more than one pair of endpoints (docs/landscape.md):
- barriers over training: two series of checkpoints, paired by step; at each common step the
  pair is matched (each matching asked for) and its barrier measured;
- instability against the spawn step: a spawn folder holding, for each step k of a parent
  run, two children trained from the parent's checkpoint at k to the end in different data
  orders; the barrier between the two children, for each matching, against k.

Each step's barrier is exactly `rotviz barrier`'s: the pair matched with `match_endpoints`,
then `curve_on` on the test split, max over alpha of L(alpha) minus the straight line
between the end losses. Every file is read through a `Confined` reader by `load_model`
(never remote code); folders are listed through the same reader.

Inputs:
- a series: a folder of `checkpoint-<step>/` model folders (Hugging Face Trainer's output
  layout), `zoo:NAME` (a series of the zoo), or a model of the local Hugging Face cache,
  `ORG/NAME` (every revision named `step<N>` it holds: Pythia's checkpoints) or
  `ORG/NAME@step1000,step2000` (those revisions), each step the model reference
  `ORG/NAME@step<N>` resolves to (rotviz.sources.hf_cache: an existing folder of that path wins,
  `hf-cache:` forces the cache; the cache is read as it is, nothing is downloaded);
- a spawn folder: `spawn-<k>/a/` and `spawn-<k>/b/` model folders, or `zoo:NAME`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from rotviz import zoo_registry as zoo
from rotviz.confine import ANYWHERE, Confined
from rotviz.data.split import Split
from rotviz.errors import RotvizError
from rotviz.sources import hf_cache as hub
from rotviz.types import Progress

CHECKPOINT = re.compile(r"checkpoint-(\d+)")
HF_STEP = re.compile(r"step(\d+)")
SPAWN = re.compile(r"spawn-(\d+)")
DEFAULT_MATCHES = ("none", "seed")


# ---- reading the inputs ------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """A run's checkpoints: its reference, and the model folder of each step."""

    ref: str
    steps: dict[int, Path]


def _steps_of(where: str, found: list[tuple[int, Path]]) -> dict[int, Path]:
    out: dict[int, Path] = {}
    for step, path in found:
        if step in out:
            raise RotvizError(f"'{where}' holds step {step} twice ({out[step].name} and "
                              f"{path.name}); keep one")
        out[step] = path
    return dict(sorted(out.items()))


def _cache_series(name: hub.CacheName, confined: Confined) -> dict[int, Path]:
    """The checkpoints of a model in the local Hugging Face cache, by step: the revisions
    `step<N>` that `name` lists (`ORG/NAME@step1000,step2000`), or, without a revision, every
    ref named `step<N>` the cache holds (Pythia's checkpoints); each resolved to its snapshot
    folder by rotviz.sources.hf_cache, as any `ORG/NAME@step<N>` model reference is (never
    downloaded)."""
    if name.revision is None:
        refs = hub.revisions(hub.repository(name, confined), confined)
        revs = [r for r in refs if HF_STEP.fullmatch(r)]
    else:
        revs = name.revision.split(",")
        bad = [r for r in revs if not HF_STEP.fullmatch(r)]
        if bad:
            raise RotvizError(f"series '{name}' names revision '{bad[0]}', which is no step: "
                              "a series pairs checkpoints by step, so name revisions step<N> "
                              "(ORG/NAME@step1000,step2000), or ORG/NAME for all it holds")
    found = []
    for rev in revs:
        step = hub.CacheName(name.repo_id, rev, name.explicit)
        found.append((int(HF_STEP.fullmatch(rev).group(1)), hub.locate(step, confined)))
    return _steps_of(str(name), found)


def read_series(ref: str, confined: Confined = ANYWHERE) -> Series:
    """The checkpoints of series `ref` by step (a folder of checkpoint-<step>/, zoo:NAME or
    ORG/NAME[@step<N>,...] in the Hugging Face cache), listed through `confined`; one line
    when it holds none."""
    ref = str(ref)
    cached = hub.cache_ref(ref)
    if cached is not None:
        steps = _cache_series(cached, confined)
    else:
        if ref.startswith("zoo:"):
            name = ref[4:]
            if name not in zoo.SERIES:
                raise RotvizError(f"'{ref}' is no series of the zoo; use one of "
                                  + ", ".join(f"zoo:{n}" for n in zoo.SERIES))
            folder = zoo.collection_path(name)
        else:
            folder = Path(ref).expanduser()
            if not folder.is_dir():
                raise RotvizError(f"no series folder at '{ref}': give a folder of "
                                  "checkpoint-<step>/ model folders, zoo:NAME or "
                                  "a cached ORG/NAME")
        found = [(int(m.group(1)), p) for p in confined.entries(folder, "series folder")
                 if (m := CHECKPOINT.fullmatch(p.name)) and p.is_dir()]
        steps = _steps_of(ref, found)
    if not steps:
        raise RotvizError(f"series '{ref}' holds no checkpoints (checkpoint-<step>/ folders, "
                          "or step<N> revisions in the Hugging Face cache)")
    return Series(ref, steps)


def read_spawn(ref: str, confined: Confined = ANYWHERE) -> dict[int, tuple[Path, Path]]:
    """The two children of each spawn step k of spawn folder `ref` (spawn-<k>/a and b, or
    zoo:NAME); one line when a child is missing or there is no spawn-<k>/ at all."""
    ref = str(ref)
    if ref.startswith("zoo:"):
        folder = zoo.collection_path(zoo.spawn_entry(ref[4:]).name)
    else:
        folder = Path(ref).expanduser()
        if not folder.is_dir():
            raise RotvizError(f"no spawn folder at '{ref}': give a folder of spawn-<k>/a/ and "
                              "spawn-<k>/b/ model folders, or zoo:NAME")
    found = []
    for p in confined.entries(folder, "spawn folder"):
        m = SPAWN.fullmatch(p.name)
        if m is None or not p.is_dir():
            continue
        a, b = p / "a", p / "b"
        for child in (a, b):
            if not child.is_dir():
                raise RotvizError(f"spawn step '{p.name}' of '{ref}' has no {child.name}/ "
                                  "child; give each spawn-<k>/ both a/ and b/")
        found.append((int(m.group(1)), (a, b)))
    out: dict[int, tuple[Path, Path]] = {}
    for k, pair in found:
        if k in out:
            raise RotvizError(f"'{ref}' holds spawn step {k} twice; keep one")
        out[k] = pair
    if not out:
        raise RotvizError(f"'{ref}' holds no spawn-<k>/ folders (each with a/ and b/ children)")
    return dict(sorted(out.items()))


def paired(a: Series, b: Series) -> tuple[list[int], list[int], list[int]]:
    """The steps in both series, and those only in a, only in b; one line when none is
    common."""
    common = sorted(set(a.steps) & set(b.steps))
    if not common:
        raise RotvizError(f"series '{a.ref}' (steps {_few(a.steps)}) and '{b.ref}' (steps "
                          f"{_few(b.steps)}) have no step in common; pair runs saved at the "
                          "same steps")
    return common, sorted(set(a.steps) - set(b.steps)), sorted(set(b.steps) - set(a.steps))


def _few(steps) -> str:
    s = sorted(steps)
    return ", ".join(map(str, s[:6])) + (f", ... ({len(s)} in all)" if len(s) > 6 else "")


# ---- the inputs as the records take them --------------------------------------------------------


def _specs(specs: Sequence[str] | None) -> tuple[str, ...]:
    """The matchings asked for, canonical and each once (default: none and seed)."""
    from rotviz.match.selection import label_of, match_options

    out: list[str] = []
    for s in specs or DEFAULT_MATCHES:
        options = match_options(s)
        label = "none" if options is None else label_of(options)
        if label not in out:
            out.append(label)
    return tuple(out)


@dataclass(frozen=True)
class TwoSeries:
    """What `rotviz training` measures: two series and the matchings, read and checked."""

    a: Series
    b: Series
    specs: tuple[str, ...]
    confined: Confined = ANYWHERE

    @classmethod
    def read(cls, refs: Sequence[str], specs: Sequence[str] | None = None,
             confined: Confined = ANYWHERE) -> TwoSeries:
        out = cls(read_series(refs[0], confined), read_series(refs[1], confined),
                  _specs(specs), confined)
        paired(out.a, out.b)  # no common step: one line before any model is loaded
        return out

    def first_pair(self) -> tuple[Path, Path]:
        s = paired(self.a, self.b)[0][0]
        return self.a.steps[s], self.b.steps[s]


@dataclass(frozen=True)
class SpawnFolder:
    """What `rotviz spawn` measures: a spawn folder and the matchings, read and checked."""

    ref: str
    children: dict[int, tuple[Path, Path]]
    specs: tuple[str, ...]
    confined: Confined = ANYWHERE

    @classmethod
    def read(cls, refs: Sequence[str], specs: Sequence[str] | None = None,
             confined: Confined = ANYWHERE) -> SpawnFolder:
        return cls(str(refs[0]), read_spawn(refs[0], confined), _specs(specs), confined)

    def first_pair(self) -> tuple[Path, Path]:
        return next(iter(self.children.values()))


# ---- measuring ---------------------------------------------------------------------------------


@dataclass
class Barriers:
    """The barrier at each x (a training step, or a spawn step k), for each matching."""

    x: list[int]
    matches: list[str]
    barrier: dict[str, list[float]]  # matching -> one value per x
    mid_acc: dict[str, list[float]]  # accuracy at alpha 0.5
    loss_a: list[float]  # the end points' test losses (alpha 0 and 1, matched: the same)
    loss_b: list[float]
    acc_a: list[float]
    acc_b: list[float]
    distance_before: list[float]
    distance_after: dict[str, list[float]]
    points: int
    data: str
    split: str
    n: int
    device: str
    seconds: float
    stopped: str = ""  # "cancelled" when the caller's cancel() stopped it
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def barriers_of(pairs: Sequence[tuple[int, Path, Path]], specs: Sequence[str], split: Split,
                points: int = 11, device: str | torch.device = "cpu", batch_size: int = 512,
                progress: Progress | None = None, cancel: Callable[[], bool] | None = None,
                confined: Confined = ANYWHERE) -> Barriers:
    """For each (x, model folder a, model folder b): both loaded through `confined`, matched
    with each SPEC (match_endpoints) and the barrier measured as `rotviz barrier` does
    (curve_on on `split`, `points` alphas)."""
    from rotviz.analysis.paths import check_path
    from rotviz.devices import resolve_device
    from rotviz.match.endpoints import match_endpoints
    from rotviz.measures.barrier import curve_on
    from rotviz.sources.loading import load_model

    check_path(points, 1, split)
    dev = resolve_device(device)
    t0 = time.perf_counter()
    specs = list(specs)
    out = Barriers([], specs, {s: [] for s in specs}, {s: [] for s in specs}, [], [], [], [],
                   [], {s: [] for s in specs}, points, split.data, split.split, split.n,
                   str(dev), 0.0)
    total, done = len(pairs) * len(specs), 0
    for x, pa, pb in pairs:
        if cancel is not None and cancel():
            out.stopped = "cancelled"
            break
        a, b = load_model(pa, confined=confined), load_model(pb, confined=confined)
        for spec in specs:
            ends = match_endpoints(a, b, spec, dev, data=split)
            c = curve_on(ends, split, points, dev, None, 1, 0, batch_size)
            assert c is not None  # one process
            out.barrier[spec].append(c.barrier)
            out.mid_acc[spec].append(c.mid_acc)
            out.distance_after[spec].append(c.distance_after)
            if spec == specs[0]:
                out.x.append(x)
                out.loss_a.append(c.loss[0])
                out.loss_b.append(c.loss[-1])
                out.acc_a.append(c.acc[0])
                out.acc_b.append(c.acc[-1])
                out.distance_before.append(c.distance_before)
            done += 1
            if progress is not None:
                progress(done, total, f"{x}: {spec} barrier {c.barrier:.4f}")
    out.seconds = time.perf_counter() - t0
    return out


def barriers_over_training(inputs: TwoSeries, split: Split, points: int = 11,
                           device: str | torch.device = "cpu", batch_size: int = 512,
                           progress: Progress | None = None,
                           cancel: Callable[[], bool] | None = None) -> Barriers:
    """The barrier between the two series at each common step, for each matching; the steps
    only one series holds are listed in `extra` (only_a, only_b)."""
    steps, only_a, only_b = paired(inputs.a, inputs.b)
    r = barriers_of([(s, inputs.a.steps[s], inputs.b.steps[s]) for s in steps], inputs.specs,
                    split, points, device, batch_size, progress, cancel, inputs.confined)
    r.extra = {"kind": "training", "series_a": inputs.a.ref, "series_b": inputs.b.ref,
               "only_a": only_a, "only_b": only_b}
    return r


def spawn_instability(inputs: SpawnFolder, split: Split, points: int = 11,
                      device: str | torch.device = "cpu", batch_size: int = 512,
                      progress: Progress | None = None,
                      cancel: Callable[[], bool] | None = None) -> Barriers:
    """The barrier between the two children of each spawn step k, for each matching."""
    r = barriers_of([(k, a, b) for k, (a, b) in inputs.children.items()], inputs.specs, split,
                    points, device, batch_size, progress, cancel, inputs.confined)
    r.extra = {"kind": "spawn", "folder": inputs.ref}
    return r

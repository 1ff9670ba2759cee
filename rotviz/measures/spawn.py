"""Instability against the spawn step (Frankle et al., ICML 2020): for each step k of a
parent run, the barrier between two children trained from the parent's checkpoint at k to
the end in different data orders, per matching (docs/landscape.md,
"spawn"); the inputs read and the pairs measured as rotviz.measures.training does."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rotviz import zoo_registry as zoo
from rotviz.confine import ANYWHERE, Confined
from rotviz.errors import RotvizError
from rotviz.measures.registry import Context, Inputs, Measurement, Section, register
from rotviz.measures.training import (
    AT_SIZE,
    PARAMS,
    Barriers,
    barriers_of,
    lines_figure,
    rows,
    specs_of,
)
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import torch

    from rotviz.data.split import Split
    from rotviz.types import Progress

SPAWN_FOLDER = re.compile(r"spawn-(\d+)")  # a spawn step k's folder


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
        m = SPAWN_FOLDER.fullmatch(p.name)
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
        return cls(str(refs[0]), read_spawn(refs[0], confined), specs_of(specs), confined)

    def first_pair(self) -> tuple[Path, Path]:
        return next(iter(self.children.values()))


def spawn_instability(inputs: SpawnFolder, split: Split, points: int = 11,
                      device: str | torch.device = "cpu", batch_size: int = 512,
                      progress: Progress | None = None,
                      cancel: Callable[[], bool] | None = None,
                      time_limit: float | None = None) -> Barriers:
    """The barrier between the two children of each spawn step k, for each matching
    (`time_limit`: seconds each weight matching's alternation may take)."""
    r = barriers_of([(k, a, b) for k, (a, b) in inputs.children.items()], inputs.specs, split,
                    points, device, batch_size, progress, cancel, inputs.confined, time_limit)
    r.extra = {"kind": "spawn", "folder": inputs.ref}
    return r


def _run(inputs, ctx: Context, v: dict):
    return spawn_instability(inputs, ctx.split, v["points"], ctx.device, v["batch_size"],
                             ctx.progress, ctx.cancel, ctx.time_limit)


def _summary(r, how: str) -> str:
    said = "; ".join(f"{m}: " + ", ".join(f"k={k} {b:.4f}" for k, b in zip(r.x, r.barrier[m],
                                                                         strict=True))
                     for m in r.matches)
    return (f"spawn instability on {r.device}{how}: barrier between the two children by "
            f"spawn step, {said}; {r.points} points on {r.n} {r.split} samples in "
            f"{r.seconds:.2f} s")


SPAWN_STEP = "spawn step k (parent's optimiser updates before the children split)"


def spawn_figure(d: Mapping, style: Style | None = None, title: str | None = None):
    """The barrier between the two children against the step k they were spawned at, one
    line per matching; 0 means the children land in one linearly connected basin."""
    return lines_figure(d, (style or Style()).font_size, title or "Instability: barrier "
                        "between two children against the spawn step", SPAWN_STEP, "k =")


SECTION = Section(
    "training", 20, "2. Instability against the spawn step",
    "A spawn folder holds `spawn-<k>/a/` and `spawn-<k>/b/`: the two children copied from "
    "the parent at step *k* and trained to the end in different data orders. Children "
    "spawned at the last step are the parent itself, twice: their barrier is 0.",
    defaults={"points": 5},
    caption=lambda d: f"Spawn steps {', '.join(map(str, d['x']))}, on {d['n']} test samples.",
    doing=lambda v: f"every matching at each spawn step, {v['points']} points per path")

SPAWN = register(Measurement(
    "spawn", "Instability against the spawn step",
    "the barrier between two children spawned at step k and trained apart, against k",
    _run, PARAMS, summary=_summary, plot=spawn_figure, rows=rows, refusal=AT_SIZE,
    inputs=Inputs((("spawn_dir", "a spawn folder: spawn-<k>/a/ and spawn-<k>/b/ model "
                    "folders (the two children spawned at step k), or zoo:NAME"),),
                  SpawnFolder.read),
    progress=True, section=SECTION, order=150))

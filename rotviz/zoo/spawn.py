"""Building the zoo's spawn series (Frankle et al., ICML 2020): one parent run of a recipe,
children spawned from it at several steps k, each trained to the end twice with two seeded
data orders, and the intermediate checkpoints of the two children spawned at k = 0.

Written as the layouts rotviz reads (rotviz.measures.training, docs/landscape.md):

    vit-digits-spawn/
      card.json                        recipe, seeds, steps, each model's test metrics
      spawn-<k>/a/, spawn-<k>/b/       the two children spawned at step k, at the last step
      run-a/checkpoint-<step>/         the child a spawned at k = 0, along its training
      run-b/checkpoint-<step>/         (Hugging Face Trainer's layout)

Every model folder is one output of one transaction (rotviz.outputs): checked before any
training, renamed into place when all of it is written.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rotviz.outputs import Outputs, write_json_file
from rotviz.types import Progress
from rotviz.zoo import recipes, train
from rotviz.zoo_registry import SpawnEntry, build_dir, refuse_shipped, spawn_entry


def layout(ent: SpawnEntry) -> list[tuple[str, str, int, int]]:
    """Every model folder of the series: (relative folder, run, spawn step k, step), run
    'a' or 'b' (a child) at the recipe's last step, or at `step` for the k = 0 runs."""
    last = ent.spawn_steps[-1]
    out = [(f"spawn-{k}/{run}", run, k, last) for k in ent.spawn_steps for run in ("a", "b")]
    out += [(f"run-{run}/checkpoint-{s}", run, 0, s) for run in ("a", "b")
            for s in ent.series_steps]
    return out


def build_output(name: str, out_dir: str | os.PathLike | None = None,
                 overwrite: bool = False) -> Outputs:
    """The checked outputs (every model folder and the card), before any training. Without
    `out_dir` the series is built in the zoo's build folder (rotviz.zoo_registry.build_dir),
    replacing an earlier build there; a series that ships with the package is refused there."""
    ent = spawn_entry(name)
    if out_dir is None:
        refuse_shipped(ent.name)
    root = build_dir() / ent.name if out_dir is None else Path(out_dir)
    again = overwrite or out_dir is None
    outputs = Outputs("zoo build")
    for rel, *_ in layout(ent):
        outputs.add(root / rel, "zoo folder" if out_dir is None else "--out", folder=True,
                    overwrite=again)
    outputs.add(root / "card.json", "zoo card", folder=False, overwrite=again)
    return outputs


def build(name: str, out_dir: str | os.PathLike | None = None,
          progress: Progress | None = None, overwrite: bool = False) -> Path:
    """Train the parent, then both children at every spawn step, and write the series."""
    ent = spawn_entry(name)
    rec = recipes.recipe(ent.recipe)
    outputs = build_output(name, out_dir, overwrite)
    data = train.select(train.recipe_split(rec, "train"), rec.subset)
    last = ent.spawn_steps[-1]
    t0 = time.perf_counter()
    parent = train.run_steps(rec, ent.seed, data, ent.parent_order, set(ent.spawn_steps),
                             progress=progress)
    if set(parent) != set(ent.spawn_steps):
        raise RuntimeError(f"the parent run stopped short of step {last}")
    states = {}
    for k in ent.spawn_steps:
        for run, order in zip(("a", "b"), ent.orders, strict=True):
            keep = {last} | (set(ent.series_steps) if k == 0 else set())
            kept = train.run_steps(rec, ent.seed, data, order, keep, parent[k], progress)
            states[(run, k)] = kept
    seconds = time.perf_counter() - t0
    saver = train.Saver(rec, ent.seed)
    metrics = {}
    with outputs.write() as temps:
        for out, tmp in temps.items():
            if not out.folder:
                continue
            rel = out.path.relative_to(outputs.items[-1].path.parent).as_posix()
            _, run, k, step = next(x for x in layout(ent) if x[0] == rel)
            metrics[rel] = saver.save(states[(run, k)][step].model, tmp)
        card = {
            "name": name, "description": ent.description, "recipe": rec.to_dict(),
            "seed": ent.seed, "parent_order": ent.parent_order, "orders": list(ent.orders),
            "spawn_steps": list(ent.spawn_steps), "series_steps": list(ent.series_steps),
            "steps": last, "data": {"ref": rec.data, "split_seed": 0, "n_train": data.n,
                                    "n_test": saver.test.n},
            "test": dict(sorted(metrics.items())), "train_seconds": round(seconds, 2),
            **train.built_on(),
        }
        card_out = outputs.items[-1]
        write_json_file(temps[card_out], card, "zoo build")
    return card_out.path.parent

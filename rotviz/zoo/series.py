"""Building a short series of the zoo (rotviz.zoo_registry.RUNS): one seeded run of a recipe,
its checkpoints kept at a few steps, written as the layout rotviz reads for a series
(rotviz.measures.training.read_series):

    vit-digits-sgd/
      card.json                 recipe, seed, data order, steps, each checkpoint's test metrics
      checkpoint-<step>/        Hugging Face Trainer's layout, one model folder per step

The zoo's SGD series (no weight decay) is the conserved quantities' contrast to its AdamW
runs (docs/landscape.md, "conserved"). The series folder is one output (rotviz.outputs),
checked before any training and renamed into place when all of it is written.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rotviz.outputs import Outputs, write_json_file
from rotviz.sources import loading as models
from rotviz.types import Progress
from rotviz.zoo import recipes, train
from rotviz.zoo_registry import build_dir, refuse_shipped, run_entry


def build_output(name: str, out_dir: str | os.PathLike | None = None,
                 overwrite: bool = False) -> Outputs:
    """The checked outputs (each checkpoint folder and the card), before any training;
    without `out_dir`, in the zoo's build folder (a shipped series is refused there)."""
    ent = run_entry(name)
    if out_dir is None:
        refuse_shipped(ent.name)
    root = build_dir() / ent.name if out_dir is None else Path(out_dir)
    again = overwrite or out_dir is None
    outputs = Outputs("zoo build")
    outputs.add(root, "zoo folder" if out_dir is None else "--out", folder=True,
                overwrite=again)
    return outputs


def _start(rec: recipes.Recipe, seed: int, series: str, step: int) -> train.RunState:
    """Where a run that starts from another series' checkpoint begins: that checkpoint's
    weights (read through the loader, as any model), the recipe's optimiser fresh, at step 0.
    The other series must be built (one line naming its build command otherwise)."""
    from rotviz.errors import RotvizError
    from rotviz.zoo_registry import collection_path

    where = collection_path(series) / f"checkpoint-{step}"
    if not where.is_dir():
        raise RotvizError(f"zoo series '{series}' has no checkpoint-{step}; rebuild it: "
                          f"rotviz zoo build {series}")
    weights = models.load_model(where).state
    with train.deterministic_cpu(seed):
        module = rec.build_model()
    module.load_state_dict(weights)
    opt = train.optimiser(rec, module.parameters())
    return train.RunState(0, {k: v.detach().clone() for k, v in module.state_dict().items()},
                          opt.state_dict())


def build(name: str, out_dir: str | os.PathLike | None = None,
          progress: Progress | None = None, overwrite: bool = False) -> Path:
    """Train the run to its last kept step and write every kept checkpoint and the card."""
    ent = run_entry(name)
    rec = recipes.recipe(ent.recipe)
    outputs = build_output(name, out_dir, overwrite)
    data = train.select(train.recipe_split(rec, "train"), rec.subset)
    t0 = time.perf_counter()
    begin = None if ent.start is None else _start(rec, ent.seed, *ent.start)
    states = train.run_steps(rec, ent.seed, data, ent.order, set(ent.steps), start=begin,
                             progress=progress, stop=ent.steps[-1])
    if set(states) != set(ent.steps):
        raise RuntimeError(f"the run of {name} stopped short of step {ent.steps[-1]}")
    seconds = time.perf_counter() - t0
    saver = train.Saver(rec, ent.seed)
    metrics = {}
    folder = outputs.items[0]
    with outputs.write() as temps:
        tmp = temps[folder]
        for step in ent.steps:
            where = tmp / f"checkpoint-{step}"
            where.mkdir()
            metrics[where.name] = saver.save(states[step].model, where)
        card = {
            "name": name, "description": ent.description, "recipe": rec.to_dict(),
            "seed": ent.seed, "order": ent.order, "series_steps": list(ent.steps),
            "start": None if ent.start is None else
            {"series": f"zoo:{ent.start[0]}", "step": ent.start[1]},
            "steps": ent.steps[-1], "data": {"ref": rec.data, "split_seed": 0,
                                             "n_train": data.n, "n_test": saver.test.n},
            "test": metrics, "train_seconds": round(seconds, 2), **train.built_on(),
        }
        write_json_file(tmp / "card.json", card, "zoo build")
    return folder.path

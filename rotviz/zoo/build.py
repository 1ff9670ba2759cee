"""Building the zoo: train an entry from its recipe and seed (rotviz.zoo.train), evaluate it
and write it with its card, as one transaction (rotviz.outputs)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from datetime import datetime, timezone
from pathlib import Path

import torch

from rotviz.arch import spec_named
from rotviz.data.files import data_path
from rotviz.data.labelled import LABELLED_KINDS, majority_accuracy
from rotviz.data.reading import split_for
from rotviz.data.split import Split, load_split
from rotviz.data.splits import IGNORE
from rotviz.data.tasks import CLASSIFIER_TASKS, METRIC_LABELS, scores
from rotviz.data.text import pystdlib_fingerprint
from rotviz.data.tokens import fingerprint, tokenizer_files
from rotviz.evaluation import evaluate
from rotviz.outputs import Outputs
from rotviz.sources import loading as models
from rotviz.sources.adapters import source_of
from rotviz.types import Progress
from rotviz.zoo import recipes, train
from rotviz.zoo_registry import build_dir, entry, is_built, path_of, refuse_shipped


def write_card(model_dir: str | os.PathLike, card: dict) -> None:
    """card.json (and a short README.md) into a model directory."""
    d = Path(model_dir)
    (d / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    (d / "README.md").write_text(card_markdown(card))


def card_markdown(card: dict) -> str:
    t, r = card["test"], card["recipe"]
    lines = [
        f"# {card['name']}",
        "",
        card.get("description", ""),
        "",
        f"- recipe: `{r['name']}` ({r['description']})",
        f"- seed: {card['seed']}" + (f"; starts from `{card['init']}`" if card.get("init") else ""),
        f"- data: `{card['data']['ref']}`, train subset `{card['data']['subset']}` "
        f"({card['data']['n_train']} examples), split seed {card['data']['split_seed']}",
        f"- test: loss {t['loss']:.4f}, accuracy {t['acc']:.4f} on {t['n']} examples"
        + "".join(f", {METRIC_LABELS.get(k, k)} {v:.4f}" for k, v in t.items()
                  if k not in ("loss", "acc", "n")),
        f"- trained in {card['train_seconds']:.1f} s on {card['threads']} CPU thread(s), "
        f"python {card['python']}, torch {card['versions']['torch']}, "
        f"transformers {card['versions']['transformers']}",
    ]
    if card.get("baseline"):
        b = card["baseline"]
        lines.append("- majority-class baseline on the test split: " + ", ".join(
            f"{'accuracy' if k == 'acc' else METRIC_LABELS.get(k, k)} {v:.4f}"
            for k, v in b.items()))
    lines += [
        "",
        f"Rebuild: `rotviz zoo build {card['name']}`",
        "",
    ]
    return "\n".join(lines)


def _versions() -> dict:
    import numpy
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "numpy": numpy.__version__, "python": platform.python_version()}


def build_output(name: str, out_dir: str | os.PathLike | None = None, overwrite: bool = False):
    """The checked output folder of `build` (rotviz.outputs), before any training.

    Without `out_dir` the model is built in the zoo's build folder (the user cache, or
    `ROTVIZ_ZOO`: rotviz.zoo_registry.build_dir), replacing an earlier build there (a rotviz
    output) as if `overwrite` were given; a model that ships with the package is refused
    there, since the shipped one would still be read."""
    outputs = Outputs("zoo build")
    if out_dir is None:
        refuse_shipped(entry(name).name)
        outputs.add(build_dir() / entry(name).name, "zoo folder", folder=True, overwrite=True)
    else:
        outputs.add(out_dir, "--out", folder=True, overwrite=overwrite)
    return outputs


def build(
    name: str, out_dir: str | os.PathLike | None = None, progress: Progress | None = None,
    overwrite: bool = False,
) -> Path:
    """Train zoo model `name` from its recipe and seed; write it (with its card) as one
    transaction (rotviz.outputs), checked before training starts.

    A fine-tune starts from its base as shipped in the zoo, or, when the base is not built,
    from the base trained here first (the same weights on the same machine).
    """
    ent = entry(name)
    rec = recipes.recipe(ent.recipe)
    outputs = build_output(name, out_dir, overwrite)
    folder = outputs.items[0]
    init_state = _base_state(rec.init, progress) if rec.init else None
    if rec.grow is not None:
        init_state = _grown_state(rec, init_state)
    data = train.select(train.recipe_split(rec, "train"), rec.subset)
    result = train.train(rec, ent.seed, data, init_state, progress)

    with outputs.write() as temps:
        tmp = temps[folder]
        spec = spec_named(rec.family)
        source_of(spec).save_module(result.model, rec.hf_config().to_dict(), tmp)
        if rec.tokenizer is not None:  # byte for byte: the models of a pair read alike
            for f in tokenizer_files(data_path(rec.tokenizer)):
                shutil.copyfile(f, tmp / f.name)
        loaded = models.load_model(tmp)
        with train.deterministic_cpu(0, train.TRAIN_THREADS):
            splits = {s: _eval_split(rec, loaded, s) for s in ("val", "test")}
            metrics = {s: evaluate(loaded, sp) for s, sp in splits.items()}
        data_info = {"ref": rec.data, "split_seed": 0, "subset": rec.subset, "n_train": data.n,
                     "n_val": metrics["val"]["n"], "n_test": metrics["test"]["n"]}
        if rec.data == "pystdlib":
            data_info["corpus"] = pystdlib_fingerprint()
        if rec.tokenizer is not None:
            data_info["tokenizer"] = fingerprint(tokenizer_files(tmp))
            data_info["sha256"] = _file_sha(rec.data)
        card = {
            "name": name,
            "description": ent.description,
            "pair": ent.pair,
            "recipe": rec.to_dict(),
            "seed": ent.seed,
            "init": rec.init,
            "data": data_info,
            "test": metrics["test"],
            "val": metrics["val"],
            **({"baseline": baseline(splits["test"])}
               if splits["test"].task in CLASSIFIER_TASKS else {}),
            "final_train_loss": result.epoch_losses[-1],
            "train_seconds": round(result.seconds, 2),
            "steps": result.steps,
            "threads": train.TRAIN_THREADS,
            "python": platform.python_version(),
            "versions": _versions(),
            "platform": f"{platform.system()} {platform.machine()}",
            "built": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        }
        write_card(tmp, card)
    return folder.path


def _base_state(base: str, progress: Progress | None):
    """The weights a fine-tune starts from: the shipped base, else the base trained now."""
    if is_built(base):
        return models.load_model(path_of(base)).state
    ent = entry(base)
    rec = recipes.recipe(ent.recipe)
    data = train.select(train.recipe_split(rec, "train"), rec.subset)
    return train.train(rec, ent.seed, data, None, progress).model.state_dict()


def _grown_state(rec: recipes.Recipe, state):
    """The base's weights grown to the recipe's depth (rotviz.analysis.depths.grown)."""
    from rotviz.analysis.depths import grown

    assert rec.init is not None and rec.grow is not None
    spec = spec_named(rec.family)
    base = recipes.recipe(entry(rec.init).recipe)
    module, config = source_of(spec).build(base.hf_config().to_dict(), spec)
    module.load_state_dict(dict(state))
    loaded = models.Loaded(rec.init, Path("."), config, spec, module.eval(),
                           dict(module.state_dict()))
    return grown(loaded, rec.grow, rec.name).state


def _eval_split(rec: recipes.Recipe, loaded: models.Loaded, split: str) -> Split:
    """A split the built model is scored on: read through the model itself where it reads
    text with its own tokenizer (rotviz.data.reading.split_for), else as before."""
    if rec.tokenizer is None:
        return load_split(rec.data, split)
    return split_for(loaded, rec.data, split)


def _file_sha(ref: str) -> str | None:
    """The sha256 of a data file reference's file (text:, jsonl:, ...), None for others."""
    kind, _, path = ref.partition(":")
    if kind not in (*LABELLED_KINDS, "text") or not path:
        return None
    return hashlib.sha256(data_path(path).read_bytes()).hexdigest()


def baseline(split: Split) -> dict[str, float]:
    """The test scores of always answering the split's most common label (the majority-class
    baseline every classifier has to beat): accuracy and the task's metrics."""
    y = split.labels
    valid = y[y != IGNORE]
    common = int(torch.bincount(valid).argmax())
    pred = torch.where(y != IGNORE, torch.full_like(y, common), y)
    return {"acc": majority_accuracy(y),
            **scores(split.task, pred, y, split.label_names, split.n_classes)}

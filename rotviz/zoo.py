"""The model zoo: small trained models shipped in `assets/zoo/`, each rebuildable from its recipe.

Every entry is a model directory (config.json + model.safetensors, Hugging Face format) with
a card (`card.json`) recording its recipe, seed, data split, test metrics, training time and
library versions. `zoo:NAME` works wherever rotviz takes a model.

Pairs:
- default (`vit-digits-s3`, `vit-digits-s6`): independent seeds, the generalized-LMC setting;
- finetuned (`vit-digits-ft-a`, `vit-digits-ft-b`): two fine-tunes of `vit-digits-base` on
  different halves of the training split with different hyperparameters, the seed paper's setting;
- gpt2 (`gpt2-pystdlib-s0`, `gpt2-pystdlib-s1`): independent seeds of a character LM.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rotviz.errors import RotvizError

Progress = Callable[[int, int, str], None]


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
    Entry("vit-digits-base", "vit-digits-base", 2, "base", "shared base of the fine-tuned pair"),
    Entry("vit-digits-ft-a", "vit-digits-ft-even", 3, "finetuned",
          "vit-digits-base fine-tuned on the even half, lr 5e-4, batch 32"),
    Entry("vit-digits-ft-b", "vit-digits-ft-odd", 4, "finetuned",
          "vit-digits-base fine-tuned on the odd half, lr 1e-3, weight decay 0.1"),
    Entry("gpt2-pystdlib-s0", "gpt2-pystdlib", 0, "gpt2", "GPT-2 character LM, seed 0"),
    Entry("gpt2-pystdlib-s1", "gpt2-pystdlib", 1, "gpt2", "GPT-2 character LM, seed 1"),
)
_BY_NAME = {e.name: e for e in ENTRIES}
PAIRS = {
    "default": ("vit-digits-s3", "vit-digits-s6"),
    "finetuned": ("vit-digits-ft-a", "vit-digits-ft-b"),
    "gpt2": ("gpt2-pystdlib-s0", "gpt2-pystdlib-s1"),
}


def zoo_dir() -> Path:
    """`ROTVIZ_ZOO` if set, else the repository's `assets/zoo`."""
    env = os.environ.get("ROTVIZ_ZOO")
    return Path(env).expanduser() if env else Path(__file__).resolve().parents[1] / "assets" / "zoo"


def entries() -> list[Entry]:
    return list(ENTRIES)


def entry(name: str) -> Entry:
    if name not in _BY_NAME:
        raise RotvizError(f"unknown zoo model '{name}': known are {', '.join(_BY_NAME)}")
    return _BY_NAME[name]


def path_of(name: str) -> Path:
    """The directory of a built zoo model."""
    path = zoo_dir() / entry(name).name
    if not (path / "config.json").is_file():
        raise RotvizError(
            f"zoo model '{name}' is not built (no {path}); run: rotviz zoo build {name}"
        )
    return path


def is_built(name: str) -> bool:
    return (zoo_dir() / entry(name).name / "config.json").is_file()


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
    try:
        return json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RotvizError(
            f"cannot parse '{f}' ({e.__class__.__name__}); rebuild the model"
        ) from None


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
        f"- test: loss {t['loss']:.4f}, accuracy {t['acc']:.4f} on {t['n']} examples",
        f"- trained in {card['train_seconds']:.1f} s on {card['threads']} CPU thread(s), "
        f"python {card['python']}, torch {card['versions']['torch']}, "
        f"transformers {card['versions']['transformers']}",
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


# ---- building ---------------------------------------------------------------------------------


def build_output(name: str, out_dir: str | os.PathLike | None = None, overwrite: bool = False):
    """The checked output folder of `build` (rotviz.outputs), before any training.

    Without `out_dir` the model is rebuilt in place in the zoo folder, replacing the earlier
    build (a rotviz output) as if `overwrite` were given."""
    from rotviz.outputs import Outputs

    outputs = Outputs("zoo build")
    if out_dir is None:
        outputs.add(zoo_dir() / entry(name).name, "zoo folder", folder=True, overwrite=True)
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
    from rotviz.data import load_split, pystdlib_fingerprint
    from rotviz.evaluation import evaluate
    from rotviz.models import load_model
    from rotviz.recipes import recipe as get_recipe
    from rotviz.train import TRAIN_THREADS, deterministic_cpu, select, train

    ent = entry(name)
    rec = get_recipe(ent.recipe)
    outputs = build_output(name, out_dir, overwrite)
    folder = outputs.items[0]
    init_state = _base_state(rec.init, progress) if rec.init else None
    data = select(load_split(rec.data, "train"), rec.subset)
    result = train(rec, ent.seed, data, init_state, progress)

    with outputs.write() as temps:
        tmp = temps[folder]
        _save_pretrained(result.model, tmp)
        loaded = load_model(tmp)
        with deterministic_cpu(0, TRAIN_THREADS):
            metrics = {s: evaluate(loaded, load_split(rec.data, s)) for s in ("val", "test")}
        data_info = {"ref": rec.data, "split_seed": 0, "subset": rec.subset, "n_train": data.n,
                     "n_val": metrics["val"]["n"], "n_test": metrics["test"]["n"]}
        if rec.data == "pystdlib":
            data_info["corpus"] = pystdlib_fingerprint()
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
            "final_train_loss": result.epoch_losses[-1],
            "train_seconds": round(result.seconds, 2),
            "steps": result.steps,
            "threads": TRAIN_THREADS,
            "python": platform.python_version(),
            "versions": _versions(),
            "platform": f"{platform.system()} {platform.machine()}",
            "built": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        }
        write_card(tmp, card)
    return folder.path


def _base_state(base: str, progress: Progress | None):
    """The weights a fine-tune starts from: the shipped base, else the base trained now."""
    from rotviz.data import load_split
    from rotviz.models import load_model
    from rotviz.recipes import recipe as get_recipe
    from rotviz.train import select, train

    if is_built(base):
        return load_model(path_of(base)).state
    ent = entry(base)
    rec = get_recipe(ent.recipe)
    data = select(load_split(rec.data, "train"), rec.subset)
    return train(rec, ent.seed, data, None, progress).model.state_dict()


def _save_pretrained(model, out: Path) -> None:
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(out), safe_serialization=True)
    finally:
        if bar:
            hf_logging.enable_progress_bar()

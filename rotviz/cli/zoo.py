"""Command-line sub-commands `zoo build|list|default` and `eval` (registered by rotviz.cli).

Imports stay inside the handlers: `rotviz eval` must answer in a few seconds, imports included.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rotviz.cli.args import add_overwrite, add_reading, bounded, guard_inputs, reading
from rotviz.errors import RotvizError
from rotviz.limits import BATCH_SIZE
from rotviz.sources import hf_cache as hub
from rotviz.zoo_registry import PAIRS


def register(sub, wanted: Callable[[str], bool] = lambda name: True) -> None:
    """`zoo` and `eval`, those of them that `wanted` names (rotviz.cli.build_parser)."""
    if wanted("zoo"):
        _add_zoo(sub)
    if wanted("eval"):
        _add_eval(sub)


def _add_zoo(sub) -> None:
    z = sub.add_parser("zoo", help="the shipped model zoo: list it, name the default pair, rebuild")
    zs = z.add_subparsers(dest="zoo_command", required=True)
    b = zs.add_parser("build", help="train zoo models from their recipes and seeds")
    b.add_argument("names", nargs="+", metavar="NAME",
                   help=f"zoo model names, a spawn series (vit-digits-spawn), a short "
                        f"series (vit-digits-sgd), or a pair "
                        f"({', '.join(PAIRS)}), or all")
    b.add_argument("--out", default=None, metavar="DIR",
                   help="write NAME folders under DIR (default: the zoo's build folder, "
                        "the user cache or ROTVIZ_ZOO, replacing an earlier build there)")
    add_overwrite(b)
    b.set_defaults(func=cmd_build)
    li = zs.add_parser("list", help="list the zoo models with their test metrics")
    li.set_defaults(func=cmd_list)
    d = zs.add_parser("default", help="print the two references of the default pair")
    d.set_defaults(func=cmd_default)


def _add_eval(sub) -> None:
    e = sub.add_parser("eval", help="test loss and accuracy of a model on a data split")
    e.add_argument("model", help=f"model: {hub.MODEL_HELP}")
    e.add_argument("--data", required=True,
                   help="digits, pystdlib, text:FILE, csv:FILE, tsv:FILE, jsonl:FILE, "
                        "conll:FILE, hf:DIR, imagefolder:DIR or cifar10:DIR")
    add_reading(e)
    e.add_argument("--split", default="test", help="train, val or test (default test)")
    e.add_argument("--json", default=None, metavar="FILE",
                   help="also write the result as JSON to this new file")
    add_overwrite(e)
    e.add_argument("--device", default="auto", help="auto, cpu, cuda or mps (default auto)")
    e.add_argument("--batch-size", type=bounded(BATCH_SIZE), default=None,
                   help="evaluation batch size (default 512 images or 64 text windows)")
    e.set_defaults(func=cmd_eval)


# ---- zoo --------------------------------------------------------------------------------------


def _expand(names: list[str]) -> list[str]:
    """Names in build order (a fine-tune's base first), pairs and `all` expanded."""
    from rotviz import zoo_registry as zoo

    wanted: list[str] = []
    for n in names:
        if n == "all":
            wanted += [e.name for e in zoo.entries()]
        elif n in zoo.PAIRS:
            wanted += list(zoo.PAIRS[n])
        else:
            wanted.append(zoo.entry(n).name)
    order = [e.name for e in zoo.entries()]
    return sorted(dict.fromkeys(wanted), key=order.index)


def cmd_build(args: argparse.Namespace) -> int:
    from rotviz import zoo_registry as zoo
    from rotviz.zoo import series, spawn
    from rotviz.zoo.build import build, build_output

    spawns = [n for n in args.names if n in {e.name for e in zoo.SPAWNS}]
    runs = [n for n in args.names if n in {e.name for e in zoo.RUNS}]
    names = _expand([n for n in args.names if n not in spawns and n not in runs])
    if args.out is not None and not args.out.strip():
        raise RotvizError("--out is empty: give a folder for the NAME folders, or leave it out "
                          "to build in the zoo's build folder")
    if args.out is None:  # a pair or `all` builds what does not ship; a named model is refused
        grouped = [n for n in names if n not in args.names and zoo.shipped(n)]
        for name in grouped:
            print(f"{name} ships with rotviz ({zoo.where(name)}): not built again",
                  file=sys.stderr)
        names = [n for n in names if n not in grouped]
    for name in names:  # every output checked before any training
        build_output(name, _out_of(args, name), args.overwrite)
    for name in spawns:
        spawn.build_output(name, _out_of(args, name), args.overwrite)
    for name in runs:
        series.build_output(name, _out_of(args, name), args.overwrite)
    for name in names:
        bar = _bar(name)
        try:
            path = build(name, _out_of(args, name), progress=bar.update_to,
                         overwrite=args.overwrite)
        finally:
            bar.close()
        card = zoo.read_card(path)
        t = card["test"]
        print(f"built {name} in {card['train_seconds']:.1f} s: test loss {t['loss']:.4f}, "
              f"acc {t['acc']:.4f} (n={t['n']}); wrote {path}")
    for name in spawns + runs:  # the spawn series first: a short series may start from one
        builder, what, last = ((spawn.build, "models", "spawn-{steps}/a") if name in spawns
                               else (series.build, "checkpoints", "checkpoint-{steps}"))
        bar = _bar(name)
        try:
            path = builder(name, _out_of(args, name), progress=bar.update_to,
                           overwrite=args.overwrite)
        finally:
            bar.close()
        card = zoo.read_card(path)
        final = card["test"][last.format(steps=card["steps"])]
        print(f"built {name} ({len(card['test'])} {what}) in {card['train_seconds']:.1f} s: "
              f"final test loss {final['loss']:.4f}, acc {final['acc']:.4f}; wrote {path}")
    return 0


def _out_of(args: argparse.Namespace, name: str) -> Path | None:
    return Path(args.out) / name if args.out is not None else None


class _Bar:
    """A tqdm bar on stderr fed by a rotviz progress callback (silent when not a terminal)."""

    def __init__(self, desc: str):
        from tqdm import tqdm

        self.bar = tqdm(total=0, desc=desc, unit="step", file=sys.stderr, disable=None,
                        dynamic_ncols=True, leave=False)

    def update_to(self, done: int, total: int, message: str) -> None:
        if self.bar.total != total:
            self.bar.reset(total=total)
        self.bar.update(done - self.bar.n)
        self.bar.set_postfix_str(message, refresh=False)

    def close(self) -> None:
        self.bar.close()


def _bar(desc: str) -> _Bar:
    return _Bar(desc)


def cmd_list(args: argparse.Namespace) -> int:
    from rotviz import zoo_registry as zoo

    rows = [("name", "pair", "recipe", "seed", "test loss", "test acc", "n")]
    for e in zoo.entries():
        if zoo.is_built(e.name):
            card = zoo.read_card(e.name)
            t = card["test"]
            rows.append((e.name, e.pair, e.recipe, str(e.seed), f"{t['loss']:.4f}",
                         f"{t['acc']:.4f}", str(t["n"])))
        else:
            rows.append((e.name, e.pair, e.recipe, str(e.seed), "not built", "-", "-"))
    for r in zoo.RUNS:  # the short series: its last checkpoint's metrics
        folder = zoo.where(r.name)
        if (folder / "card.json").is_file():
            t = zoo.read_card(folder)["test"][f"checkpoint-{r.steps[-1]}"]
            rows.append((r.name, "series", r.recipe, str(r.seed), f"{t['loss']:.4f}",
                         f"{t['acc']:.4f}", f"{len(r.steps)} steps"))
        else:
            rows.append((r.name, "series", r.recipe, str(r.seed), "not built", "-", "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    folders = " then ".join(str(d) for d in zoo.zoo_dirs())
    print(f"(zoo folders, read in this order: {folders}; build a model with: "
          f"rotviz zoo build NAME, into {zoo.build_dir()})")
    return 0


def cmd_default(args: argparse.Namespace) -> int:
    from rotviz import zoo_registry as zoo

    for ref in zoo.default_pair():
        print(ref)
    return 0


# ---- eval -------------------------------------------------------------------------------------


def cmd_eval(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    from rotviz.data.splits import SPLITS

    if args.split not in SPLITS:
        raise RotvizError(f"unknown split '{args.split}': use one of {', '.join(SPLITS)}")
    from rotviz.outputs import Outputs, write_json_file

    outputs = Outputs("eval")
    guard_inputs(outputs, [args.model], args.data)
    js = outputs.add(args.json, "--json", folder=False, overwrite=args.overwrite)
    from rotviz.data.reading import split_for
    from rotviz.devices import pick_device
    from rotviz.evaluation import evaluate
    from rotviz.sources.plain_torch import load_for_eval

    columns, seq_len = reading(args, args.data)
    device = pick_device(args.device)
    loaded = load_for_eval(args.model, device)
    split = split_for(loaded, args.data, args.split, seq_len=seq_len, columns=columns)
    with _threads_for(loaded, device):
        # Text batches hold 64 tokens per window: smaller batches keep activations in cache.
        batch_size = args.batch_size or (64 if split.task == "text" else 512)
        metrics = evaluate(loaded, split, batch_size=batch_size)
    acc = metrics["acc"]
    extra = {k: v for k, v in metrics.items() if k not in ("loss", "acc", "n")}
    result = {
        "loss": metrics["loss"],
        "acc": None if math.isnan(acc) else acc,
        **extra,
        "n": metrics["n"],
        "task": split.task,
        "data": args.data,
        "split": args.split,
        "model": args.model,
        "device": str(device),
        "seconds": round(time.perf_counter() - start, 4),
    }
    unit = {"text": "windows", "masked": "windows", "image": "images",
            "token-cls": "sentences"}.get(split.task, "examples")
    piece = "character" if split.encoding == "chars" else "token"
    what = {"text": f"next-{piece} accuracy", "masked": f"masked-{piece} accuracy",
            "multi-label": "label accuracy"}.get(split.task, "accuracy")
    if js is not None:
        with outputs.write() as tmp:
            write_json_file(tmp[js], result, "eval")
    from rotviz.data.tasks import METRIC_LABELS

    shown = [f"loss {result['loss']:.4f}"]
    if result["acc"] is not None:
        shown.append(f"{what} {result['acc']:.4f}")
    shown += [f"{METRIC_LABELS.get(k, k)} {v:.4f}" for k, v in extra.items()]
    print(f"{args.model} on {args.data} ({args.split}, {result['n']} {unit}, {split.task}): "
          f"{', '.join(shown)} [{result['device']}, {result['seconds']:.2f} s]")
    return 0


SMALL_MODEL = 5_000_000  # parameters; below this one CPU thread is fastest


@contextmanager
def _threads_for(loaded, device) -> Iterator[None]:
    """One CPU thread for small models (scoped): their ops are too small to split, and on a
    busy machine OpenMP threads waiting for each other make evaluation several times slower."""
    from rotviz.devices import one_thread

    n = sum(p.numel() for p in loaded.model.parameters())
    if device.type != "cpu" or n >= SMALL_MODEL:
        yield
        return
    with one_thread():
        yield

"""What every `rotviz` sub-command shares: a parser whose errors are one line (exit 2),
option types that check their bounds at parse time (rotviz.limits), and output options.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable

from rotviz.errors import RotvizError
from rotviz.limits import Bound, layer_ranges


class Parser(argparse.ArgumentParser):
    """argparse, except that an error is one line on stderr (no usage block), exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        m = re.match(r"argument ([^:]+): (.*)", message, re.S)
        if m and any(name in m.group(2) for name in m.group(1).split("/")):
            message = m.group(2)  # the message already names the option
        one = " ".join(message.split())
        self.exit(2, f"rotviz: error: {one} (see {self.prog} --help)\n")


def bounded(bound: Bound) -> Callable[[str], int | float]:
    """An argparse type: the text parsed and checked against `bound`."""

    def parse(text: str) -> int | float:
        try:
            return bound.parse(text)
        except RotvizError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = bound.flag
    parse.bound = bound  # type: ignore[attr-defined]  # tests read the bound back
    return parse


def layers_text(text: str) -> str:
    """An argparse type for --layers: the syntax checked now, the range once the model is
    known (rotviz.match.options.parse_layers), never expanded before that."""
    try:
        layer_ranges(text)
    except RotvizError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def memory_text(text: str) -> int:
    """An argparse type for --max-memory: a size in bytes."""
    from rotviz.limits import memory_size

    try:
        return memory_size(text)
    except RotvizError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_max_memory(p: argparse.ArgumentParser, what: str, how: str, zero: str,
                   more: str = "") -> None:
    """--max-memory: the memory `what` may use; a pair needing more is `how`; 0 `zero`."""
    p.add_argument("--max-memory", type=memory_text, default=None, metavar="SIZE",
                   help=f"memory the {what} may use, e.g. 16GB: a pair that needs more in "
                        f"memory (about 4.5x its float32 bytes) is {how}; 0 {zero} (default: "
                        f"the memory available now){more}")


def beyond_memory(args) -> tuple[bool, int | None, int | None]:
    """Whether the pair (args.anchor, args.source) must run at size: it needs more than
    --max-memory in memory (default: what is available now), or --max-memory is 0. Returns
    that, the estimate and the limit. A pair without safetensors cannot run at size: never, and
    with --max-memory 0 a one-line error says why."""
    from rotviz.atsize.need import pair_bytes_in_memory
    from rotviz.memory import available_memory

    limit = args.max_memory if args.max_memory is not None else available_memory()
    need = pair_bytes_in_memory(args.anchor, args.source)
    if need is None:
        if args.max_memory == 0:
            from rotviz.atsize.blocks import open_streamed

            open_streamed(args.anchor), open_streamed(args.source)  # says why they cannot
        return False, need, limit
    return args.max_memory == 0 or (limit is not None and need > limit), need, limit


def add_overwrite(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="replace outputs that an earlier rotviz run wrote (a folder holding "
                        "rotviz-output.json and nothing else, a JSON file rotviz wrote); "
                        "anything else is never replaced")


def note(message: str) -> None:
    print(f"rotviz: {message}", file=sys.stderr)


# ---- how data is read --------------------------------------------------------------------------

COLUMN_FLAGS = (("--text-column", "text", "the text column (default text)"),
                ("--pair-column", "pair", "a second text column, for sentence pairs"),
                ("--label-column", "label", "the label column (default label)"),
                ("--words-column", "words", "token classification: the words (default tokens)"),
                ("--tags-column", "tags", "token classification: the tags (default ner_tags)"))


def add_reading(p: argparse.ArgumentParser) -> None:
    """--seq-len and the column names of labelled data (csv:, tsv:, jsonl:, hf:)."""
    from rotviz.limits import SEQ_LEN

    p.add_argument("--seq-len", type=bounded(SEQ_LEN), default=None,
                   help="text: tokens per window (default 64); labelled text: truncate "
                        "examples to this many tokens (default: the model's longest)")
    for flag, _, text in COLUMN_FLAGS:
        p.add_argument(flag, default=None, metavar="NAME", help=text)


def reading(args: argparse.Namespace, data: str | None):
    """The columns and sequence length the reading options give, checked against `data`."""
    from rotviz.data.labelled import LABELLED_KINDS, Columns
    from rotviz.data.split import TEXT_SOURCES

    kind = (data or "").partition(":")[0]
    given = {field: getattr(args, flag[2:].replace("-", "_"))
             for flag, field, _ in COLUMN_FLAGS}
    for flag, field, _ in COLUMN_FLAGS:
        value = given[field]
        if value is None:
            continue
        if not value.strip():
            raise RotvizError(f"{flag} is empty; name a column of the data")
        if kind not in LABELLED_KINDS:
            what = f"not to '{data}'" if data else "given with --data"
            raise RotvizError(f"{flag} applies to labelled data (csv:, tsv:, jsonl:, hf:) {what}")
    if args.seq_len is not None and kind not in (*TEXT_SOURCES, *LABELLED_KINDS):
        what = f"not to '{data}'" if data else "given with --data"
        raise RotvizError(f"--seq-len applies to text data {what}")
    cols = Columns(**{k: v for k, v in given.items() if v is not None})
    return cols, args.seq_len


def model_input(ref: str) -> str | None:
    """The folder a model reference reads (`zoo:NAME`, a path, or, for a name in the local
    Hugging Face cache, its whole repository folder there, blobs included)."""
    from rotviz.sources import hf_cache as hub
    from rotviz.zoo_registry import where

    cached = hub.cache_ref(ref)
    if cached is not None:
        try:
            return str(hub.repo_folder(cached.repo_id))
        except RotvizError:
            return None  # the loader says what is wrong with the name
    name = ref[4:] if ref.startswith("zoo:") else None
    if name is not None:
        return str(where(name)) if name and "/" not in name and name not in (".", "..") \
            else None
    return ref


def data_input(ref: str | None) -> str | None:
    """The file or folder a data reference reads (`KIND:PATH`); None for built-in data."""
    kind, sep, path = (ref or "").partition(":")
    return path if sep and path and kind.isalpha() and kind != "zoo" else None


def guard_inputs(outputs, models: list[str], data: str | None) -> None:
    """Record a command's model and data inputs in its `outputs` (rotviz.outputs), so that no
    output equals, holds or lies inside one of them, even with --overwrite. An unknown data
    name is refused here too, before any model or data is read (rotviz.data.split.check_ref)."""
    if data is not None:
        from rotviz.data.split import check_ref

        check_ref(data)
    for ref in models:
        outputs.reads(model_input(ref), "model")
    outputs.reads(data_input(data), "data")

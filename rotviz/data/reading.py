"""Data read the way a given model reads it: its task (from its head), its labelling (a
classifier's columns and labels), its tokenizer or image processor, and the checks that a
split fits it (task, vocabulary, lengths, label order) before anything is computed.
`split_for` is the one way to read a model's data; rotviz.evaluation evaluates on it.
"""

from __future__ import annotations

import torch

from rotviz.arch import max_positions
from rotviz.confine import ANYWHERE, Confined
from rotviz.data.labelled import LABELLED_KINDS, Columns, Labelling
from rotviz.data.split import IMAGE_FILES, TEXT_SOURCES, Split, load_split
from rotviz.data.tasks import (
    CLASSIFIER_TASKS,
    LM_HEADS,
    MASKED_HEADS,
    head_class,
    label_names,
    named_labels,
    task_of_config,
)
from rotviz.data.tokens import (
    CHARS,
    encoding_fingerprint,
    image_reading,
    processor_fingerprint,
    text_encoding,
)
from rotviz.errors import RotvizError
from rotviz.heads import SCORED_HEADS, WEIGHTS_ONLY, head_of_config
from rotviz.sources.adapters import source_of
from rotviz.sources.loading import Loaded
from rotviz.sources.running import (
    image_shape,
)

Tensor = torch.Tensor
LABELLED = "csv:, tsv:, jsonl:, conll: or hf:"


def head_of(loaded: Loaded) -> str:
    return head_class(loaded.config)


def is_masked_lm(loaded: Loaded) -> bool:
    return head_of(loaded).endswith(MASKED_HEADS)


def task_of(loaded: Loaded) -> str | None:
    """The task the model's head was trained for (rotviz.data.tasks); None for a bare text model."""
    return task_of_config(loaded.spec.inputs, loaded.config)


def labelling(loaded: Loaded, columns: Columns | None = None,
              seq_len: int | None = None, confined: Confined = ANYWHERE) -> Labelling:
    """What labelled data must say for this classifier (its task, labels, padding, length)."""
    task = task_of(loaded)
    if task not in CLASSIFIER_TASKS:
        raise RotvizError(
            f"{loaded.ref} ({head_of(loaded) or 'no head'}) is not a text classifier, so "
            f"labelled data ({LABELLED}) does not fit it; give text:FILE or pystdlib, or a "
            "...ForSequenceClassification / ...ForTokenClassification model")
    longest = max_positions(loaded.spec, loaded.config, 512)
    length = int(seq_len or longest)
    if length > longest:
        raise RotvizError(f"--seq-len {length} is longer than {loaded.ref} takes ({longest})")
    reader = text_encoding(loaded.path, loaded.config, loaded.ref, confined)
    pad = getattr(reader.tokenizer, "pad_token_id", None)
    if pad is None:
        pad = loaded.config.get("pad_token_id")
    if pad is None:
        raise RotvizError(
            f"{loaded.ref} has no padding token (neither its tokenizer nor its config's "
            "pad_token_id), which batches of texts of different lengths need; set "
            "pad_token_id in its config.json (a sequence classifier reads the last token "
            "before the padding)")
    return Labelling(task, label_names(loaded.config), int(pad), length, columns or Columns())


def split_for(loaded: Loaded, ref: str, split: str = "test", seed: int = 0,
              seq_len: int | None = None, columns: Columns | None = None,
              confined: Confined = ANYWHERE) -> Split:
    """One split of data `ref`, read the way `loaded` reads it: text through the model's own
    tokenizer (or rotviz's characters for a model that declares them), as masked-LM data for
    a masked LM, in windows of `seq_len` tokens; labelled rows (csv:, jsonl:, ...) for the
    model's classifier head, with `columns`; images as they are. One line when the model
    cannot be fed the data (first of all, a model whose head no loss scores). Every file
    (data, tokenizer, image processor) is read through `confined` (rotviz.confine; the app's
    confines reads to its roots)."""
    check_scored(loaded)
    kind = ref.partition(":")[0]
    if kind in LABELLED_KINDS:
        if loaded.spec.inputs == "pixels":
            raise RotvizError(f"'{ref}' is labelled text but {loaded.ref} is an image model")
        lab = labelling(loaded, columns, seq_len, confined)
        reader = text_encoding(loaded.path, loaded.config, loaded.ref, confined)
        return load_split(ref, split, seed, reader, labelling=lab, confined=confined)
    if loaded.spec.inputs == "pixels":
        proc = image_reading(loaded.path, confined) if loaded.path else None
        # class folders are read by name (other image data carries its labels as ids)
        names = named_labels(loaded.config, loaded.ref) if kind == "imagefolder" else None
        if proc is not None and kind in IMAGE_FILES:
            return load_split(ref, split, seed, processor=proc, names=names, confined=confined)
        return load_split(ref, split, seed, names=names, confined=confined)
    if kind not in TEXT_SOURCES:
        return load_split(ref, split, seed, confined=confined)
    task = task_of(loaded)
    if task in CLASSIFIER_TASKS:
        raise RotvizError(
            f"'{ref}' is plain text (language-model data) but {loaded.ref} is a {task} "
            f"model; give labelled data: {LABELLED}")
    reader = text_encoding(loaded.path, loaded.config, loaded.ref, confined)
    return load_split(ref, split, seed, None if reader.chars else reader,
                      is_masked_lm(loaded), seq_len, confined=confined)


def _reading(encoding: str) -> str:
    if encoding == CHARS:
        return "rotviz's character vocabulary"
    return f"another tokenizer ({encoding})" if encoding else "no vocabulary"


def check_scored(loaded: Loaded) -> None:
    """One line when no loss scores `loaded`'s head (headless, question answering, multiple
    choice, ...: rotviz.heads), before any data is read for it."""
    own = head_of_config(loaded.config)
    if not own.scored:
        raise RotvizError(
            f"{loaded.ref} ({own.class_name or 'no head class'}) has {own.words}, which no "
            f"loss scores: a measurement of the loss needs {SCORED_HEADS}; {WEIGHTS_ONLY} "
            "need no data")


def check_fits(loaded: Loaded, split: Split) -> None:
    """Data must fit the model's task: one clear line when it does not."""
    spec = loaded.spec
    check_scored(loaded)
    if spec.inputs == "pixels":
        if split.task != "image":
            raise RotvizError(
                f"'{split.data}' is {split.task} data but {loaded.ref} is an image model"
            )
        proc = processor_fingerprint(loaded.path) if loaded.path else ""
        if split.encoding != proc:
            how = "through another image processor" if split.encoding else "as they are"
            raise RotvizError(
                f"'{split.data}' images were read {how} but {loaded.ref} reads images through "
                f"{'its own image processor' if proc else 'no processor'}; load the data "
                "through the model (rotviz.data.reading.split_for), with imagefolder:DIR or "
                "cifar10:DIR for a model with a processor")
        c, size = image_shape(loaded)
        _, dc, dh, dw = split.inputs.shape
        if dc != c or dh != size or dw != size:
            raise RotvizError(
                f"'{split.data}' images are {dc}x{dh}x{dw}"
                f" but {loaded.ref} expects {c}x{size}x{size}"
            )
        n_out = source_of(spec).n_outputs(loaded.config)
        if n_out is not None and n_out != split.n_classes:
            raise RotvizError(
                f"'{split.data}' has {split.n_classes} classes"
                f" but {loaded.ref}'s head has {n_out} outputs"
            )
        check_label_order(loaded, split)
    else:
        task = task_of(loaded)
        if split.task == "image":
            raise RotvizError(f"'{split.data}' is image data but {loaded.ref} is a language model")
        want = encoding_fingerprint(loaded.path, loaded.config, loaded.ref)
        if split.encoding != want:
            own = "its own tokenizer" if want != CHARS else "rotviz's character vocabulary"
            raise RotvizError(
                f"'{split.data}' was read with {_reading(split.encoding)} but {loaded.ref} "
                f"reads text with {own}; load the data through the model "
                "(rotviz.data.reading.split_for), as the rotviz commands do"
            )
        head = head_of(loaded)
        if split.task in CLASSIFIER_TASKS or task in CLASSIFIER_TASKS:
            if split.task != task:
                raise RotvizError(
                    f"'{split.data}' was prepared as {split.task} data but {loaded.ref} "
                    f"({head}) is a {task or 'bare'} model; load the data through the model "
                    "(rotviz.data.reading.split_for), as the rotviz commands do")
            n_out = num_outputs(loaded)
            if split.n_classes != n_out:
                raise RotvizError(
                    f"'{split.data}' has {split.n_classes} labels but {loaded.ref}'s head "
                    f"has {n_out} outputs")
        elif split.labels.dim() > 1 and not head.endswith(LM_HEADS):
            raise RotvizError(
                f"'{split.data}' labels every token but {loaded.ref} ({head or 'no head'}) "
                "has no language-model head: give a ...LMHeadModel, ...ForCausalLM, "
                "...ForMaskedLM or BertForPreTraining"
            )
        if head.endswith(LM_HEADS) and (split.task == "masked") != is_masked_lm(loaded):
            want_task = "masked-LM" if is_masked_lm(loaded) else "next-token"
            raise RotvizError(
                f"'{split.data}' was prepared as {split.task} data but {loaded.ref} ({head}) "
                f"needs {want_task} data; load the data through the model "
                "(rotviz.data.reading.split_for), as the rotviz commands do"
            )
        vocab = int(loaded.config.get("vocab_size", 0))
        if split.task in CLASSIFIER_TASKS:
            if vocab and split.n and int(split.inputs.max()) >= vocab:
                raise RotvizError(f"'{split.data}' holds token ids beyond {loaded.ref}'s "
                                  f"vocabulary of {vocab}; save the model's own tokenizer")
        elif vocab and split.n_classes > vocab:
            raise RotvizError(
                f"'{split.data}' has {split.n_classes} symbols"
                f" but {loaded.ref}'s vocabulary has {vocab}"
            )
        max_pos = max_positions(spec, loaded.config, 0)
        length = int(split.inputs.shape[1]) if split.inputs.dim() > 1 else 0
        if max_pos > 0 and length > max_pos:
            raise RotvizError(
                f"'{split.data}' sequences have {length} tokens"
                f" but {loaded.ref} takes at most {max_pos}"
            )


def check_label_order(loaded: Loaded, split: Split) -> None:
    """Classes read by name (an image folder's classes) must be in the model's own order: a
    pair read through one model's names feeds the other wrong labels when it names its
    outputs in another order (the split has the anchor's ids). One line when they differ."""
    if not split.data.startswith("imagefolder:"):
        return
    own = named_labels(loaded.config, loaded.ref)
    if own is None or split.label_names == own:
        return
    shown = ", ".join(split.label_names[:6]) + (", ..." if len(split.label_names) > 6 else "")
    raise RotvizError(
        f"'{split.data}' was labelled in the order {shown} but {loaded.ref} names its outputs "
        f"{', '.join(own[:6])}{', ...' if len(own) > 6 else ''}; compare models whose "
        "config.json id2label are the same, or read the data through this model")


def num_outputs(loaded: Loaded) -> int:
    return int(source_of(loaded.spec).n_outputs(loaded.config) or 0)

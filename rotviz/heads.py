"""What a model's head is, read off its class, and what that head allows.

One body (the embeddings and the blocks, where every symmetry acts) is saved under many
heads: transformers offers a headless `...Model` (feature extraction, sentence embeddings),
language-model heads, `...ForPreTraining` (BERT's masked-LM and next-sentence heads: the
MultiBERTs checkpoints), classifiers of sequences, tokens and images, question answering and
multiple choice. Matching and every weights-only view (distances, spectra, the Hessian-free
views) work on the body whatever the head; the function check compares every output the
model has; a measurement that needs a loss needs a head rotviz can score (rotviz.data.tasks), and
says in one line which heads those are when the model has none.

The model's outputs are read here too (`outputs_of`): the one a loss is computed on
(`primary`) and all of them, side by side, for the function check (`side_by_side`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

Tensor = torch.Tensor

# (class-name suffix, head kind), the first match wins (LMHeadModel before Model)
_SUFFIXES = (
    ("ElectraForPreTraining", "discriminator"),  # one logit per token, not BERT's heads
    ("ForPreTraining", "pretraining"),
    ("ForMaskedLM", "masked-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForCausalLM", "causal-lm"),
    ("ForSequenceClassification", "seq-cls"),
    ("ForTokenClassification", "token-cls"),
    ("ForQuestionAnswering", "qa"),
    ("ForMultipleChoice", "multiple-choice"),
    ("ForNextSentencePrediction", "next-sentence"),
    ("ForImageClassification", "image-cls"),
    ("ForMaskedImageModeling", "masked-image"),
    ("Model", "none"),
)

# What each kind of head is, in plain words, and which loss rotviz scores it with (None: none)
KINDS: Mapping[str, tuple[str, str | None]] = {
    "none": ("no head (it outputs the body's last hidden state, and its pooler's)", None),
    "causal-lm": ("a next-token language-model head", "text"),
    "masked-lm": ("a masked-language-model head", "masked"),
    "pretraining": ("pre-training heads: masked LM and next sentence (MultiBERTs)", "masked"),
    "seq-cls": ("a sequence classifier", "seq-cls"),
    "token-cls": ("a token classifier", "token-cls"),
    "qa": ("a question-answering head (answer start and end)", None),
    "discriminator": ("a replaced-token discriminator (ELECTRA: one logit per token)", None),
    "multiple-choice": ("a multiple-choice head", None),
    "next-sentence": ("a next-sentence-prediction head", None),
    "image-cls": ("an image classifier", "image"),
    "masked-image": ("a masked-image-modeling head (pixel reconstruction)", None),
    "other": ("a head rotviz does not know", None),
}

# The data each task's loss is measured on, in words (rotviz.data.tasks' tasks)
DATA_OF_TASK: Mapping[str, str] = {
    "text": "text", "masked": "text, some tokens masked", "seq-cls": "labelled text",
    "multi-label": "labelled text", "regression": "labelled text", "token-cls": "tagged text",
    "image": "images"}

# Loss-free measurements: they read the weights (and the function check its own probes)
WEIGHTS_ONLY = "matching, distances, spectra and the other views of the weights"
# What a loss measurement needs, said when a model has no head it can score
SCORED_HEADS = ("a ...ForCausalLM / ...LMHeadModel, ...ForMaskedLM, BertForPreTraining, "
                "...ForSequenceClassification, ...ForTokenClassification or "
                "...ForImageClassification model")

# Output fields that are not the model's answer (the loss, caches, per-layer traces)
_NOT_OUTPUTS = ("loss", "past_key_values", "hidden_states", "attentions", "cross_attentions",
                "mems")


@dataclass(frozen=True)
class Head:
    """A model's head: its class name (config `architectures`, empty for a timm model or a
    config that names none), its kind (a key of KINDS) and the rotviz task its loss is
    scored as (rotviz.data.tasks; None where no loss fits it)."""

    class_name: str
    kind: str

    @property
    def task(self) -> str | None:
        return KINDS[self.kind][1]

    @property
    def words(self) -> str:
        return KINDS[self.kind][0]

    @property
    def scored(self) -> bool:
        """Whether a loss can be computed on this head (barriers, planes, merges, ...)."""
        return self.task is not None

    def allows(self) -> str:
        """What a model with this head can be given to, in one sentence."""
        if self.kind == "pretraining":
            return (f"{WEIGHTS_ONLY}; losses are its masked-LM head's, on text data (the "
                    "next-sentence head is kept by matching and checked, not scored)")
        if self.scored:
            return f"{WEIGHTS_ONLY}, and every loss measurement on {DATA_OF_TASK[self.task]}"
        return (f"{WEIGHTS_ONLY} (the function check compares its outputs); loss "
                f"measurements need {SCORED_HEADS}")

    @property
    def exposes_stream(self) -> bool:
        """Whether the model outputs its residual stream itself: a headless model's last
        hidden state, or what a head rotviz cannot map reads (a masked-image model's pixel
        decoder, an unknown head). A residual map changes such an output, so it is no
        symmetry of this model."""
        return self.kind in ("none", "masked-image", "other")

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.class_name, "kind": self.kind, "task": self.task,
                "head": self.words, "allows": self.allows()}


def head_of_config(config: Mapping) -> Head:
    """The head of a model of `config` (config.json): from `architectures` (transformers),
    or for a timm model (`architecture`) from its number of classes (0: headless)."""
    names = config.get("architectures")
    name = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else ""
    if not name and isinstance(config.get("architecture"), str):  # timm
        args = config.get("model_args") or {}
        classes = config.get("num_classes", args.get("num_classes", 1000))
        return Head("", "image-cls" if classes else "none")
    if not name:  # transformers builds the AutoModel class: headless
        return Head("", "none")
    for suffix, kind in _SUFFIXES:
        if name.endswith(suffix):
            return Head(name, kind)
    return Head(name, "other")


def check_head(config: Mapping, where: object) -> None:
    """One line where config.json describes a head its class cannot run: a question-answering
    head has exactly two outputs (the answer's start and end), whatever `num_labels` says,
    and transformers' forward fails on any other number."""
    from rotviz.errors import RotvizError

    if head_of_config(config).kind != "qa":
        return
    labels = config.get("id2label")
    n = len(labels) if isinstance(labels, Mapping) and labels else config.get("num_labels", 2)
    if n != 2:
        raise RotvizError(f"'{where}' is a question-answering model with {n} labels in its "
                          "config.json, but its head has two outputs (answer start and end); "
                          "save it with num_labels 2")


def residual_refusal(config: Mapping) -> str | None:
    """Why residual maps cannot be used on a model of `config` for its head (`Head.
    exposes_stream`), in words that follow "residual matching is unavailable for X: "; None
    when its head reads the stream through layers rotviz maps."""
    head = head_of_config(config)
    if not head.exposes_stream:
        return None
    what = ("its output is the residual stream itself (the last hidden state)"
            if head.kind == "none" else f"it has {head.words}, which reads the stream")
    return f"{what}, which a residual map would change; match without residual (e.g. seed)"


def choices(config: Mapping) -> int:
    """Choices per example a multiple-choice model's inputs carry (its inputs are
    (batch, choices, length)); 0 for every other head."""
    return 2 if head_of_config(config).kind == "multiple-choice" else 0


# ---- reading what a model outputs ----------------------------------------------------------


def outputs_of(out: Any) -> dict[str, Tensor]:
    """The answer tensors of a model's output (a tensor: timm's logits; a transformers
    ModelOutput: its logits, start and end logits, prediction and next-sentence logits,
    reconstruction, last hidden state and pooler output, whichever it has), by name."""
    if isinstance(out, Tensor):
        return {"logits": out}
    items = out.items() if hasattr(out, "items") else enumerate(out)
    return {str(k): v for k, v in items if isinstance(v, Tensor) and k not in _NOT_OUTPUTS}


def primary(outputs: Mapping[str, Tensor]) -> Tensor:
    """The output a loss is computed on: the logits; question answering's start and end
    logits stacked on a last axis; a pre-training model's masked-LM logits; a masked-image
    model's reconstruction; a headless model's last hidden state."""
    if "logits" in outputs:
        return outputs["logits"]
    if "start_logits" in outputs and "end_logits" in outputs:
        return torch.stack([outputs["start_logits"], outputs["end_logits"]], dim=-1)
    for name in ("prediction_logits", "reconstruction", "last_hidden_state"):
        if name in outputs:
            return outputs[name]
    return next(iter(outputs.values()))


def side_by_side(outputs: Mapping[str, Tensor]) -> Tensor:
    """Every output of each example flattened into one row (batch, all values): what the
    function check compares, so that no head of a model goes unchecked."""
    parts = list(outputs.values())
    if len(parts) == 1:
        return parts[0]
    n = parts[0].shape[0]
    return torch.cat([p.reshape(n, -1).to(parts[0].dtype) for p in parts], dim=1)

"""Recipes: a tiny model configuration plus the hyperparameters of its seeded training run.

A recipe is plain data. `rotviz.zoo.train.train` runs it deterministically on the CPU and
`rotviz.zoo_registry` names the trained results. Fine-tune recipes start from another zoo model
(`init`) and train on a part of the training split (`subset`), the seed paper's setting.

The NLP recipes (family "roberta") name their head in the model's `architectures` (masked
LM, sequence or token classification; the task and its loss follow from it, see
rotviz.data.tasks) and the `tokenizer` folder their text is read with (rotviz.zoo.nlp's data).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from rotviz.errors import RotvizError
from rotviz.zoo import nlp

SUBSETS = ("all", "even", "odd")  # which training examples: all, or alternate halves


@dataclass(frozen=True)
class Recipe:
    name: str
    family: str  # "vit" (image classifier), "gpt2" (character LM) or "roberta" (text encoder)
    data: str  # data reference, see rotviz.data
    model: dict = field(default_factory=dict)  # fields of the transformers config
    epochs: int = 40
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 2.0  # linear warm-up, then cosine decay to zero
    # "cosine" (warm-up + cosine decay) or "constant" (docs/conventions.md: the learning
    # rate never changes; its independent seeds land in basins that matching visibly joins)
    schedule: str = "cosine"
    grad_clip: float | None = None
    subset: str = "all"
    init: str | None = None  # zoo model to start from (fine-tunes)
    description: str = ""
    tokenizer: str | None = None  # tokenizer folder of a text model (rotviz.zoo.nlp.TOKENIZER)
    # "adamw" (decoupled weight decay) or "sgd": plain SGD, no momentum, weight decay as L2
    # (the short series whose conserved quantities stay put: docs/landscape.md, "conserved")
    optimizer: str = "adamw"
    # a deeper model grown from `init` before training (rotviz.analysis.depths.grown): the
    # slot of each of init's blocks; every other slot starts as a copy of the block before
    # it with its output projections zeroed (the identity), so training starts from init's
    # function. None: init's own depth
    grow: tuple[int, ...] | None = None

    def to_dict(self) -> dict:
        """The recipe as its card records it (without `tokenizer` where it has none, so
        the cards of the recipes older than the field read the same)."""
        out = asdict(self)
        if out["tokenizer"] is None:
            del out["tokenizer"]
        if out["optimizer"] == "adamw":  # likewise the cards older than the optimizer field
            del out["optimizer"]
        if out["grow"] is None:  # and those older than the grow field
            del out["grow"]
        else:
            out["grow"] = list(out["grow"])  # as JSON reads it back
        return out

    @property
    def head(self) -> str:
        """The model class (transformers) the recipe trains."""
        if self.family in _HEADS:
            return _HEADS[self.family]
        archs = self.model.get("architectures") or [""]
        if self.family == "roberta" and archs[0] in ROBERTA_HEADS:
            return archs[0]
        raise RotvizError(f"recipe '{self.name}' names no model class rotviz trains: "
                          f"use one of {', '.join(ROBERTA_HEADS)} in its architectures")

    @property
    def task(self) -> str:
        """The task the recipe trains for (rotviz.data.tasks): image, text, masked, seq-cls, ..."""
        from rotviz.data.tasks import task_of_config

        inputs = "pixels" if self.family == "vit" else "tokens"
        return task_of_config(inputs, {**self.model, "architectures": [self.head]}) or "text"

    def hf_config(self):
        """The transformers config of the recipe's model."""
        import transformers as T

        if self.family == "vit":
            return T.ViTConfig(**self.model, architectures=["ViTForImageClassification"])
        if self.family == "gpt2":
            return T.GPT2Config(**self.model, architectures=["GPT2LMHeadModel"])
        if self.family == "roberta":
            return T.RobertaConfig(**{**self.model, "architectures": [self.head]})
        raise RotvizError(f"recipe '{self.name}' has unknown family '{self.family}'")

    def build_model(self):
        """A freshly initialised model (seed it from the caller's RNG state)."""
        import transformers as T

        if self.family == "roberta":
            return getattr(T, self.head)(self.hf_config())
        cls = {"vit": T.ViTForImageClassification, "gpt2": T.GPT2LMHeadModel}[self.family]
        return cls(self.hf_config())


_HEADS = {"vit": "ViTForImageClassification", "gpt2": "GPT2LMHeadModel"}
ROBERTA_HEADS = ("RobertaForMaskedLM", "RobertaForSequenceClassification",
                 "RobertaForTokenClassification")


_VIT_DIGITS = dict(
    image_size=8, patch_size=2, num_channels=1, num_labels=10, hidden_size=64,
    num_hidden_layers=4, num_attention_heads=4, intermediate_size=128, hidden_act="gelu",
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)

_GPT2_PYSTDLIB = dict(
    vocab_size=98, n_positions=64, n_embd=128, n_layer=4, n_head=4, n_inner=512,
    activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    bos_token_id=0, eos_token_id=0, tie_word_embeddings=True,
    rotviz_vocab="chars",  # reads rotviz's character vocabulary (rotviz.data.tokens)
)

# The seed paper's NLP setting, small: a RoBERTa encoder (d 64, 4 layers, 4 heads, FFN 128,
# 64 tokens; position ids count from pad_token_id + 1, hence 66 rows) reading the zoo's
# WordPiece tokenizer (rotviz.zoo.nlp), no dropout.
_ROBERTA = dict(
    vocab_size=nlp.VOCAB_SIZE, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
    intermediate_size=128, hidden_act="gelu", max_position_embeddings=nlp.MAX_TOKENS + 2,
    type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)


def _labels(names: tuple[str, ...]) -> dict:
    """id2label / label2id as config.json stores them (string ids: the card compares equal)."""
    return {"id2label": {str(i): n for i, n in enumerate(names)},
            "label2id": {n: i for i, n in enumerate(names)}}


_MLM = dict(_ROBERTA, architectures=["RobertaForMaskedLM"])
_TOPICS = dict(_ROBERTA, architectures=["RobertaForSequenceClassification"],
               **_labels(tuple(nlp.TOPICS)))
_PYTOKENS = dict(_ROBERTA, architectures=["RobertaForTokenClassification"],
                 **_labels(nlp.TAGS))
_NLP = dict(family="roberta", tokenizer=nlp.TOKENIZER)


def _fine_tune(name: str, data: str, model: dict, subset: str, init: str, what: str) -> Recipe:
    """One fine-tune of a pretrained encoder on one half of a task's training split."""
    return Recipe(
        name, data=data, model=model, epochs=8, batch_size=32, lr=3e-3, weight_decay=0.01,
        warmup_epochs=0.5, grad_clip=1.0, subset=subset, init=init,
        description=f"{init} fine-tuned for {what} on the {subset} half of the training "
                    "split, 8 epochs AdamW, lr 3e-3, batch 32", **_NLP)


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "vit-digits", "vit", "digits", _VIT_DIGITS, epochs=40, batch_size=64, lr=2e-3,
            weight_decay=0.05, warmup_epochs=0.0, schedule="constant",
            description="HF ViT (patch 2, d 64, 4 layers, 4 heads, FFN 128, GELU) on 8x8 digits, "
                        "40 epochs AdamW at a constant learning rate, no warm-up",
        ),
        Recipe(
            "vit-digits-base", "vit", "digits", _VIT_DIGITS, epochs=15, batch_size=64, lr=2e-3,
            weight_decay=0.05, warmup_epochs=2.0,
            description="the shared base of the fine-tuned pair: vit-digits trained 15 epochs",
        ),
        Recipe(
            "vit-digits-ft-even", "vit", "digits", _VIT_DIGITS, epochs=15, batch_size=32, lr=5e-4,
            weight_decay=0.05, warmup_epochs=1.0, subset="even", init="vit-digits-base",
            description="fine-tune of vit-digits-base on the even-numbered half of the training "
                        "split, lr 5e-4, batch 32",
        ),
        Recipe(
            "vit-digits-ft-odd", "vit", "digits", _VIT_DIGITS, epochs=15, batch_size=64, lr=1e-3,
            weight_decay=0.1, warmup_epochs=1.0, subset="odd", init="vit-digits-base",
            description="fine-tune of vit-digits-base on the odd-numbered half of the training "
                        "split, lr 1e-3, batch 64, weight decay 0.1",
        ),
        # The lineages: each default-pair seed as a pretrained base, fine-tuned briefly on one
        # half of the training split (57 steps: a rebuild takes seconds), so each fine-tune
        # stays in its base's basin (the lineage experiment, docs/symmetries.md).
        Recipe(
            "vit-digits-lineage-even", "vit", "digits", _VIT_DIGITS, epochs=3, batch_size=32,
            lr=1e-3, weight_decay=0.05, warmup_epochs=0.5, subset="even", init="vit-digits-s3",
            description="fine-tune of vit-digits-s3 on the even-numbered half of the training "
                        "split, 3 epochs AdamW, lr 1e-3, batch 32",
        ),
        Recipe(
            "vit-digits-lineage-odd", "vit", "digits", _VIT_DIGITS, epochs=3, batch_size=32,
            lr=1e-3, weight_decay=0.05, warmup_epochs=0.5, subset="odd", init="vit-digits-s6",
            description="fine-tune of vit-digits-s6 on the odd-numbered half of the training "
                        "split, 3 epochs AdamW, lr 1e-3, batch 32",
        ),
        Recipe(
            "vit-digits-spawn", "vit", "digits", _VIT_DIGITS, epochs=16, batch_size=64, lr=2e-3,
            weight_decay=0.05, warmup_epochs=1.0,
            description="the spawn series' run: vit-digits for 16 epochs (304 steps), one "
                        "epoch of warm-up then cosine decay, AdamW, lr 2e-3, batch 64",
        ),
        # The conserved quantities' contrast (docs/landscape.md, "conserved"): the spawn
        # run's model from its step 64, 200 steps of plain SGD (no momentum) without weight
        # decay, so that every symmetry's quantity stays put (the AdamW runs' drift away)
        Recipe(
            "vit-digits-sgd", "vit", "digits", _VIT_DIGITS, epochs=11, batch_size=64, lr=0.03,
            weight_decay=0.0, warmup_epochs=0.0, schedule="constant", optimizer="sgd",
            description="vit-digits-spawn's model trained on from run a's step 64 for 200 "
                        "steps by plain SGD (no momentum), lr 0.03, batch 64, no weight "
                        "decay, constant rate",
        ),
        # The depths pair's deeper model (docs/merging.md, "depths"): vit-digits-s6 grown
        # from 4 blocks to 6 (new blocks at slots 2 and 4, copies of the block before with
        # their output projections zeroed), then trained 5 epochs on the whole training
        # split (95 steps: a rebuild takes seconds), so its new blocks learn.
        Recipe(
            "vit-digits-deep", "vit", "digits", dict(_VIT_DIGITS, num_hidden_layers=6),
            epochs=5, batch_size=64, lr=1e-3, weight_decay=0.05, warmup_epochs=0.5,
            init="vit-digits-s6", grow=(0, 1, 3, 5),
            description="vit-digits-s6 grown to 6 blocks (identity blocks, copies of the "
                        "block before with zeroed output projections, at slots 2 and 4), "
                        "then trained 5 epochs AdamW, lr 1e-3, batch 64",
        ),
        Recipe(
            "gpt2-pystdlib", "gpt2", "pystdlib", _GPT2_PYSTDLIB, epochs=6, batch_size=32, lr=2e-3,
            weight_decay=0.05, warmup_epochs=0.5, grad_clip=1.0,
            description="GPT-2 character LM (d 128, 4 layers, 4 heads, FFN 512, context 64) on "
                        "the pystdlib corpus",
        ),
        # lr 3e-3 for 7 or 14 epochs left the MLM at the unigram loss (validation 5.95 and
        # 5.84 against the unigram's 5.94): it had learned token frequencies, not context;
        # 24 epochs at 2e-3 (or 1e-3) reach 5.59 (5.63).
        Recipe(
            "roberta-pydocs", data=f"text:{nlp.CORPUS}", model=_MLM, epochs=24, batch_size=16,
            lr=2e-3, weight_decay=0.01, warmup_epochs=0.5, grad_clip=1.0,
            description="RoBERTa masked LM (d 64, 4 layers, 4 heads, FFN 128, 64 tokens, "
                        "WordPiece vocabulary of 2000) on the standard library's docstrings, "
                        "24 epochs AdamW, lr 2e-3, batch 16, 15% of the tokens masked afresh "
                        "in every batch (80% <mask>, 10% random, 10% kept)", **_NLP,
        ),
        _fine_tune("roberta-topics-even", f"jsonl:{nlp.TOPICS_FILE}", _TOPICS, "even",
                   "roberta-pydocs-s0", "docstring topics (sequence classification)"),
        _fine_tune("roberta-topics-odd", f"jsonl:{nlp.TOPICS_FILE}", _TOPICS, "odd",
                   "roberta-pydocs-s1", "docstring topics (sequence classification)"),
        _fine_tune("roberta-pytokens-even", f"jsonl:{nlp.TOKENS_FILE}", _PYTOKENS, "even",
                   "roberta-pydocs-s0", "code token types (token classification)"),
        _fine_tune("roberta-pytokens-odd", f"jsonl:{nlp.TOKENS_FILE}", _PYTOKENS, "odd",
                   "roberta-pydocs-s1", "code token types (token classification)"),
    )
}


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise RotvizError(f"unknown recipe '{name}': use one of {', '.join(RECIPES)}")
    return RECIPES[name]

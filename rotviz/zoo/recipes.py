"""Recipes: a tiny model configuration plus the hyperparameters of its seeded training run.

A recipe is plain data. `rotviz.zoo.train.train` runs it deterministically on the CPU and
`rotviz.zoo` names the trained results. Fine-tune recipes start from another zoo model
(`init`) and train on a part of the training split (`subset`), the seed paper's setting.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from rotviz.errors import RotvizError

SUBSETS = ("all", "even", "odd")  # which training examples: all, or alternate halves


@dataclass(frozen=True)
class Recipe:
    name: str
    family: str  # "vit" (image classifier) or "gpt2" (character language model)
    data: str  # data reference, see rotviz.data
    model: dict = field(default_factory=dict)  # fields of the transformers config
    epochs: int = 40
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 2.0  # linear warm-up, then cosine decay to zero
    # "cosine" (warm-up + cosine decay) or "constant" (REFERENCE.md's recipe: the learning
    # rate never changes; its independent seeds land in basins that matching visibly joins)
    schedule: str = "cosine"
    grad_clip: float | None = None
    subset: str = "all"
    init: str | None = None  # zoo model to start from (fine-tunes)
    description: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def hf_config(self):
        """The transformers config of the recipe's model."""
        import transformers as T

        if self.family == "vit":
            return T.ViTConfig(**self.model, architectures=["ViTForImageClassification"])
        if self.family == "gpt2":
            return T.GPT2Config(**self.model, architectures=["GPT2LMHeadModel"])
        raise RotvizError(f"recipe '{self.name}' has unknown family '{self.family}'")

    def build_model(self):
        """A freshly initialised model (seed it from the caller's RNG state)."""
        import transformers as T

        cls = {"vit": T.ViTForImageClassification, "gpt2": T.GPT2LMHeadModel}[self.family]
        return cls(self.hf_config())


_VIT_DIGITS = dict(
    image_size=8, patch_size=2, num_channels=1, num_labels=10, hidden_size=64,
    num_hidden_layers=4, num_attention_heads=4, intermediate_size=128, hidden_act="gelu",
    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)

_GPT2_PYSTDLIB = dict(
    vocab_size=98, n_positions=64, n_embd=128, n_layer=4, n_head=4, n_inner=512,
    activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    bos_token_id=0, eos_token_id=0, tie_word_embeddings=True,
    rotviz_vocab="chars",  # reads rotviz's character vocabulary (rotviz.tokens)
)

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "vit-digits", "vit", "digits", _VIT_DIGITS, epochs=40, batch_size=64, lr=2e-3,
            weight_decay=0.05, warmup_epochs=0.0, schedule="constant",
            description="HF ViT (patch 2, d 64, 4 layers, 4 heads, FFN 128, GELU) on 8x8 digits, "
                        "40 epochs AdamW at a constant learning rate (REFERENCE.md's recipe)",
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
        Recipe(
            "gpt2-pystdlib", "gpt2", "pystdlib", _GPT2_PYSTDLIB, epochs=6, batch_size=32, lr=2e-3,
            weight_decay=0.05, warmup_epochs=0.5, grad_clip=1.0,
            description="GPT-2 character LM (d 128, 4 layers, 4 heads, FFN 512, context 64) on "
                        "the pystdlib corpus",
        ),
    )
}


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise RotvizError(f"unknown recipe '{name}': use one of {', '.join(RECIPES)}")
    return RECIPES[name]

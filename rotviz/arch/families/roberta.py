"""Hugging Face RoBERTa: BERT's blocks under other names, position ids from pad_token_id + 1."""

from __future__ import annotations

from dataclasses import replace

from rotviz.arch.families import bert
from rotviz.arch.spec import Sizes

ORDER = 2
# random_config options of a variant whose output head is its own: none (the MLM decoder
# is tied to the embeddings, which residual maps refuse)
UNTIED: dict | None = None

SPEC = replace(
    bert.SPEC,
    family="roberta",
    description="Hugging Face RoBERTa (post-norm encoder, split QKV)",
    model_types=("roberta",),
    roots=("roberta.", ""),
    # a sequence classifier's `classifier.dense` reads the first token; a token classifier's
    # `classifier` reads every position (a model with a pooler feeds it that instead)
    readers=("roberta.pooler.dense", "pooler.dense", "lm_head.dense", "classifier.dense",
             "qa_outputs"),
    readers_unless=(("classifier", ("roberta.pooler.dense", "pooler.dense")),),
    tied=(
        ("lm_head.decoder.weight", "roberta.embeddings.word_embeddings.weight"),
        ("lm_head.decoder.bias", "lm_head.bias"),
    ),
    positions_after=("pad_token_id", 1),
)


def random_config(s: Sizes, *, positions: int = 32) -> dict:
    """A RobertaForMaskedLM taking `positions` tokens (its table holds two rows more: position
    ids count from pad_token_id + 1)."""
    import transformers as T

    return T.RobertaConfig(
        vocab_size=s.vocab,
        max_position_embeddings=positions + 2,  # counted from pad_token_id + 1
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        architectures=["RobertaForMaskedLM"],
        **bert.blocks(s),
    ).to_dict()

"""Hugging Face ELECTRA: BERT's post-LayerNorm blocks, with embeddings of their own size.
Where embedding_size != hidden_size the word, position and token-type tables and their
LayerNorm live in that smaller space and `embeddings_project` (a linear, E -> d) writes them
into the stream: it is then the stream's only writer (`embed_project`), its rows are permuted
with the stream and the tables are left alone; the generator's tied decoder reads that space
too, so it constrains no stream map. Where the sizes are equal the tables and their norm sit
on the stream as BERT's. The group is BERT's: per-layer maps and stream permutations."""

from __future__ import annotations

from rotviz.arch.families import bert
from rotviz.arch.spec import ArchSpec, LinearSpec, NormSpec, Sizes

ORDER = 22
# random_config options of a variant whose output head is its own: the default's
# (a sequence classifier)
UNTIED: dict | None = {}

SPEC = ArchSpec(
    family="electra",
    description="Hugging Face ELECTRA (post-norm encoder, split QKV, embeddings projected "
    "into the stream when smaller)",
    source="hf",
    model_types=("electra",),
    inputs="tokens",
    n_layers_key=("num_hidden_layers",),
    d_model_key=("hidden_size",),
    n_heads_key=("num_attention_heads",),
    activation_key=("hidden_act",),
    default_activation="gelu",
    roots=("electra.", ""),
    block=("encoder.layer.{i}.",),
    qkv=None,
    q=LinearSpec(("attention.self.query",)),
    k=LinearSpec(("attention.self.key",)),
    v=LinearSpec(("attention.self.value",)),
    o=LinearSpec(("attention.output.dense",)),
    ffn_in=LinearSpec(("intermediate.dense",)),
    ffn_out=LinearSpec(("output.dense",)),
    norms=(
        NormSpec(("attention.output.LayerNorm",), "attn_out"),
        NormSpec(("output.LayerNorm",), "ffn_out"),
    ),
    placement="post",
    final_norm=(),
    writers=(
        "embeddings.word_embeddings",
        "embeddings.position_embeddings",
        "embeddings.token_type_embeddings",
        "embeddings_project",
    ),
    stream_norms=("embeddings.LayerNorm",),
    projections=("embeddings_project",),
    embed_project=("embeddings_project",),
    # the discriminator and generator heads, a sequence classifier's classifier.dense and a
    # multiple-choice summary read the stream (first token); qa_outputs and a token
    # classifier's classifier read every position (a multiple-choice classifier reads the
    # summary's output instead)
    readers=("discriminator_predictions.dense", "generator_predictions.dense",
             "classifier.dense", "sequence_summary.summary", "qa_outputs"),
    readers_unless=(("classifier", ("sequence_summary.summary",)),),
    tied=(("generator_lm_head.weight", "electra.embeddings.word_embeddings.weight"),),
)


def random_config(s: Sizes, *, embedding: int | None = None, discriminator: bool = False,
                  lm: bool = False, positions: int = 32) -> dict:
    """An ElectraForSequenceClassification (with `discriminator` ElectraForPreTraining, its
    replaced-token detector; with `lm` the generator, ElectraForMaskedLM, whose decoder is
    tied to the embeddings) with embeddings of size `embedding` (default d / 2: projected
    into the stream, as every ELECTRA generator's and ELECTRA-small's are), `positions`
    tokens of context."""
    import transformers as T

    cls = ("ElectraForMaskedLM" if lm else "ElectraForPreTraining" if discriminator
           else "ElectraForSequenceClassification")
    head = {} if lm or discriminator else dict(num_labels=s.labels)
    return T.ElectraConfig(
        vocab_size=s.vocab, embedding_size=embedding or s.d // 2,
        max_position_embeddings=positions, architectures=[cls], **head, **bert.blocks(s),
    ).to_dict()

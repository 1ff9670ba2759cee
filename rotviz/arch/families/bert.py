"""Hugging Face BERT: post-norm encoder, split QKV. RoBERTa (roberta.py) shares its blocks."""

from __future__ import annotations

from rotviz.arch.spec import ArchSpec, LinearSpec, NormSpec, Sizes

ORDER = 1
# random_config options of a variant whose output head is its own: the default's
# (a sequence classifier; the LM head with lm=True is tied)
UNTIED: dict | None = {}

SPEC = ArchSpec(
    family="bert",
    description="Hugging Face BERT (post-norm encoder, split QKV)",
    source="hf",
    model_types=("bert",),
    inputs="tokens",
    n_layers_key=("num_hidden_layers",),
    d_model_key=("hidden_size",),
    n_heads_key=("num_attention_heads",),
    activation_key=("hidden_act",),
    default_activation="gelu",
    roots=("bert.", ""),
    block=("encoder.layer.{i}.", "layers.{i}."),
    qkv=None,
    q=LinearSpec(("attention.self.query", "attention.q_proj", "attention.self.q_proj")),
    k=LinearSpec(("attention.self.key", "attention.k_proj", "attention.self.k_proj")),
    v=LinearSpec(("attention.self.value", "attention.v_proj", "attention.self.v_proj")),
    o=LinearSpec(("attention.output.dense", "attention.o_proj")),
    ffn_in=LinearSpec(("intermediate.dense", "mlp.fc1")),
    ffn_out=LinearSpec(("output.dense", "mlp.fc2")),
    norms=(
        NormSpec(("attention.output.LayerNorm", "attention_norm"), "attn_out"),
        NormSpec(("output.LayerNorm", "output_norm"), "ffn_out"),
    ),
    placement="post",
    final_norm=(),
    writers=(
        "embeddings.word_embeddings",
        "embeddings.position_embeddings",
        "embeddings.token_type_embeddings",
    ),
    stream_norms=("embeddings.LayerNorm",),
    readers=("bert.pooler.dense", "pooler.dense", "cls.predictions.transform.dense",
             "qa_outputs"),  # question answering reads every position
    readers_unless=(("classifier", ("bert.pooler.dense", "pooler.dense")),),
    tied=(
        ("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
        ("cls.predictions.decoder.bias", "cls.predictions.bias"),
    ),
)


def blocks(s: Sizes) -> dict:
    """The config fields of the encoder blocks (BERT and RoBERTa)."""
    return dict(num_hidden_layers=s.layers, hidden_size=s.d, num_attention_heads=s.heads,
                intermediate_size=s.ffn)


def random_config(s: Sizes, *, lm: bool = False, positions: int = 32) -> dict:
    """A BertForSequenceClassification, or with `lm=True` a BertLMHeadModel (a causal
    next-token head tied to the embeddings: a sequence classifier's one label per text fits
    no text data); `positions` tokens of context."""
    import transformers as T

    cls = "BertLMHeadModel" if lm else "BertForSequenceClassification"
    head = dict(is_decoder=True) if lm else dict(num_labels=s.labels)
    return T.BertConfig(vocab_size=s.vocab, max_position_embeddings=positions,
                        architectures=[cls], **head, **blocks(s)).to_dict()

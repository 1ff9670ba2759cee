"""Hugging Face DistilBERT: BERT's post-LayerNorm blocks under names of its own (q_lin, k_lin,
v_lin, out_lin; ffn.lin1 / lin2; sa_layer_norm, output_layer_norm), learned (or sinusoidal,
still a stored table) position embeddings and no token types. Its group is BERT's: per-layer
head, Q-K, V-O and FFN maps, and coordinate permutations of the stream (LayerNorm on it)."""

from __future__ import annotations

from rotviz.arch.spec import ArchSpec, LinearSpec, NormSpec, Sizes

ORDER = 21
# random_config options of a variant whose output head is its own: the default's
# (a sequence classifier; the masked-LM vocab_projector is tied to the embeddings)
UNTIED: dict | None = {}

SPEC = ArchSpec(
    family="distilbert",
    description="Hugging Face DistilBERT (post-norm encoder, split QKV, no token types)",
    source="hf",
    model_types=("distilbert",),
    inputs="tokens",
    n_layers_key=("n_layers",),
    d_model_key=("dim",),
    n_heads_key=("n_heads",),
    activation_key=("activation",),
    default_activation="gelu",
    roots=("distilbert.", ""),
    block=("transformer.layer.{i}.",),
    qkv=None,
    q=LinearSpec(("attention.q_lin",)),
    k=LinearSpec(("attention.k_lin",)),
    v=LinearSpec(("attention.v_lin",)),
    o=LinearSpec(("attention.out_lin",)),
    ffn_in=LinearSpec(("ffn.lin1",)),
    ffn_out=LinearSpec(("ffn.lin2",)),
    norms=(
        NormSpec(("sa_layer_norm",), "attn_out"),
        NormSpec(("output_layer_norm",), "ffn_out"),
    ),
    placement="post",
    final_norm=(),
    writers=("embeddings.word_embeddings", "embeddings.position_embeddings"),
    stream_norms=("embeddings.LayerNorm",),
    # pre_classifier reads the first token (sequence classification, multiple choice), whose
    # output the classifier reads; a token classifier's classifier reads every position
    readers=("pre_classifier", "vocab_transform", "qa_outputs"),
    readers_unless=(("classifier", ("pre_classifier",)),),
    tied=(("vocab_projector.weight", "distilbert.embeddings.word_embeddings.weight"),),
)


def random_config(s: Sizes, *, lm: bool = False, positions: int = 32) -> dict:
    """A DistilBertForSequenceClassification (with `lm`, a DistilBertForMaskedLM, whose
    vocab_projector is tied to the embeddings) taking `positions` tokens."""
    import transformers as T

    cls = "DistilBertForMaskedLM" if lm else "DistilBertForSequenceClassification"
    head = {} if lm else dict(num_labels=s.labels)
    return T.DistilBertConfig(
        n_layers=s.layers, dim=s.d, n_heads=s.heads, hidden_dim=s.ffn, vocab_size=s.vocab,
        max_position_embeddings=positions, pad_token_id=0, architectures=[cls], **head,
    ).to_dict()

"""Hugging Face DeBERTa-v2 / v3 (the seed paper's large model): a post-LayerNorm encoder with
split Q/K/V and disentangled attention. Relative position embeddings (`encoder.rel_embeddings`,
normalised by `encoder.LayerNorm`) are projected into each head's query and key spaces, by
query_proj / key_proj themselves (`share_att_key`, v3's default) or by pos_query_proj /
pos_key_proj, which must then move exactly as W_Q and W_K (`q_like`, `k_like`) for the
content-to-position and position-to-content scores to keep. The stream admits permutations
only (post-norm), and the relative embeddings, which query_proj and key_proj read, live in
its coordinates, so they are permuted with it (as writers are)."""

from __future__ import annotations

from rotviz.arch.families import bert
from rotviz.arch.spec import ArchSpec, LinearSpec, NormSpec, Sizes

ORDER = 13
# random_config options of a variant whose output head is its own: the default's
# (a sequence classifier)
UNTIED: dict | None = {}

SPEC = ArchSpec(
    family="deberta-v2",
    description="Hugging Face DeBERTa-v2 / v3 (post-norm encoder, disentangled relative "
    "attention)",
    source="hf",
    model_types=("deberta-v2",),
    inputs="tokens",
    n_layers_key=("num_hidden_layers",),
    d_model_key=("hidden_size",),
    n_heads_key=("num_attention_heads",),
    activation_key=("hidden_act",),
    default_activation="gelu",
    roots=("deberta.", ""),
    block=("encoder.layer.{i}.",),
    qkv=None,
    q=LinearSpec(("attention.self.query_proj",)),
    k=LinearSpec(("attention.self.key_proj",)),
    v=LinearSpec(("attention.self.value_proj",)),
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
        "encoder.rel_embeddings",  # read by query_proj / key_proj: stream coordinates
    ),
    stream_norms=("embeddings.LayerNorm", "encoder.LayerNorm"),
    readers=("pooler.dense", "cls.predictions.transform.dense", "qa_outputs"),
    readers_unless=(("classifier", ("pooler.dense",)),),
    tied=(
        ("cls.predictions.decoder.weight", "deberta.embeddings.word_embeddings.weight"),
        ("cls.predictions.decoder.bias", "cls.predictions.bias"),
    ),
    q_like=LinearSpec(("attention.self.pos_query_proj",)),
    k_like=LinearSpec(("attention.self.pos_key_proj",)),
    unsupported_modules=(
        ("encoder.conv", "a convolution layer in its encoder (conv_kernel_size > 0)"),
        ("embeddings.embed_proj", "an embedding projection (embedding_size != hidden_size)"),
    ),
    hidden_ties=(("lm_predictions.lm_head.dense", "deberta.embeddings.word_embeddings"),),
)


def random_config(s: Sizes, *, share_att_key: bool = True, lm: bool = False,
                  positions: int = 32, token: bool = False, absolute: bool = False,
                  token_types: int = 0, pos_att_type: str = "p2c|c2p") -> dict:
    """A DebertaV2ForSequenceClassification with v3's relative attention (both c2p and p2c
    terms, log buckets); `share_att_key=False` gives it pos_query_proj / pos_key_proj, `lm`
    a masked-LM head instead, `token` a token classifier (it reads the stream at every
    position), `positions` tokens of context. `absolute` adds v2's absolute position table
    (position_biased_input) and `token_types` a token-type table of that many rows: more
    writers on the stream. `pos_att_type` names the relative terms ("c2p" alone: only
    pos_key_proj without share_att_key; "p2c" alone: only pos_query_proj)."""
    import transformers as T

    cls = ("DebertaV2ForMaskedLM" if lm else "DebertaV2ForTokenClassification" if token
           else "DebertaV2ForSequenceClassification")
    head = {} if lm else dict(num_labels=s.labels)
    return T.DebertaV2Config(
        vocab_size=s.vocab, max_position_embeddings=positions, relative_attention=True,
        position_buckets=8, max_relative_positions=positions, pos_att_type=pos_att_type.split("|"),
        share_att_key=share_att_key, norm_rel_ebd="layer_norm", position_biased_input=absolute,
        type_vocab_size=token_types, pad_token_id=0, architectures=[cls], **head,
        **bert.blocks(s),
    ).to_dict()

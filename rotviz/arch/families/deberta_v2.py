"""Hugging Face DeBERTa-v2/v3: BERT-like post-norm blocks with disentangled attention.

Relative position embeddings (`encoder.rel_embeddings`, optionally normalised by
`encoder.LayerNorm`) live in stream coordinates and are projected per layer: by the layer's own
query/key projections (`share_att_key`, v3) or by `pos_query_proj` / `pos_key_proj`, which move
with Q / K under Q-K maps and head permutations (c2p scores Q_c K_r^T, p2c K_c Q_r^T).
"""

from __future__ import annotations

from rotviz.arch.spec import ArchSpec, LinearSpec, NormSpec, Sizes

ORDER = 13
# random_config options of a variant whose output head is its own: the default's (a sequence
# classifier; the legacy masked-LM decoder is tied to the word embeddings)
UNTIED: dict | None = {}

SPEC = ArchSpec(
    family="deberta-v2",
    description="Hugging Face DeBERTa-v2/v3 (post-norm encoder, disentangled attention)",
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
        "encoder.rel_embeddings",  # read (not added) by every layer's Q/K projections
    ),
    stream_norms=("embeddings.LayerNorm", "encoder.LayerNorm"),
    readers=("pooler.dense", "cls.predictions.transform.dense"),
    readers_unless=(("classifier", ("pooler.dense",)),),
    tied=(
        ("cls.predictions.decoder.weight", "deberta.embeddings.word_embeddings.weight"),
        ("cls.predictions.decoder.bias", "cls.predictions.bias"),
    ),
    q_like=LinearSpec(("attention.self.pos_query_proj",)),
    k_like=LinearSpec(("attention.self.pos_key_proj",)),
    refused=(
        ("encoder.conv.conv", "conv_kernel_size > 0 (a convolution beside the first layer)"),
        ("embeddings.embed_proj", "embedding_size != hidden_size (embeddings projected)"),
        ("lm_predictions.lm_head.dense",
         "legacy: false (a masked-LM head whose decoder is the word embedding table)"),
    ),
)

HEADS = {"seq": "DebertaV2ForSequenceClassification", "mlm": "DebertaV2ForMaskedLM",
         "token": "DebertaV2ForTokenClassification", "base": "DebertaV2Model"}


def random_config(s: Sizes, *, lm: bool = False, head: str = "seq", share: bool = True,
                  positions: int = 32, absolute: bool = False, token_types: int = 0) -> dict:
    """A DeBERTa-v3-like model (relative attention, c2p and p2c, normalised relative
    embeddings) with `head` (seq, mlm, token, base; `lm=True` is mlm: text data is scored by
    a language-model head); `share=False` gives every layer its own
    pos_query_proj / pos_key_proj (v2); `absolute` adds absolute position embeddings
    (position_biased_input); `token_types` a token-type table of that many rows."""
    import transformers as T

    head = "mlm" if lm else head
    extra = dict(num_labels=s.labels) if head in ("seq", "token") else {}
    return T.DebertaV2Config(
        vocab_size=s.vocab, hidden_size=s.d, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, intermediate_size=s.ffn,
        max_position_embeddings=positions, relative_attention=True, position_buckets=8,
        max_relative_positions=-1, pos_att_type=["p2c", "c2p"], share_att_key=share,
        norm_rel_ebd="layer_norm", position_biased_input=absolute, type_vocab_size=token_types,
        pooler_hidden_size=s.d, pad_token_id=0, architectures=[HEADS[head]], **extra,
    ).to_dict()

"""Hugging Face ModernBERT: a pre-LayerNorm encoder with no biases (by default), a fused
[Q; K; V] `Wqkv`, rotary embeddings (rotate_half) in every layer, a GeGLU FFN whose `Wi` holds
[gate; up] rows (act(first half) * second half feeds `Wo`), and global attention every few
layers with sliding-window attention between them. The window masks positions, not weights,
and each layer's rotary base (global or local theta) only sets its angles: the per-layer group
is LLaMA's (heads, per-pair Q-K rotation-scales, V-O maps, FFN permutations and up/down
scales). Block 0 reads the stream without a norm (its `attn_norm` is the identity), and the
stream starts at the embedding norm's output: a norm on the stream, so the residual group is
coordinate permutations (with every gain permuted), as in post-norm encoders."""

from __future__ import annotations

from rotviz.arch.spec import ArchSpec, LinearSpec, NormSpec, Sizes

ORDER = 20
# random_config options of a variant whose output head is its own: the default's
# (a sequence classifier; the masked-LM decoder is tied to the embeddings)
UNTIED: dict | None = {}

SPEC = ArchSpec(
    family="modernbert",
    description="Hugging Face ModernBERT (pre-LayerNorm encoder, fused QKV, GeGLU FFN, rotary "
    "embeddings, alternating global and sliding-window attention)",
    source="hf",
    model_types=("modernbert",),
    inputs="tokens",
    n_layers_key=("num_hidden_layers",),
    d_model_key=("hidden_size",),
    n_heads_key=("num_attention_heads",),
    activation_key=("hidden_activation",),
    default_activation="gelu",
    roots=("model.", ""),
    block=("layers.{i}.",),
    qkv=LinearSpec(("attn.Wqkv",)),  # view(..., 3, H, d_h): [Q; K; V] blocks
    q=None,
    k=None,
    v=None,
    o=LinearSpec(("attn.Wo",)),
    ffn_in=LinearSpec(("mlp.Wi",)),
    ffn_out=LinearSpec(("mlp.Wo",)),
    ffn_gate_up=True,
    norms=(
        NormSpec(("attn_norm",), "attn_in"),  # absent in block 0
        NormSpec(("mlp_norm",), "ffn_in"),
    ),
    placement="pre",
    final_norm=("final_norm",),
    writers=("embeddings.tok_embeddings",),
    stream_norms=("embeddings.norm",),
    # every head reads the final norm's output (pooled first token or mean for sequence
    # classification and multiple choice, every position for the others) through head.dense
    readers=("head.dense",),
    tied=(("decoder.weight", "model.embeddings.tok_embeddings.weight"),),
    rope="rotate_half",
    # rotary scalings (linear, dynamic, yarn, ...) set other angles per pair, which the Q-K
    # maps should survive, but rotviz has not checked them on ModernBERT: refused until it has
    checked_options=(("rope_parameters.*.rope_type", ("default",), "a rotary scaling"),),
)


def random_config(s: Sizes, *, lm: bool = False, positions: int = 32, bias: bool = False,
                  window: int = 4) -> dict:
    """A ModernBertForSequenceClassification (or with `lm` a ModernBertForMaskedLM, whose
    decoder is tied to the embeddings) with global attention in layer 0 and a sliding window
    of `window` tokens in layer 1 (so short probes see it), low rotary bases so every pair
    turns visibly, and `bias` on every linear and norm (ModernBERT's default has none)."""
    import transformers as T

    cls = "ModernBertForMaskedLM" if lm else "ModernBertForSequenceClassification"
    head = {} if lm else dict(num_labels=s.labels)
    return T.ModernBertConfig(
        num_hidden_layers=s.layers, hidden_size=s.d, num_attention_heads=s.heads,
        intermediate_size=s.ffn, vocab_size=s.vocab, max_position_embeddings=positions,
        global_attn_every_n_layers=2, local_attention=window,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}},
        attention_bias=bias, mlp_bias=bias, norm_bias=bias, classifier_bias=bias,
        pad_token_id=0, bos_token_id=0, eos_token_id=0, cls_token_id=0, sep_token_id=0,
        architectures=[cls], **head,
    ).to_dict()

"""What an architecture family is, as data: `ArchSpec` and the helpers that read it.

Each supported family is an `ArchSpec` (one file per family in `rotviz/arch/families/`):
where its Q/K/V/O and FFN tensors live, whether QKV is fused and whether linears are stored
transposed (GPT-2's Conv1D), where the norms sit, which tensors write to and read from the
residual stream, and its quirks (RoBERTa's position offset). Every transform in rotviz is
derived from these descriptions; no code path is written per family.

Names are tuples of alternatives (the first present in a state dict wins), which is how one
spec covers both transformers 4.x and 5.x module names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Names = tuple[str, ...]
STREAM_SITES = ("attn_out", "ffn_out")  # post-norms: on the stream
BRANCH_SITES = ("attn_post", "ffn_post")  # on a sub-layer's output, before the add


@dataclass(frozen=True)
class LinearSpec:
    """A linear layer `<name>.weight` / `<name>.bias` inside a block."""

    names: Names
    transposed: bool = False  # stored (in, out), as GPT-2's Conv1D


@dataclass(frozen=True)
class NormSpec:
    """A normalisation layer inside a block.

    `site` says what it normalises: `attn_in` / `ffn_in` (pre-norm: the input of the
    sub-layer, the stream itself is untouched), `attn_out` / `ffn_out` (post-norm: the
    stream after the residual add, so the norm sits on the stream) or `attn_post` /
    `ffn_post` (the sub-layer's output before the add, as Gemma2's: its gain multiplies what
    is written to the stream, coordinate by coordinate).
    """

    names: Names
    site: str


@dataclass(frozen=True)
class ArchSpec:
    """Where everything lives in one architecture family."""

    family: str
    description: str
    source: str  # the weight source's adapter (rotviz.sources): "hf" (transformers) or "timm"
    # How a config names the family: its `type_key` holds one of `model_types` (with
    # `type_prefix`, starts with one: timm's architecture names, e.g. vit_base_patch16_224)
    model_types: Names
    inputs: str  # "tokens" or "pixels"
    # config keys, alternatives in order
    n_layers_key: Names
    d_model_key: Names
    n_heads_key: Names
    activation_key: Names
    default_activation: str
    roots: Names  # prefixes of the backbone inside the full model, tried in order
    block: Names  # block prefix templates relative to a root, with {i}
    qkv: LinearSpec | None  # fused Q, K, V (three blocks of d rows, in that order)
    q: LinearSpec | None
    k: LinearSpec | None
    v: LinearSpec | None
    o: LinearSpec
    ffn_in: LinearSpec
    ffn_out: LinearSpec
    norms: tuple[NormSpec, ...]
    placement: str  # "pre" or "post" norm
    final_norm: Names  # relative to a root; empty for none
    # Residual stream, outside the blocks (relative to a root). Writers add to the stream
    # (embedding tables, position / class tokens, patch projections); embedding norms of
    # post-norm models sit on the stream. Readers (relative to the full model) read it.
    writers: Names
    stream_norms: Names
    readers: Names
    tied: tuple[tuple[str, str], ...] = ()  # (alias, owner) full tensor names
    # Readers that read the stream only where none of the listed modules is present (full
    # names): BERT's `classifier` reads the pooler's output in a sequence classifier, and the
    # stream itself, at every position, in a token classifier, which has no pooler.
    readers_unless: tuple[tuple[str, Names], ...] = ()
    # Writers above that are linear or convolution layers (output channels first, e.g. a
    # patch projection): their weight's rows live in the stream. Every other writer is a
    # table or token whose last dimension is the stream (embeddings, position, class tokens).
    projections: Names = ()
    # "layernorm" (mean and variance, gain and bias) or "rmsnorm" (gain only)
    norm_kind: str = "layernorm"
    # Gated FFN (SwiGLU): the gate linear, read from the stream like ffn_in (the "up" map);
    # act(gate x) * (up x) feeds ffn_out. None for a plain FFN.
    ffn_gate: LinearSpec | None = None
    n_kv_heads_key: Names = ()  # grouped-query attention: key/value heads (default n_heads)
    head_dim_key: Names = ()  # explicit head size (default d_model / n_heads)
    # Rotary position embeddings on Q and K: None, "rotate_half" (Hugging Face: dim i pairs
    # with i + d_h/2) or "interleaved" (dims 2j and 2j+1 pair)
    rope: str | None = None
    # Token models whose position ids do not start at 0: (config key, value when unset) of the
    # index they start after. RoBERTa counts positions from pad_token_id + 1, so its table
    # holds pad_token_id + 1 rows fewer usable positions than max_position_embeddings says.
    positions_after: tuple[str, int] | None = None
    type_key: str = "model_type"
    type_prefix: bool = False
    # Norms whose stored weight w is an offset from the gain: the gain is `norm_offset + w`
    # (Gemma stores 1 + w, so that zero-initialised weights mean gain 1)
    norm_offset: float = 0.0
    # Partial rotary: config keys of the share of each head's dims that rotary embeddings
    # turn (the first ones; the rest are left alone), looked up in the config and in its
    # `rope_parameters`. Empty: all of them.
    rope_fraction_key: Names = ()
    # Fused QKV layout: "blocks" ([Q; K; V], each heads x d_h rows: GPT-2, Phi-3) or "heads"
    # (per head [q; k; v], d_h rows each: GPT-NeoX)
    qkv_layout: str = "blocks"
    # Fused gated FFN: `ffn_in` names one linear holding [gate; up] rows (Phi-3's
    # gate_up_proj), split into the gate and up maps on reading and joined on writing
    ffn_gate_up: bool = False
    # Per-head RMSNorms on queries and keys before RoPE (Qwen3): the names of the query's and
    # the key's norm relative to a block. Their gains (one d_h vector per layer, shared by the
    # heads) restrict the Q-K maps to rotations that commute with them (rotviz.symmetry.actions)
    qk_norms: tuple[Names, Names] | None = None
    # What one q/k norm normalises: "head" (each head's d_h values, one gain shared by the
    # heads: Qwen3) or "projection" (the whole query or key projection, H x d_h values, one
    # gain per head and dim: OLMo-2). A projection norm's RMS is kept by per-head orthogonal
    # maps and head permutations (which move the gains with the heads), and each head's map
    # must commute with that head's own gains (rotviz.symmetry.actions)
    qk_norm_scope: str = "head"
    # Linears that project something other than the stream into a head's query or key space
    # and must move exactly as W_Q (`q_like`) or W_K (`k_like`) do: DeBERTa's pos_query_proj
    # and pos_key_proj, which project the relative position embeddings (absent when the
    # checkpoint shares query_proj / key_proj for them)
    q_like: LinearSpec | None = None
    k_like: LinearSpec | None = None
    # Modules (relative to a root) rotviz cannot map yet, and what they are: a checkpoint
    # that has one is refused in one line
    unsupported_modules: tuple[tuple[str, str], ...] = ()
    # Modules (full names) that decode with a stream writer's table from a space of their own
    # without a tensor of their own (DeBERTa's masked-LM head reads the word embeddings): the
    # stream cannot be mapped where one is present
    hidden_ties: tuple[tuple[str, str], ...] = ()  # (module, the writer it decodes with)
    # Tensors that checkpoints saved by older transformers versions hold and the installed
    # classes neither have nor list among the names they ignore on load (GPT-2's per-layer
    # `attn.masked_bias`, a fill value that attention now computes): regular expressions
    # searched in the module's full tensor names, as transformers' own
    # `_keys_to_ignore_on_load_unexpected` are. Only what transformers leaves unsaid goes
    # here; rotviz.sources.legacy reads the rest from the classes and reads past small buffer-like
    # tensors only
    legacy_buffers: Names = ()
    # Key/value heads decided by config flags (Falcon): (flag, override). Where `override` is
    # true the heads are `n_kv_heads_key`'s; else one where `flag` is true (multi-query),
    # else one per query head. Empty: `n_kv_heads_key` alone decides
    kv_heads_flags: tuple[str, str] | None = None
    # Config keys whose true value means ALiBi in place of the rotary embeddings (Falcon's
    # `alibi`): no rotary map constraint on Q-K, but each head has its own fixed slope, so
    # heads do not permute
    alibi_key: Names = ()
    # Parallel blocks that may feed attention and the FFN from one norm (Falcon-7B): where a
    # block has an attn_in norm and no ffn_in norm, the FFN reads the attn_in norm's output
    shared_input_norm: bool = False
    # Configs rotviz does not model, refused in one line: (what they are, the (key, value)
    # pairs that all hold in them; an absent key reads as None)
    refused_configs: tuple[tuple[str, tuple[tuple[str, object], ...]], ...] = ()
    # Linears (relative to a root, listed among `writers` and `projections` too) that carry the
    # embeddings from a space of their own into the stream (ELECTRA's embeddings_project, saved
    # only where embedding_size != hidden_size): where one is present it is the stream's only
    # writer, and the tables and norm before it, which it reads, are not on the stream
    embed_project: Names = ()
    # Config options rotviz has checked only at some values: (key, the checked values, what the
    # option is). A dotted key reads nested objects, `*` every value of one (ModernBERT's
    # rope_parameters.*.rope_type, per layer type); an absent key takes its checked default.
    # A config with another value is refused in one line (`unchecked_option`)
    checked_options: tuple[tuple[str, tuple, str], ...] = ()

    def describes(self, config: Mapping) -> bool:
        """Whether `config` (config.json of a checkpoint) is a model of this family."""
        name = config.get(self.type_key)
        if self.type_prefix:
            return isinstance(name, str) and name.startswith(self.model_types)
        return name in self.model_types

    @property
    def input_key(self) -> str:
        """The name of the model's input: `pixel_values` or `input_ids`."""
        return "pixel_values" if self.inputs == "pixels" else "input_ids"

    @property
    def fused(self) -> bool:
        return self.qkv is not None

    @property
    def gated(self) -> bool:
        return self.ffn_gate is not None or self.ffn_gate_up

    @property
    def branch_norms(self) -> bool:
        """Whether a norm scales a sub-layer's output before it is added to the stream; its
        gain then fixes the stream's coordinates, so only permutations map the stream."""
        return any(n.site in BRANCH_SITES for n in self.norms)


@dataclass(frozen=True)
class Sizes:
    """The sizes of a random test model (rotviz.random_models), shared by every family; each
    family's `random_config` reads those that apply to it."""

    layers: int = 2
    d: int = 32
    heads: int = 4
    ffn: int = 64
    vocab: int = 61
    image: int = 8
    patch: int = 2
    channels: int = 1
    labels: int = 5


def config_value(config: Mapping, keys: Names, default=None):
    """The first present key of `keys` in a (possibly nested timm) config."""
    sources = [config, config.get("model_args") or {}]
    for src in sources:
        for key in keys:
            if key in src and src[key] is not None:
                return src[key]
    return default


def position_offset(spec: ArchSpec, config: Mapping) -> int:
    """Rows of the position table before the first position (`spec.positions_after`)."""
    if spec.positions_after is None:
        return 0
    key, unset = spec.positions_after
    return int(config.get(key) or unset) + 1


def max_positions(spec: ArchSpec, config: Mapping, default: int) -> int:
    """How many tokens a model of `spec` takes: its position table's size (`default` when the
    config names none), less `position_offset`."""
    table = int(config.get("n_positions") or config.get("max_position_embeddings") or default)
    return table - position_offset(spec, config)


def n_kv_heads(spec: ArchSpec, config: Mapping, heads: int) -> int:
    """How many key/value heads a model of `spec` with `heads` query heads has."""
    if spec.kv_heads_flags is not None:
        flag, override = spec.kv_heads_flags
        if not config.get(override):
            return 1 if config.get(flag) else heads
    if not spec.n_kv_heads_key:
        return heads
    return int(config_value(config, spec.n_kv_heads_key, heads))


def uses_alibi(spec: ArchSpec, config: Mapping) -> bool:
    """Whether the config turns ALiBi on in place of rotary embeddings (`spec.alibi_key`)."""
    return bool(spec.alibi_key) and bool(config_value(config, spec.alibi_key, False))


def check_config(spec: ArchSpec, config: Mapping) -> None:
    """Refuse, in one line, a config that `spec.refused_configs` lists."""
    from rotviz.errors import RotvizError

    for what, pairs in spec.refused_configs:
        if all(config.get(k) == v for k, v in pairs):
            shown = ", ".join(f"{k}={v}" for k, v in pairs)
            raise RotvizError(f"this {spec.family} config ({shown}) is {what}, which rotviz "
                              "does not model; use a checkpoint without it")
def _option_values(config: object, path: list[str]) -> list:
    """The values at a dotted `path` in `config` (`*`: every value of an object)."""
    if not path:
        return [config]
    if not isinstance(config, Mapping):
        return []
    head, rest = path[0], path[1:]
    subs = list(config.values()) if head == "*" else [config[head]] if head in config else []
    return [v for sub in subs for v in _option_values(sub, rest)]


def unchecked_option(spec: ArchSpec, config: Mapping) -> str | None:
    """One line naming a config option of `spec.checked_options` set to a value rotviz has
    not checked, or None when there is none."""
    for key, values, what in spec.checked_options:
        for value in _option_values(config, key.split(".")):
            if value is not None and value not in values:
                return (f"this {spec.family} model sets {key} to {value!r} ({what}), which "
                        f"rotviz has checked only at {', '.join(map(repr, values))}; use a "
                        "checkpoint without it")
    return None

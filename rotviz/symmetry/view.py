"""The canonical view: one model's weights, per block, per head, in (out, in) layout.

`read_view` turns a state dict into a `ModelView` using only the family's `ArchSpec`;
`write_state` turns a view back into a state dict with the original names, shapes, layouts
and dtypes, bit for bit. Symmetry actions and matching work on views and return new ones. The
kind of each tensor, for distances: rotviz.symmetry.kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from rotviz.arch import ArchSpec, LinearSpec, config_value
from rotviz.arch.spec import check_config, n_kv_heads, unchecked_option, uses_alibi
from rotviz.errors import RotvizError

Tensor = torch.Tensor


@dataclass(frozen=True)
class Dims:
    """A model's sizes, and the facts about its layers that decide its symmetry group.

    The trailing fields have defaults so that `Dims(n_layers, d, H, d_h, m, act)` still
    describes a plain model: `n_kv_heads` None means H (no grouped-query attention)."""

    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_ffn: int
    activation: str
    n_kv_heads: int | None = None  # key/value heads (grouped-query attention); None: n_heads
    rope: str | None = None  # rotary layout of Q and K ("rotate_half", "interleaved") or None
    gated: bool = False  # gated FFN (SwiGLU): up rows may be rescaled, down columns inversely
    qk_norm: bool = False  # per-head q/k RMSNorms (Qwen3): Q-K maps restricted, see actions
    alibi: bool = False  # ALiBi (Falcon): each head has its own slope, so heads do not permute

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)

    @property
    def group_size(self) -> int:
        """Query heads per KV group (1 without grouped-query attention)."""
        return self.n_heads // self.n_kv_heads


@dataclass(frozen=True)
class Layout:
    """The resolved tensor names of one concrete model (which alternative of each name)."""

    blocks: tuple[str, ...]  # full block prefixes, e.g. "transformer.h.3."
    roles: Mapping[str, str]  # role -> name relative to a block (q, k, v, qkv, o, ffn_in, ...)
    norms: Mapping[str, str]  # site -> name relative to a block
    final_norm: str | None  # full name
    writers: tuple[str, ...]  # full tensor names
    stream_norms: tuple[str, ...]  # full module names
    readers: tuple[str, ...]  # full module names


@dataclass(frozen=True)
class Attention:
    """One attention layer, split per head. W_O columns of head h are `wo[h]` (d, d_h).

    Under grouped-query attention K and V have H_kv < H heads; query head h reads KV head
    h // (H / H_kv). Without it H_kv = H."""

    wq: Tensor  # (H, d_h, d)
    wk: Tensor  # (H_kv, d_h, d)
    wv: Tensor  # (H_kv, d_h, d)
    wo: Tensor  # (H, d, d_h)
    bq: Tensor | None  # (H, d_h)
    bk: Tensor | None  # (H_kv, d_h)
    bv: Tensor | None  # (H_kv, d_h)
    bo: Tensor | None  # (d,)
    # q/k RMSNorm gains, stored weights: per head and shared by the heads (Qwen3: (d_h,)), or
    # over the whole projection, one row per head (OLMo-2, ArchSpec.qk_norm_scope: (H, d_h)
    # and (H_kv, d_h))
    gq: Tensor | None = None
    gk: Tensor | None = None
    # projections that move exactly as W_Q / W_K (ArchSpec.q_like / k_like: DeBERTa's
    # position projections), per head like them
    wpq: Tensor | None = None  # (H, d_h, d)
    bpq: Tensor | None = None  # (H, d_h)
    wpk: Tensor | None = None  # (H_kv, d_h, d)
    bpk: Tensor | None = None  # (H_kv, d_h)

    @property
    def n_heads(self) -> int:
        return self.wq.shape[0]

    @property
    def n_kv_heads(self) -> int:
        return self.wk.shape[0]


@dataclass(frozen=True)
class FFN:
    """A plain FFN, act(x W_in^T + b_in) W_out^T + b_out, or a gated one (SwiGLU), where
    act(x W_gate^T) * (x W_in^T) feeds W_out: W_in is then the "up" map."""

    w_in: Tensor  # (m, d)
    b_in: Tensor | None  # (m,)
    w_out: Tensor  # (d, m)
    b_out: Tensor | None  # (d,)
    activation: str
    w_gate: Tensor | None = None  # (m, d), gated FFNs only
    b_gate: Tensor | None = None  # (m,)


@dataclass(frozen=True)
class Norm:
    weight: Tensor | None
    bias: Tensor | None
    site: str  # attn_in / ffn_in (pre) or attn_out / ffn_out (post, on the stream)


@dataclass(frozen=True)
class Block:
    attn: Attention
    ffn: FFN
    norms: Mapping[str, Norm]


@dataclass(frozen=True)
class ModelView:
    spec: ArchSpec
    dims: Dims
    layout: Layout
    blocks: tuple[Block, ...]
    other: Mapping[str, Tensor] = field(default_factory=dict)  # everything else, untouched
    dtypes: Mapping[str, torch.dtype] = field(default_factory=dict)  # original dtypes
    # The spec's (alias, owner) ties that hold in this model (None: all of spec.tied). An
    # alias of a live tie is one tensor with its owner and is counted once in distances.
    tied: tuple[tuple[str, str], ...] | None = None

    def with_block(self, i: int, block: Block) -> ModelView:
        blocks = list(self.blocks)
        blocks[i] = block
        return replace(self, blocks=tuple(blocks))

    def to(self, dtype: torch.dtype | None = None, device=None) -> ModelView:
        """A copy with every floating tensor cast (used for float64 matching)."""

        def cast(t):
            if t is None or not t.is_floating_point():
                return t
            return t.to(dtype=dtype or t.dtype, device=device)

        return map_tensors(self, cast)


def _present(state: Mapping[str, Tensor], name: str) -> bool:
    return f"{name}.weight" in state


def _pick(state: Mapping[str, Tensor], prefix: str, names: tuple[str, ...]) -> str | None:
    for alt in names:
        if _present(state, prefix + alt):
            return alt
    return None


def resolve_layout(spec: ArchSpec, state: Mapping[str, Tensor]) -> Layout:
    """Find which alternative of every name this state dict uses."""
    attn_role = spec.qkv or spec.q
    assert attn_role is not None
    for root in spec.roots:
        for tmpl in spec.block:
            first = root + tmpl.format(i=0)
            if _pick(state, first, attn_role.names) is None:
                continue
            blocks = []
            while _pick(state, root + tmpl.format(i=len(blocks)), attn_role.names) is not None:
                blocks.append(root + tmpl.format(i=len(blocks)))
            for module, what in spec.unsupported_modules:
                if any(k.startswith(f"{root}{module}.") for k in state):
                    raise RotvizError(
                        f"this {spec.family} model has {what} ('{root}{module}'), which "
                        "rotviz cannot map yet; use a checkpoint without it")
            roles = {}
            for role in ("qkv", "q", "k", "v", "o", "ffn_in", "ffn_gate", "ffn_out",
                         "q_like", "k_like"):
                lin: LinearSpec | None = getattr(spec, role)
                if lin is None:
                    continue
                alt = _pick(state, first, lin.names)
                if alt is None and role in ("q_like", "k_like"):  # optional: shared weights
                    continue
                if alt is None:
                    raise RotvizError(
                        f"weights do not look like {spec.family}: no tensor "
                        f"'{first}{lin.names[0]}.weight'; is the weights file complete?"
                    )
                roles[role] = alt
            norms = {}
            for ns in spec.norms:  # any block's: ModernBERT's block 0 reads the stream unnormed
                alt = next((a for a in ns.names
                            if any(f"{b}{a}.weight" in state for b in blocks)), None)
                if alt is not None:
                    norms[ns.site] = alt
            final = next((root + n for n in spec.final_norm if _present(state, root + n)), None)
            writers = tuple(
                key
                for w in spec.writers
                for key in (root + w, root + w + ".weight", root + w + ".bias")
                if key in state
            )
            stream_norms = tuple(root + n for n in spec.stream_norms if _present(state, root + n))
            entry = next((root + p for p in spec.embed_project if _present(state, root + p)), None)
            if entry is not None:  # the tables and their norm sit before it, off the stream
                writers = tuple(k for k in writers if k.startswith(entry + "."))
                stream_norms = ()
            readers = tuple(r for r in spec.readers if _present(state, r)) + tuple(
                r for r, behind in spec.readers_unless
                if _present(state, r) and not any(_present(state, b) for b in behind))
            return Layout(tuple(blocks), roles, norms, final, writers, stream_norms, readers)
    raise RotvizError(
        f"weights do not look like a {spec.family} model: no attention tensors found; "
        "check that the weights file belongs to this config"
    )


def model_dims(
    spec: ArchSpec, config: Mapping, state: Mapping[str, Tensor], layout: Layout
) -> Dims:
    why = unchecked_option(spec, config)
    if why:
        raise RotvizError(why)
    n_layers = len(layout.blocks)
    d = int(config_value(config, spec.d_model_key))
    h = int(config_value(config, spec.n_heads_key))
    dh = config_value(config, spec.head_dim_key) if spec.head_dim_key else None
    if dh is None:
        if d % h:
            raise RotvizError(
                f"hidden size {d} is not divisible by {h} heads; the config is invalid"
            )
        dh = d // h
    check_config(spec, config)
    h_kv = n_kv_heads(spec, config, h)
    if h_kv <= 0 or h % h_kv:
        raise RotvizError(
            f"{h} attention heads cannot be shared by {h_kv} key/value heads (it must divide "
            "the number of heads); the config is invalid"
        )
    w_in = _weight(state, layout.blocks[0] + layout.roles["ffn_in"], spec.ffn_in)
    m = w_in.shape[0] // 2 if spec.ffn_gate_up else w_in.shape[0]
    act = config_value(config, spec.activation_key, spec.default_activation)
    alibi = uses_alibi(spec, config)
    return Dims(n_layers, d, h, int(dh), int(m), str(act), h_kv,
                None if alibi else _rope(spec, config, int(dh)), spec.gated,
                spec.qk_norms is not None, alibi)


def _rope(spec: ArchSpec, config: Mapping, dh: int) -> str | None:
    """The model's rotary layout, with the number of turned dims per head when it is not all
    of them (partial rotary: `ArchSpec.rope_fraction_key`; see rotviz.groups.rope_rotary)."""
    if spec.rope is None or not spec.rope_fraction_key:
        return spec.rope
    fraction = config_value(config, spec.rope_fraction_key)
    if fraction is None:
        fraction = config_value(config.get("rope_parameters") or {}, spec.rope_fraction_key, 1.0)
    rotary = int(dh * float(fraction))
    if rotary % 2 or not 0 < rotary <= dh:
        raise RotvizError(
            f"rotary embeddings turn {rotary} of each head's {dh} dims ({fraction} of them); "
            "rotviz needs an even number between 2 and the head size: check the config"
        )
    return spec.rope if rotary == dh else f"{spec.rope}:{rotary}"


def _live_ties(spec: ArchSpec, config: Mapping, state: Mapping[str, Tensor]):
    """The spec's ties that hold here: both tensors present, and the config does not untie
    them (`tie_word_embeddings: false`) unless they still share storage."""
    untied = config.get("tie_word_embeddings") is False
    out = []
    for alias, owner in spec.tied:
        a, o = state.get(alias), state.get(owner)
        if a is None or o is None or a.shape != o.shape:
            continue
        if untied and a.data_ptr() != o.data_ptr():
            continue
        out.append((alias, owner))
    return tuple(out)


def _weight(state: Mapping[str, Tensor], name: str, lin: LinearSpec) -> Tensor:
    w = state[f"{name}.weight"]
    return w.t() if lin.transposed else w


def _split_qkv(spec: ArchSpec, t: Tensor, rows: tuple[int, int, int], h: int, dh: int
               ) -> tuple[Tensor, Tensor, Tensor]:
    """A fused QKV weight (rows, d) or bias (rows,) cut into Q, K and V rows, in its layout:
    `blocks` [Q; K; V] or `heads` (per head [q; k; v])."""
    if spec.qkv_layout == "blocks":
        return torch.split(t, rows)
    if spec.qkv_layout == "groups":  # per KV group [q_1; ...; q_r; k; v] (Falcon)
        h_kv = rows[1] // dh
        per = t.reshape(h_kv, h // h_kv + 2, dh, *t.shape[1:])
        return (per[:, :-2].reshape(h * dh, *t.shape[1:]),
                per[:, -2].reshape(h_kv * dh, *t.shape[1:]),
                per[:, -1].reshape(h_kv * dh, *t.shape[1:]))
    if spec.qkv_layout == "heads":
        if rows[0] != rows[1]:
            raise RotvizError(f"{spec.family}'s per-head fused QKV cannot hold grouped-query "
                              "attention; check the config's key/value heads")
        per = t.reshape(h, 3, dh, *t.shape[1:])
        return tuple(per[:, n].reshape(h * dh, *t.shape[1:]) for n in range(3))
    raise RotvizError(f"unknown fused QKV layout '{spec.qkv_layout}': use blocks, heads or "
                      "groups")


def _join_qkv(spec: ArchSpec, parts: list[Tensor], dh: int) -> Tensor:
    """`_split_qkv` undone."""
    if spec.qkv_layout == "blocks":
        return torch.cat(parts)
    rest = parts[0].shape[1:]
    if spec.qkv_layout == "groups":
        h_kv = parts[1].shape[0] // dh
        per = [parts[0].reshape(h_kv, -1, dh, *rest)] + [
            p.reshape(h_kv, 1, dh, *rest) for p in parts[1:]]
        return torch.cat(per, dim=1).reshape(-1, *rest)
    per = [p.reshape(-1, 1, dh, *rest) for p in parts]
    return torch.cat(per, dim=1).reshape(-1, *rest)


def read_view(spec: ArchSpec, config: Mapping, state: Mapping[str, Tensor]) -> ModelView:
    """Read a state dict into the canonical view. The state dict is not modified."""
    layout = resolve_layout(spec, state)
    dims = model_dims(spec, config, state, layout)
    used: set[str] = set()
    blocks = [read_block(spec, dims, layout, state, prefix, used) for prefix in layout.blocks]
    other = {k: v for k, v in state.items() if k not in used}
    dtypes = {k: v.dtype for k, v in state.items()}
    return ModelView(spec, dims, layout, tuple(blocks), other, dtypes,
                     _live_ties(spec, config, state))


def read_block(spec: ArchSpec, dims: Dims, layout: Layout, state: Mapping[str, Tensor],
               prefix: str, used: set[str] | None = None) -> Block:
    """The block at `prefix` (one of `layout.blocks`); the names it reads are added to `used`.
    On its own it lets a checkpoint be read one block at a time (rotviz.match.at_size)."""
    h, h_kv, dh, d = dims.n_heads, dims.n_kv_heads, dims.d_head, dims.d_model
    rows = (h * dh, h_kv * dh, h_kv * dh)  # W_Q, W_K, W_V
    used = set() if used is None else used

    def lin(prefix: str, role: str) -> tuple[Tensor, Tensor | None]:
        lspec: LinearSpec = getattr(spec, role)
        name = prefix + layout.roles[role]
        used.add(f"{name}.weight")
        bias = state.get(f"{name}.bias")
        if bias is not None:
            used.add(f"{name}.bias")
        return _weight(state, name, lspec), bias

    def check(name: str, w: Tensor, shape: tuple[int, int]) -> None:
        if tuple(w.shape) != shape:
            raise RotvizError(
                f"{name} has shape {tuple(w.shape)} but the config ({h} heads, {h_kv} key/value "
                f"heads of size {dh}, hidden size {d}) needs {shape}; the weights do not fit "
                "config.json"
            )

    if spec.fused:
        w, b = lin(prefix, "qkv")
        check(prefix + layout.roles["qkv"], w, (sum(rows), d))
        wq, wk, wv = _split_qkv(spec, w, rows, h, dh)
        bq, bk, bv = (None,) * 3 if b is None else _split_qkv(spec, b, rows, h, dh)
    else:
        (wq, bq), (wk, bk), (wv, bv) = (lin(prefix, r) for r in ("q", "k", "v"))
        for role, w, n in zip(("q", "k", "v"), (wq, wk, wv), rows, strict=True):
            check(prefix + layout.roles[role], w, (n, d))
    wo, bo = lin(prefix, "o")
    check(prefix + layout.roles["o"], wo, (d, h * dh))
    heads = [x.reshape(n, dh, d) for x, n in zip((wq, wk, wv), (h, h_kv, h_kv), strict=True)]
    hb = [None if b is None else b.reshape(n, dh)
          for b, n in zip((bq, bk, bv), (h, h_kv, h_kv), strict=True)]
    gains = []
    for names in spec.qk_norms or ():
        alt = next((a for a in names if f"{prefix}{a}.weight" in state), None)
        if alt is None:
            raise RotvizError(f"weights do not look like {spec.family}: no tensor "
                              f"'{prefix}{names[0]}.weight'; is the weights file complete?")
        used.add(f"{prefix}{alt}.weight")
        g = state[f"{prefix}{alt}.weight"]
        if spec.qk_norm_scope == "projection":  # one gain row per head (OLMo-2)
            n = h if not gains else h_kv
            if g.numel() != n * dh:
                raise RotvizError(f"{prefix}{alt}.weight has {g.numel()} values but the config "
                                  f"({n} heads of size {dh}) needs {n * dh}; the weights do not "
                                  "fit config.json")
            g = g.reshape(n, dh)
        gains.append(g)
    like = {}
    for role, n, w_key, b_key in (("q_like", h, "wpq", "bpq"), ("k_like", h_kv, "wpk", "bpk")):
        if role in layout.roles:
            w, b = lin(prefix, role)
            check(prefix + layout.roles[role], w, (n * dh, d))
            like[w_key] = w.reshape(n, dh, d)
            like[b_key] = None if b is None else b.reshape(n, dh)
    attn = Attention(
        heads[0], heads[1], heads[2], wo.reshape(d, h, dh).permute(1, 0, 2), *hb, bo,
        *gains, **like
    )
    w_in, b_in = lin(prefix, "ffn_in")
    w_out, b_out = lin(prefix, "ffn_out")
    if spec.ffn_gate_up:  # one linear holds [gate; up]
        w_gate, w_in = w_in.chunk(2)
        b_gate, b_in = (None, None) if b_in is None else b_in.chunk(2)
    else:
        w_gate, b_gate = lin(prefix, "ffn_gate") if spec.gated else (None, None)
    ffn = FFN(w_in, b_in, w_out, b_out, dims.activation, w_gate, b_gate)
    norms = {}
    for site, alt in layout.norms.items():
        nw, nb = state.get(f"{prefix}{alt}.weight"), state.get(f"{prefix}{alt}.bias")
        if nw is None and nb is None:  # this block has none (ModernBERT's first attn_norm)
            continue
        used.update(k for k in (f"{prefix}{alt}.weight", f"{prefix}{alt}.bias") if k in state)
        norms[site] = Norm(nw, nb, site)
    return Block(attn, ffn, norms)


def write_state(view: ModelView) -> dict[str, Tensor]:
    """Write a view back to a state dict with the original names, layouts and dtypes."""
    out: dict[str, Tensor] = {}
    for prefix, blk in zip(view.layout.blocks, view.blocks, strict=True):
        out.update(write_block(view, blk, prefix))
    for k, v in view.other.items():
        out[k] = v.to(view.dtypes.get(k, v.dtype))
    # keep the original key order so saved files diff cleanly
    order = list(view.dtypes)
    return {k: out[k] for k in order if k in out} | {
        k: v for k, v in out.items() if k not in view.dtypes
    }


def write_block(view: ModelView, blk: Block, prefix: str) -> dict[str, Tensor]:
    """One block's tensors under their names in the checkpoint, in `view.dtypes`."""
    spec, layout, dims = view.spec, view.layout, view.dims
    d = dims.d_model
    out: dict[str, Tensor] = {}

    def put(prefix: str, role: str, w: Tensor, b: Tensor | None) -> None:
        lspec: LinearSpec = getattr(spec, role)
        name = prefix + layout.roles[role]
        key = f"{name}.weight"
        w = w.t() if lspec.transposed else w
        out[key] = w.contiguous().to(view.dtypes.get(key, w.dtype))
        if b is not None:
            out[f"{name}.bias"] = b.contiguous().to(view.dtypes.get(f"{name}.bias", b.dtype))

    a = blk.attn
    ws = [x.reshape(-1, d) for x in (a.wq, a.wk, a.wv)]
    bs = [None if b is None else b.reshape(-1) for b in (a.bq, a.bk, a.bv)]
    if spec.fused:
        bias = None if bs[0] is None else _join_qkv(spec, bs, dims.d_head)
        put(prefix, "qkv", _join_qkv(spec, ws, dims.d_head), bias)
    else:
        for role, w, b in zip(("q", "k", "v"), ws, bs, strict=True):
            put(prefix, role, w, b)
    put(prefix, "o", a.wo.permute(1, 0, 2).reshape(d, -1), a.bo)
    for role, w, b in (("q_like", a.wpq, a.bpq), ("k_like", a.wpk, a.bpk)):
        if role in layout.roles:
            put(prefix, role, w.reshape(-1, d), None if b is None else b.reshape(-1))
    for names, g in zip(spec.qk_norms or (), (a.gq, a.gk), strict=False):
        key = next((f"{prefix}{n}.weight" for n in names
                    if f"{prefix}{n}.weight" in view.dtypes), f"{prefix}{names[0]}.weight")
        out[key] = g.contiguous().reshape(-1).to(view.dtypes.get(key, g.dtype))
    f = blk.ffn
    if spec.ffn_gate_up:
        put(prefix, "ffn_in", torch.cat([f.w_gate, f.w_in]),
            None if f.b_in is None else torch.cat([f.b_gate, f.b_in]))
    else:
        put(prefix, "ffn_in", f.w_in, f.b_in)
    if spec.ffn_gate is not None:
        put(prefix, "ffn_gate", f.w_gate, f.b_gate)
    put(prefix, "ffn_out", f.w_out, f.b_out)
    for site, alt in layout.norms.items():
        norm = blk.norms.get(site)
        if norm is None:  # this block has none
            continue
        for part, t in (("weight", norm.weight), ("bias", norm.bias)):
            if t is not None:
                key = f"{prefix}{alt}.{part}"
                out[key] = t.contiguous().to(view.dtypes.get(key, t.dtype))
    return out


def map_tensors(view: ModelView, fn) -> ModelView:
    """Apply `fn` to every tensor of the view (blocks and the rest), returning a new view."""

    def m(obj):
        return replace(
            obj,
            **{
                f: fn(getattr(obj, f))
                for f in obj.__dataclass_fields__
                if isinstance(getattr(obj, f), torch.Tensor)
            },
        )

    blocks = tuple(
        Block(m(b.attn), m(b.ffn), {s: m(n) for s, n in b.norms.items()}) for b in view.blocks
    )
    return replace(view, blocks=blocks, other={k: fn(v) for k, v in view.other.items()})


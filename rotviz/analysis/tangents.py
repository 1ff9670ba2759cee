"""The flat directions that symmetry explains: tangents of the continuous symmetry group at
any parameter set of a model, and gauge fixing (docs/landscape.md). The geometry only: the
`flat` measurement that checks the loss along them is rotviz.measures.flat.

The group (rotviz.symmetry.actions) acts per block and per key/value group g by a Q-K map A
(W_Q -> A^T W_Q, b_Q -> b_Q A, W_K -> A^-1 W_K, b_K -> b_K A^-T) and a V-O map B (W_V -> B^T
W_V, b_V -> b_V B, W_O[:, h] -> W_O[:, h] B^-T), and, for gated or ReLU FFNs, by per-unit
scales of the up row and the inverse of the down column. Along A = I + eps E the parameters
move, to first order, by the tangent (derivative at eps = 0, d(A^-1)/deps = -E):

    dW_Q = E^T W_Q, db_Q = b_Q E, dW_K = -E W_K, db_K = -b_K E^T      (Q-K, generator E)
    dW_V = E^T W_V, db_V = b_V E, dW_O[:, h] = -W_O[:, h] E^T          (V-O)
    dW_in[k] = W_in[k], db_in[k] = b_in[k], dW_out[:, k] = -W_out[:, k]  (FFN unit k)

The generators E span the group's Lie algebra: every elementary matrix E_ij for plain
attention (H_kv d_h^2 per block and per map); under rotary embeddings only the maps that
commute with the position rotations, per frequency pair (i, j) a scale E_ii + E_jj and a
rotation E_ji - E_ij, and any E_uv on the dims the rotation leaves alone (partial rotary);
under per-head q/k norms (Qwen3) only rotations, of the pairs (and free dims) whose gains are
equal, since the norm divides out any scale and the sign flips of the other pairs are
discrete. The view -> state-dict map (`write_block`) only reshapes, transposes and
concatenates, so it is linear and a tangent of the view is written as one of the state dict.

The residual stream adds one model-wide map Q (rotviz.symmetry.residual: every writer and
reader of the d-dimensional stream, embeddings and head included), where the family allows a
continuous one: orthogonal O(d) for pre-norm RMSNorm, orthogonal with Q 1 = 1 for pre-norm
LayerNorm, both once the norm gains are folded into the readers; none on a post-norm stream
(permutations only, a discrete group), nor when a tied head or zero gains block the folding.
At the model's own parameters (gains not folded) the group acts conjugated by the folding,
theta -> restore(R_Q(canonicalise(theta))): writers turn by Q, a reader W by diag(g) Q
diag(1/g), a LayerNorm bias b by ((b / g) Q) g; the function is kept exactly, and since each
step is affine in Q, the tangent of a generator E (antisymmetric; for LayerNorm with E 1 = 0)
is R(E) - R(0) evaluated through that same map. Its dimension, d(d-1)/2 (or (d-1)(d-2)/2),
is counted once for the model.

Since the loss is constant along each orbit, L(g . theta) = L(theta), differentiating at the
identity gives grad L . t = 0 for every tangent t: the gradient is orthogonal to the orbit.
Differentiating twice gives t^T H t = -grad L . (Dt) t, which vanishes at a critical point:
the curvature along the tangents is near zero at a trained model, not at a random one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from rotviz.errors import RotvizError
from rotviz.groups import rope_free, rope_pairs
from rotviz.sources.loading import Loaded
from rotviz.symmetry.actions import LayerTransform, apply_layer, gain_rows, qk_fixed_pairs
from rotviz.symmetry.view import FFN, Attention, ModelView, read_view, write_block, write_state

Tensor = torch.Tensor
F64 = torch.float64


RESIDUAL = -1  # the `layer` of a residual generator: one map for the whole model


@dataclass(frozen=True)
class Generator:
    """One Lie-algebra generator: its block (RESIDUAL for the stream's map), kind ('qk',
    'vo', 'ffn' or 'residual'), KV group (or unit), the d_h x d_h matrix E (None for an FFN
    unit scale and for a residual generator, whose d x d matrix `residual_matrix` builds from
    `pair`: d^2 floats each would not fit memory at d = 4096)."""

    layer: int
    kind: str
    group: int
    e: Tensor | None
    label: str
    pair: tuple[int, int] | None = None  # residual: the plane (i, j) it turns


def _elementary(dh: int, i: int, j: int) -> Tensor:
    e = torch.zeros(dh, dh, dtype=F64)
    e[i, j] = 1.0
    return e


def qk_generators(attn: Attention, rope: str | None, qk_norm: bool) -> list[tuple[Tensor, str]]:
    """The Q-K generators E of one KV group (see the module docstring)."""
    dh = attn.wq.shape[1]
    if rope is None:
        if qk_norm:  # norms without rotary: orthogonal maps commuting with the gains
            return _antisymmetric(attn, list(range(dh)))
        return [(_elementary(dh, i, j), f"E{i},{j}") for i in range(dh) for j in range(dh)]
    first, second = rope_pairs(dh, rope)
    fixed = qk_fixed_pairs(attn, rope) if qk_norm else None
    out = []
    for p, (i, j) in enumerate(zip(first.tolist(), second.tolist(), strict=True)):
        rot = _elementary(dh, j, i) - _elementary(dh, i, j)
        if qk_norm:
            if not bool(fixed[p]):
                out.append((rot, f"rot{i},{j}"))
            continue
        out.append((_elementary(dh, i, i) + _elementary(dh, j, j), f"scale{i},{j}"))
        out.append((rot, f"rot{i},{j}"))
    free = rope_free(dh, rope).tolist()
    if qk_norm:
        out += _antisymmetric(attn, free)
    else:
        out += [(_elementary(dh, u, v), f"E{u},{v}") for u in free for v in free]
    return out


def _antisymmetric(attn: Attention, dims: list[int]) -> list[tuple[Tensor, str]]:
    """Rotations of dim pairs (u, v) whose query and key gains are equal (q/k norms)."""
    dh = attn.wq.shape[1]
    gq, gk = gain_rows(attn)  # every head's gains where the norm spans the projection
    return [(_elementary(dh, v, u) - _elementary(dh, u, v), f"rot{u},{v}")
            for a, u in enumerate(dims) for v in dims[a + 1:]
            if bool((gq[:, u] == gq[:, v]).all()) and bool((gk[:, u] == gk[:, v]).all())]


def ffn_has_scales(ffn: FFN) -> bool:
    """Per-unit scales are a continuous symmetry of gated FFNs and ReLU FFNs only."""
    return ffn.w_gate is not None or ffn.activation == "relu"


def residual_group(view: ModelView) -> tuple[str | None, str | None]:
    """(group, why): the continuous residual group this model allows ('orthogonal' or
    'centred', as rotviz.symmetry.residual decides for matching) and None, or None and why
    there is none (a post-norm stream, a tied head, zero gains)."""
    from rotviz.symmetry.residual import GROUP_TEXT, canonicalise, group_of

    group = group_of(view)
    if group == "permutation":
        return None, (f"{view.spec.family}'s stream allows only {GROUP_TEXT[group]}: a "
                      "discrete group, without tangents")
    try:
        canonicalise(view)
    except RotvizError as e:
        return None, str(e)
    return group, None


def residual_dimension(d: int, group: str | None) -> int:
    """d(d-1)/2 for O(d); (d-1)(d-2)/2 for the orthogonal maps that keep all-ones; 0 else."""
    if group == "orthogonal":
        return d * (d - 1) // 2
    if group == "centred":
        return (d - 1) * (d - 2) // 2
    return 0


def residual_generators(view: ModelView) -> list[Generator]:
    """The residual generators: one per plane (i, j), i < j, of the stream (of the
    complement of all-ones for the centred group); none where the model allows no map."""
    group, _ = residual_group(view)
    if group is None:
        return []
    n = view.dims.d_model - (group == "centred")
    tag = "residual" if group == "orthogonal" else "residual centred"
    return [Generator(RESIDUAL, "residual", 0, None, f"{tag} rot{i},{j}", (i, j))
            for i in range(n) for j in range(i + 1, n)]


def residual_matrix(view: ModelView, gen: Generator) -> Tensor:
    """The d x d antisymmetric E of a residual generator: E_ji - E_ij, or for the centred
    group B (E_ji - E_ij) B^T with B an orthonormal basis of the complement of all-ones
    (so E 1 = 0 and exp(s E) keeps all-ones)."""
    from rotviz.groups import ones_complement
    from rotviz.symmetry.residual import group_of

    d = view.dims.d_model
    i, j = gen.pair
    if group_of(view) == "orthogonal":
        return _elementary(d, j, i) - _elementary(d, i, j)
    b = ones_complement(d)
    return b @ (_elementary(d - 1, j, i) - _elementary(d - 1, i, j)) @ b.T


def generators(view: ModelView, residual: bool = True) -> list[Generator]:
    """Every generator of the continuous group, block by block: Q-K, V-O, FFN scales; then
    (with `residual`) the stream's map, once for the model."""
    dims = view.dims
    out: list[Generator] = []
    for li, blk in enumerate(view.blocks):
        a = blk.attn
        qk = qk_generators(a, dims.rope, dims.qk_norm)
        dh = a.wq.shape[1]
        vo = [(_elementary(dh, i, j), f"E{i},{j}") for i in range(dh) for j in range(dh)]
        for g in range(a.n_kv_heads):
            out += [Generator(li, "qk", g, e, f"L{li} qk g{g} {s}") for e, s in qk]
        for g in range(a.n_kv_heads):
            out += [Generator(li, "vo", g, e, f"L{li} vo g{g} {s}") for e, s in vo]
        if ffn_has_scales(blk.ffn):
            out += [Generator(li, "ffn", k, None, f"L{li} ffn unit {k}")
                    for k in range(blk.ffn.w_in.shape[0])]
    if residual:
        out += residual_generators(view)
    return out


def group_dimension(view: ModelView) -> list[dict]:
    """The group's dimension per block, derived from the dims (not by counting generators):
    plain attention 2 H_kv d_h^2; rotary r + f^2 per Q-K map (r rotated dims, f free);
    per-head q/k norms: the pairs with equal gains; plus d_ffn for gated or ReLU FFNs. Then
    one row for the residual stream's map (layer 'residual'): its group, its dimension
    (`residual_dimension`) and, where there is none, why."""
    dims = view.dims
    rows = []
    for li, blk in enumerate(view.blocks):
        a = blk.attn
        h_kv, dh = a.n_kv_heads, a.wq.shape[1]
        if dims.qk_norm:
            qk = len(qk_generators(a, dims.rope, True))
        elif dims.rope is None:
            qk = dh * dh
        else:
            r = 2 * len(rope_pairs(dh, dims.rope)[0])
            f = dh - r
            qk = r + f * f
        ffn = blk.ffn.w_in.shape[0] if ffn_has_scales(blk.ffn) else 0
        rows.append({"layer": li, "qk": h_kv * qk, "vo": h_kv * dh * dh, "ffn": ffn,
                     "total": h_kv * qk + h_kv * dh * dh + ffn})
    group, why = residual_group(view)
    n = residual_dimension(dims.d_model, group)
    rows.append({"layer": "residual", "qk": 0, "vo": 0, "ffn": 0, "residual": n, "total": n,
                 "group": group, "why": why})
    return rows


def _zero_like(obj):
    return replace(obj, **{f: torch.zeros_like(getattr(obj, f))
                           for f in obj.__dataclass_fields__
                           if isinstance(getattr(obj, f), torch.Tensor)})


def _zero_block(view: ModelView, layer: int) -> tuple:
    """Zeros shaped like block `layer`'s attention, FFN and norms (never written: every
    change below clones)."""
    blk = view.blocks[layer]
    return (_zero_like(blk.attn), _zero_like(blk.ffn),
            {s: _zero_like(n) for s, n in blk.norms.items()})


def _tangent_block(view: ModelView, gen: Generator, zeros: tuple | None = None):
    """The generator's tangent as a block of the view (zero where nothing moves); `zeros`:
    `_zero_block` of its layer, when the caller reuses it across generators."""
    blk = view.blocks[gen.layer]
    a, f = blk.attn, blk.ffn
    za, zf, zn = zeros or _zero_block(view, gen.layer)
    if gen.kind == "ffn":
        k = gen.group
        w_in = zf.w_in.clone()
        w_in[k] = f.w_in[k]
        w_out = zf.w_out.clone()
        w_out[:, k] = -f.w_out[:, k]
        b_in = None
        if f.b_in is not None:
            b_in = zf.b_in.clone()
            b_in[k] = f.b_in[k]
        return replace(blk, attn=za, ffn=replace(zf, w_in=w_in, w_out=w_out, b_in=b_in),
                       norms=zn)
    e = gen.e.to(a.wq)
    r = a.n_heads // a.n_kv_heads
    heads = list(range(gen.group * r, (gen.group + 1) * r))
    g = gen.group

    def put(z: Tensor | None, idx, value: Tensor | None) -> Tensor | None:
        if z is None:
            return None
        z = z.clone()
        z[idx] = value
        return z

    if gen.kind == "qk":
        new = {"wq": put(za.wq, heads, e.T @ a.wq[heads]),
               "wk": put(za.wk, g, -e @ a.wk[g])}
        if a.bq is not None:
            new["bq"] = put(za.bq, heads, a.bq[heads] @ e)
        if a.bk is not None:
            new["bk"] = put(za.bk, g, -a.bk[g] @ e.T)
        if a.wpq is not None:
            new["wpq"] = put(za.wpq, heads, e.T @ a.wpq[heads])
            if a.bpq is not None:
                new["bpq"] = put(za.bpq, heads, a.bpq[heads] @ e)
        if a.wpk is not None:
            new["wpk"] = put(za.wpk, g, -e @ a.wpk[g])
            if a.bpk is not None:
                new["bpk"] = put(za.bpk, g, -a.bpk[g] @ e.T)
    else:
        new = {"wv": put(za.wv, g, e.T @ a.wv[g]), "wo": put(za.wo, heads, -a.wo[heads] @ e.T)}
        if a.bv is not None:
            new["bv"] = put(za.bv, g, a.bv[g] @ e)
    return replace(blk, attn=replace(za, **new), ffn=zf, norms=zn)


def f64_view(loaded: Loaded, state: Mapping[str, Tensor] | None) -> ModelView:
    """The canonical view of `state` (the model's own by default) in float64, written back
    in float64 (so a transformed state is not rounded to the checkpoint's dtype)."""
    st = loaded.state if state is None else state
    view = read_view(loaded.spec, loaded.config, st).to(F64)
    return replace(view, dtypes={k: F64 for k in view.dtypes})


def parameter_names(loaded: Loaded) -> list[str]:
    """The floating trainable parameters in the module's order (tied weights once): the
    coordinates of every flat vector here, as rotviz.analysis.hvp.Curvature orders them."""
    return [n for n, p in loaded.model.named_parameters() if p.is_floating_point()]


def tangents(loaded: Loaded, state: Mapping[str, Tensor] | None = None,
             gens: list[Generator] | None = None) -> tuple[list[str], Tensor, list[Generator]]:
    """(names, T, generators): one tangent per row of T (k x P, float64) over the floating
    parameters `names`, for every generator (or the given ones)."""
    view = f64_view(loaded, state)
    names = parameter_names(loaded)
    st = loaded.state if state is None else state
    offsets, start = {}, 0
    for n in names:
        offsets[n] = (start, st[n].numel())
        start += st[n].numel()
    gens = generators(view) if gens is None else gens
    t = torch.zeros(len(gens), start, dtype=F64)
    frame = None
    for row, gen in enumerate(gens):
        if gen.kind == "residual":
            frame = frame or ResidualFrame.of(view)
            part = frame.tangent(residual_matrix(view, gen))
            for key, (o, size) in offsets.items():
                t[row, o:o + size] = part[key].reshape(-1)
            continue
        prefix = view.layout.blocks[gen.layer]
        part = write_block(view, _tangent_block(view, gen), prefix)
        for key, val in part.items():
            if key in offsets:
                o, size = offsets[key]
                t[row, o:o + size] = val.reshape(-1)
    return names, t, gens


@dataclass(frozen=True)
class ResidualFrame:
    """The residual action at one model, written in its own gauge: `at(Q)` is the state
    restore(R_Q(canonicalise(view))) (see the module docstring), affine in Q; `base` is its
    value at Q = 0, so `tangent(E)` = at(E) - base is the derivative along E, exactly."""

    canon: ModelView
    gauge: object  # rotviz.symmetry.residual.Gauge
    base: Mapping[str, Tensor]

    @classmethod
    def of(cls, view: ModelView) -> ResidualFrame:
        from rotviz.symmetry.residual import canonicalise

        canon, gauge = canonicalise(view)
        frame = cls(canon, gauge, {})
        d = view.dims.d_model
        return replace(frame, base=frame.at(torch.zeros(d, d, dtype=F64), check=False))

    def at(self, q: Tensor, check: bool = True) -> dict[str, Tensor]:
        from rotviz.symmetry.residual import apply_residual, restore

        return write_state(restore(apply_residual(self.canon, q, check=check), self.gauge))

    def tangent(self, e: Tensor) -> dict[str, Tensor]:
        moved = self.at(e, check=False)
        return {k: v - self.base[k] for k, v in moved.items()}


def gauge_fixed(directions: Tensor, t: Tensor) -> Tensor:
    """`directions` (P,) or (m, P) with span(T) projected out: d - Q Q^T d, Q an orthonormal
    basis of the tangents' span by a reduced QR of T^T. Householder QR keeps Q orthonormal
    even when tangents are dependent (Q then spans a little more than span(T)); either way
    the result is orthogonal to every tangent, so moving along it changes the function."""
    if t.shape[0] == 0:
        return directions.clone()
    q, _ = torch.linalg.qr(t.to(F64).T, mode="reduced")
    d = directions.to(F64)
    return d - (d @ q) @ q.T


def element(view: ModelView, gen: Generator, s: float) -> LayerTransform:
    """The finite group element exp(s E) on `gen`'s group (identity elsewhere); for a block
    generator only (a residual one is `ResidualFrame.at(exp(s E))`)."""
    blk = view.blocks[gen.layer]
    if gen.kind == "ffn":
        sc = torch.ones(blk.ffn.w_in.shape[0], dtype=F64)
        sc[gen.group] = math.exp(s)
        return LayerTransform(ffn_scale=sc)
    h_kv, dh = blk.attn.n_kv_heads, blk.attn.wq.shape[1]
    m = torch.eye(dh, dtype=F64).repeat(h_kv, 1, 1)
    m[gen.group] = torch.linalg.matrix_exp(s * gen.e)
    return LayerTransform(qk=m) if gen.kind == "qk" else LayerTransform(vo=m)


def moved_state(view: ModelView, gen: Generator, s: float) -> dict[str, Tensor]:
    """The state dict (float64) after the finite element exp(s E) of `gen`."""
    if gen.kind == "residual":
        return ResidualFrame.of(view).at(torch.linalg.matrix_exp(s * residual_matrix(view, gen)))
    return write_state(apply_layer(view, gen.layer, element(view, gen, s)))


@dataclass(frozen=True)
class TangentBlock:
    """The tangents of one (block, kind, KV group or FFN unit): they touch only `idx` (flat
    coordinates over `parameter_names`), where their values are the rows of `t`."""

    layer: int
    kind: str
    group: int
    idx: Tensor  # (c,) long
    t: Tensor  # (k, c) float64


def tangent_blocks(loaded: Loaded, state: Mapping[str, Tensor] | None = None
                   ) -> list[TangentBlock]:
    """Every block tangent, grouped by the coordinates it touches (the residual map's
    tangents move every block at once, so they are left out: gauge fixing here removes the
    blocks' symmetries, not the stream's). Tangents of different KV groups,
    kinds, FFN units and blocks move disjoint entries (other heads' rows, other units' rows
    and columns, other blocks' tensors), so span(T) is a direct sum of these small pieces
    and projecting it out needs no k x P matrix (8192 x 136138 in float64, 9 GB, for the
    default pair's ViT): one QR per piece."""
    view = f64_view(loaded, state)
    names = parameter_names(loaded)
    st = loaded.state if state is None else state
    offsets, start = {}, 0
    for n in names:
        offsets[n] = (start, st[n].numel())
        start += st[n].numel()
    clusters: dict[tuple[int, str, int], list[Generator]] = {}
    for g in generators(view, residual=False):
        clusters.setdefault((g.layer, g.kind, g.group), []).append(g)
    out: list[TangentBlock] = []
    zeros: dict[int, tuple] = {}
    for (layer, kind, group), gens in clusters.items():
        prefix = view.layout.blocks[layer]
        if layer not in zeros:
            zeros[layer] = _zero_block(view, layer)
        # each generator's tangent, kept on the tensors it moves only (a Q-K map leaves
        # the FFN, the V-O maps and the norms at zero), so the cluster's matrix is as wide
        # as the tensors the cluster touches, not as the block
        keys = _moved_keys(view, gens, zeros[layer], prefix, offsets)
        rows = []
        for gen in gens:
            part = write_block(view, _tangent_block(view, gen, zeros[layer]), prefix)
            rows.append(torch.cat([part[k].reshape(-1) for k in keys]))
        local = torch.stack(rows)
        glob = torch.cat([torch.arange(offsets[k][0], offsets[k][0] + offsets[k][1])
                          for k in keys])
        used = local.ne(0).any(dim=0)
        out.append(TangentBlock(layer, kind, group, glob[used], local[:, used]))
    seen = torch.zeros(start, dtype=torch.bool)
    for b in out:
        if bool(seen[b.idx].any()):
            raise RotvizError(f"tangents of block {b.layer} ({b.kind}) overlap another "
                              "group's; use gauge_fixed with the dense tangents")
        seen[b.idx] = True
    return out


def _moved_keys(view: ModelView, gens: list[Generator], zeros: tuple, prefix: str,
                offsets: Mapping[str, tuple[int, int]]) -> list[str]:
    """The tensors some generator of one cluster moves. A tangent is linear in its
    generator, so a tensor moves under some E_i exactly when it moves (almost surely) under
    a seeded random combination sum c_i E_i: one tangent to inspect instead of one each."""
    g = gens[0]
    if g.e is not None and len(gens) > 1:
        c = torch.randn(len(gens), generator=torch.Generator().manual_seed(0), dtype=F64)
        g = replace(g, e=torch.einsum("k,kij->ij", c, torch.stack([x.e.to(F64) for x in gens])))
    part = write_block(view, _tangent_block(view, g, zeros), prefix)
    return [k for k, v in part.items() if k in offsets and bool(v.any())]


def gauge_fixed_blockwise(directions: Tensor, blocks: list[TangentBlock]) -> Tensor:
    """`gauge_fixed` piece by piece (see `tangent_blocks`): the same projection."""
    d = directions.to(F64).clone()
    two = d.dim() == 2
    d2 = d if two else d[None]
    for b in blocks:
        q, _ = torch.linalg.qr(b.t.T, mode="reduced")
        part = d2[:, b.idx]
        d2[:, b.idx] = part - (part @ q) @ q.T
    return d2 if two else d2[0]

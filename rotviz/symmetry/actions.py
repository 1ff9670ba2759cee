"""Symmetry actions on the canonical view. Each returns new tensors; inputs are never touched.

Conventions (row vectors, `y = x W^T + b`, docs/conventions.md):
- FFN permutation `perm`: new unit k is old unit perm[k]. A gated FFN's gate rows move with
  the up rows and the down columns.
- FFN scale `ffn_scale` (gated FFNs; ReLU with positive scales): after the permutation, unit k's
  up row (and bias) times s[k], its down column divided by s[k]; the gate never changes.
- Q-K map A (per KV group, invertible): W_Q -> A^T W_Q, b_Q -> b_Q A for every query head of the
  group, W_K -> A^-1 W_K, b_K -> b_K A^-T. Scores q k^T are unchanged because A A^-1 = I.
- V-O map B (per KV group, invertible): W_V -> B^T W_V, b_V -> b_V B, W_O[:, h] -> W_O[:, h] B^-T
  for every query head h of the group.
- Without grouped-query attention a KV group is one head (H_kv = H). Maps that differ between
  the query heads of one group break the function; the (H_kv, d_h, d_h) shape rules them out.
- Rotary embeddings: a Q-K map must commute with every position rotation, i.e. be a 2x2
  rotation times a scale on each frequency pair (`rope_pairs`) and zero elsewhere.
- Head permutation `heads`: new head k is old head heads[k] (its Q rows, bias and W_O columns
  move together, and with them its K and V rows when H_kv = H). Under grouped-query attention
  it must move whole groups: the heads of new group g are the heads of one old group, in any
  order; K and V follow the groups. Applied before the Q-K and V-O maps, which act on new
  heads.
- Per-head q/k RMSNorms before RoPE (Qwen3), gains g_q, g_k (d_h,) shared by the heads:
  q -> norm(q A) g_q must equal (norm(q) g_q) A. RMS(q A) = RMS(q) needs A orthogonal (a
  scale is divided out by the norm, and only up to its eps, so Q-K scales are not in the
  group); then norm(q) A diag(g) = norm(q) diag(g) A needs A to commute with diag(g_q) and
  diag(g_k), and with RoPE. A rotation by theta of pair (i, j) commutes with diag(g) iff
  g_i = g_j or theta is 0 or pi. So per pair: any angle where both gains are equal on the
  pair (e.g. at their all-ones init), else only a sign flip of the pair (`qk_fixed_pairs`).
  The group never shrinks to the identity: the sign flips always remain.
- q/k RMSNorms over the whole projection (OLMo-2: one norm over all H d_h query values, one
  over the H_kv d_h key values, a gain per head and dim): RMS([q_1 A, ..., q_H A]) =
  RMS([q_1, ..., q_H]) for every input iff each head's A is orthogonal (no scale: scaling one
  head's queries changes the RMS that divides every head's), and then each head's
  normalised q_h A diag(g_h) = q_h diag(g_h) A needs A to commute with the gains of every
  query head of its group and with its key head's: per pair, a free angle where all of those
  gains are equal on the pair, else a sign flip. rotviz turns a pair only where the gains are
  equal on it in every head of the layer (`qk_fixed_pairs`: a subgroup that a head
  permutation does not change); `qk_norm_admits` checks the exact per-group condition. Head
  permutations keep the RMS and move each head's gain rows with it (`permute_heads`).
The seed paper's group uses A = a R and B = b R with R orthogonal and a, b non-zero scalars.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from rotviz.errors import RotvizError
from rotviz.groups import random_orthogonal, random_rope_maps, rope_free, rope_maps, rope_pairs
from rotviz.symmetry.registry import SYMMETRIES
from rotviz.symmetry.view import FFN, Attention, Dims, ModelView

Tensor = torch.Tensor


@dataclass(frozen=True)
class LayerTransform:
    """One group element acting on one block. None means identity."""

    perm: Tensor | None = None  # (m,) long
    qk: Tensor | None = None  # (H_kv, d_h, d_h), one map per KV group
    vo: Tensor | None = None  # (H_kv, d_h, d_h)
    heads: Tensor | None = None  # (H,) long, applied before qk and vo
    ffn_scale: Tensor | None = None  # (m,), applied after perm, to the permuted units

    def then(self, other: LayerTransform) -> LayerTransform:
        """The element that applies `self` first, then `other`.

        `other`'s head permutation p2 carries `self`'s per-group maps along: new group g gets
        old group q2[g] (q2: p2 on groups) and the map A1[q2[g]] A2[g]. Likewise `other`'s
        FFN permutation carries `self`'s unit scales: s = s1[p2] * s2."""
        perm = _compose_opt(self.perm, other.perm, lambda p1, p2: p1[p2])
        p2 = other.heads
        qk1 = self.qk if self.qk is None or p2 is None else self.qk[_group_index(p2, self.qk)]
        vo1 = self.vo if self.vo is None or p2 is None else self.vo[_group_index(p2, self.vo)]
        qk = _compose_opt(qk1, other.qk, lambda a1, a2: a1 @ a2.to(a1.dtype))
        vo = _compose_opt(vo1, other.vo, lambda b1, b2: b1 @ b2.to(b1.dtype))
        heads = _compose_opt(self.heads, other.heads, lambda h1, h2: h1[h2])
        s1 = self.ffn_scale
        if s1 is not None and other.perm is not None:
            s1 = s1[other.perm.to(s1.device)]
        scale = _compose_opt(s1, other.ffn_scale, lambda a, b: a * b.to(a))
        return LayerTransform(perm, qk, vo, heads, scale)


def _group_index(heads: Tensor, maps: Tensor) -> Tensor:
    """The KV-group permutation of a head permutation, for indexing per-group `maps`."""
    return group_permutation(heads, maps.shape[0]).to(maps.device)


def group_permutation(heads: Tensor, n_kv: int) -> Tensor:
    """The KV groups' permutation (new group g is old group q[g]) carried by a head permutation
    (new head k is old head heads[k]) of H query heads in `n_kv` groups. The heads of each new
    group must all come from one old group; anything else breaks grouped-query attention."""
    h = heads.shape[0]
    if n_kv == h:
        return heads
    if n_kv <= 0 or h % n_kv:
        raise RotvizError(f"{h} heads cannot form {n_kv} key/value groups; check the model's dims")
    r = h // n_kv
    old_groups = heads.reshape(n_kv, r) // r
    q = old_groups[:, 0]
    if not bool((old_groups == q[:, None]).all()) or len(set(q.tolist())) != n_kv:
        raise RotvizError(
            "this head permutation splits a key/value group: under grouped-query attention "
            "heads may move only with their whole group (and be reordered inside it)"
        )
    return q


def _compose_opt(x, y, fn):
    if x is None:
        return y
    if y is None:
        return x
    return fn(x, y)


def _row_times(b: Tensor | None, m: Tensor) -> Tensor | None:
    """Per-head row vector times matrix: (H, d_h) x (H, d_h, d_h)."""
    return None if b is None else (b.unsqueeze(1) @ m).squeeze(1)


def permute_ffn(ffn: FFN, perm: Tensor) -> FFN:
    """New unit k is old unit perm[k]: up (in) rows, gate rows and down (out) columns. The
    identity returns `ffn` itself (its tensors are never modified), so unchanged layers keep
    their tensor objects."""
    perm = perm.to(ffn.w_in.device)
    if torch.equal(perm, torch.arange(len(perm), device=perm.device)):
        return ffn

    def rows(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[perm]

    return replace(
        ffn,
        w_in=ffn.w_in[perm],
        b_in=rows(ffn.b_in),
        w_out=ffn.w_out[:, perm],
        w_gate=rows(ffn.w_gate),
        b_gate=rows(ffn.b_gate),
    )


def scale_ffn(ffn: FFN, s: Tensor) -> FFN:
    """Unit k's up row and bias times s[k], its down column divided by s[k]; never the gate.

    A symmetry of gated FFNs (act(gate) * up is linear in up) for any s != 0, and of ReLU FFNs
    for s > 0; for any other FFN it changes the function, so it is refused."""
    if ffn.w_gate is None:
        if ffn.activation != "relu":
            raise RotvizError(
                f"per-unit FFN scaling is a symmetry only of gated FFNs and ReLU FFNs, not of a "
                f"{ffn.activation} FFN; leave ffn_scale out for this model"
            )
        if not bool((s > 0).all()):
            raise RotvizError(
                "per-unit scales of a ReLU FFN must be positive (a negative scale flips the "
                "ReLU); use scales > 0"
            )
    if not bool((s != 0).all()):
        raise RotvizError("a per-unit FFN scale of 0 is not invertible; use non-zero scales")
    s = s.to(ffn.w_in)
    return replace(
        ffn,
        w_in=ffn.w_in * s[:, None],
        b_in=None if ffn.b_in is None else ffn.b_in * s,
        w_out=ffn.w_out / s,
    )


def permute_heads(attn: Attention, heads: Tensor) -> Attention:
    """New head k is old head heads[k]: Q rows, their biases and W_O columns together; K and V
    follow the KV groups (see `group_permutation`)."""
    if tuple(heads.shape) != (attn.n_heads,) or sorted(heads.tolist()) != list(range(attn.n_heads)):
        raise RotvizError(
            f"a head permutation of this model lists each of its {attn.n_heads} heads once, "
            f"not {heads.tolist()}"
        )
    heads = heads.to(attn.wq.device)
    groups = group_permutation(heads, attn.n_kv_heads).to(attn.wq.device)

    def pick(t: Tensor | None, idx: Tensor) -> Tensor | None:
        return None if t is None else t[idx]

    per_head = attn.gq is not None and attn.gq.dim() == 2  # projection q/k norms (OLMo-2)
    if per_head:
        attn = replace(attn, gq=attn.gq[heads], gk=attn.gk[groups])
    return replace(attn, wq=pick(attn.wq, heads), wk=pick(attn.wk, groups),
                   wv=pick(attn.wv, groups), wo=pick(attn.wo, heads), bq=pick(attn.bq, heads),
                   bk=pick(attn.bk, groups), bv=pick(attn.bv, groups),
                   wpq=pick(attn.wpq, heads), bpq=pick(attn.bpq, heads),
                   wpk=pick(attn.wpk, groups), bpk=pick(attn.bpk, groups))


def rope_structured(a: Tensor, rope: str) -> Tensor:
    """Whether each map (..., d_h, d_h) commutes with rotary embeddings: zero outside the
    frequency pairs' 2x2 blocks and each block a rotation times a scale, [[x, -y], [y, x]]
    (up to rounding); on the dims they leave alone (partial rotary) anything goes, but
    nothing may mix those dims with the turned ones. Returns a bool per map."""
    dh = a.shape[-1]
    i, j = (t.to(a.device) for t in rope_pairs(dh, rope))
    k = rope_free(dh, rope).to(a.device)
    allowed = torch.zeros(dh, dh, dtype=torch.bool, device=a.device)
    for u in (i, j):
        for v in (i, j):
            allowed[u, v] = True
    allowed[k[:, None], k] = True
    size = a.abs().amax(dim=(-2, -1))
    tol = 1000 * torch.finfo(a.dtype).eps * size
    outside = a.masked_fill(allowed, 0).abs().amax(dim=(-2, -1))
    diag = (a[..., i, i] - a[..., j, j]).abs().amax(dim=-1)
    anti = (a[..., i, j] + a[..., j, i]).abs().amax(dim=-1)
    return (outside <= tol) & (diag <= tol) & (anti <= tol)


def qk_fixed_pairs(attn: Attention, rope: str | None) -> Tensor | None:
    """Under per-head q/k norms (Qwen3), the frequency pairs that may only turn by 0 or pi:
    those where the query's or the key's gain differs between the pair's two dims (see the
    module docstring). None without q/k norms."""
    if attn.gq is None or rope is None:
        return None
    i, j = rope_pairs(attn.wq.shape[1], rope)
    gq, gk = gain_rows(attn)
    return ((gq[:, i] != gq[:, j]).any(0)) | ((gk[:, i] != gk[:, j]).any(0))


def gain_rows(attn: Attention) -> tuple[Tensor, Tensor]:
    """The q and k norms' gains as rows (n, d_h) on the CPU: one row shared by the heads
    (Qwen3) or one per head (OLMo-2's projection norms)."""
    dh = attn.wq.shape[1]
    return attn.gq.detach().cpu().reshape(-1, dh), attn.gk.detach().cpu().reshape(-1, dh)


def qk_norm_admits(attn: Attention, a: Tensor, rope: str | None) -> bool:
    """Whether every map of `a` (H_kv, d_h, d_h) keeps q/k-normed attention: orthogonal, and
    commuting with the query's and the key's gains (up to rounding)."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    tol = 1000 * torch.finfo(a.dtype).eps
    if float((a.transpose(-1, -2) @ a - eye).abs().max()) > tol:
        return False
    h_kv, dh = a.shape[0], a.shape[-1]
    for g in (attn.gq, attn.gk):
        # (H_kv, rows, d_h): the gains each group's map must commute with (every query head
        # of the group, or the key head, under projection norms; the shared row otherwise)
        gd = g.detach().to(a).reshape(-1, dh)
        gd = gd[None] if gd.shape[0] == 1 else gd.reshape(h_kv, -1, dh)
        am = a[:, None]
        gap = (am * gd[..., None, :] - gd[..., :, None] * am).abs().max()
        if float(gap) > tol * float(gd.abs().max()):
            return False
    return True


def _per_query_head(m: Tensor, n_heads: int) -> Tensor:
    """Per-group maps (H_kv, ...) repeated for the query heads of each group (H, ...)."""
    return m.repeat_interleave(n_heads // m.shape[0], dim=0)


def _check_group_maps(attn: Attention, m: Tensor, what: str) -> None:
    h_kv, dh = attn.n_kv_heads, attn.wq.shape[1]
    if tuple(m.shape) != (h_kv, dh, dh):
        per_head = m.shape[0] == attn.n_heads != h_kv
        raise RotvizError(
            f"{what} maps must have shape ({h_kv}, {dh}, {dh}), one per key/value group, not "
            f"{tuple(m.shape)}"
            + ("; query heads of one group share their map (different maps change the function)"
               if per_head else "")
        )


def transform_qk(attn: Attention, a: Tensor, rope: str | None = None) -> Attention:
    """The Q-K map A (H_kv, d_h, d_h) on every query head of each group and on the group's K.
    With `rope` the maps must commute with the rotary embeddings (see `rope_structured`)."""
    _check_group_maps(attn, a, "Q-K")
    if rope is not None and not bool(rope_structured(a, rope).all()):
        raise RotvizError(
            "Q-K maps under rotary embeddings must be 2x2 rotation-scales per frequency pair "
            "(full rotations change the function); use attn matching, which respects RoPE"
        )
    a = a.to(attn.wq)
    a_inv = torch.linalg.inv(a)
    a_q = _per_query_head(a, attn.n_heads)

    def like_q(w: Tensor | None) -> Tensor | None:
        return None if w is None else a_q.transpose(-1, -2) @ w

    def like_k(w: Tensor | None) -> Tensor | None:
        return None if w is None else a_inv @ w

    return replace(
        attn,
        wq=like_q(attn.wq),
        bq=_row_times(attn.bq, a_q),
        wk=like_k(attn.wk),
        bk=_row_times(attn.bk, a_inv.transpose(-1, -2)),
        wpq=like_q(attn.wpq),  # position projections move as W_Q and W_K (DeBERTa)
        bpq=_row_times(attn.bpq, a_q),
        wpk=like_k(attn.wpk),
        bpk=_row_times(attn.bpk, a_inv.transpose(-1, -2)),
    )


def transform_vo(attn: Attention, b: Tensor) -> Attention:
    """The V-O map B (H_kv, d_h, d_h) on each group's V and on W_O of its query heads."""
    _check_group_maps(attn, b, "V-O")
    b = b.to(attn.wv)
    b_inv_t = _per_query_head(torch.linalg.inv(b).transpose(-1, -2), attn.n_heads)
    return replace(
        attn,
        wv=b.transpose(-1, -2) @ attn.wv,
        bv=_row_times(attn.bv, b),
        wo=attn.wo @ b_inv_t,
    )


ALIBI_HEADS = ("its heads use ALiBi, each with a slope of its own (all different), so a head "
               "permutation changes the function; match without heads")


def check_heads_movable(view: ModelView, what: str = "head permutation") -> None:
    """Refuse moving heads where they are tied to their places (ALiBi's per-head slopes:
    the only permutation keeping every head's slope is the identity)."""
    if view.dims.alibi:
        raise RotvizError(f"no {what} on this {view.spec.family} model: {ALIBI_HEADS}")


def apply_layer(view: ModelView, i: int, t: LayerTransform) -> ModelView:
    blk = view.blocks[i]
    attn, ffn = blk.attn, blk.ffn
    if t.heads is not None and not torch.equal(t.heads.cpu(), torch.arange(len(t.heads))):
        check_heads_movable(view)
    if t.heads is not None:
        attn = permute_heads(attn, t.heads)
    if t.qk is not None and attn.gq is not None and not qk_norm_admits(attn, t.qk, view.dims.rope):
        whose = ("each head's" if view.spec.qk_norm_scope == "head"
                 else "the whole projection of its")
        raise RotvizError(
            f"{view.spec.family} normalises {whose} queries and keys (q_norm, k_norm): a "
            "Q-K map must be orthogonal (no scale) and commute with both gains, i.e. turn a "
            "frequency pair only where its gains are equal (in every head of the group) and "
            "else flip its sign; use attn matching, which keeps to that group"
        )
    if t.qk is not None:
        attn = transform_qk(attn, t.qk, view.dims.rope)
    if t.vo is not None:
        attn = transform_vo(attn, t.vo)
    if t.perm is not None:
        ffn = permute_ffn(ffn, t.perm)
    if t.ffn_scale is not None:
        ffn = scale_ffn(ffn, t.ffn_scale)
    return view.with_block(i, replace(blk, attn=attn, ffn=ffn))


def apply(view: ModelView, transforms: Mapping[int, LayerTransform]) -> ModelView:
    """Apply one group element per block; blocks not named stay the same tensors."""
    for i, t in transforms.items():
        view = apply_layer(view, i, t)
    return view


# ---- random group elements, for tests, demos and the Learn page ----------------------------


def random_head_permutation(dims: Dims, gen: torch.Generator) -> Tensor:
    """A random head permutation that keeps KV groups whole: a random order of the groups and
    a random order of the query heads inside each (a plain random permutation if H_kv = H)."""
    h, h_kv = dims.n_heads, dims.n_kv_heads
    if dims.alibi:  # every head keeps its slope: only the identity (check_heads_movable)
        return torch.arange(h)
    if h_kv == h:
        return torch.randperm(h, generator=gen)
    r = h // h_kv
    groups = torch.randperm(h_kv, generator=gen)
    inside = torch.stack([torch.randperm(r, generator=gen) for _ in range(h_kv)])
    return (groups[:, None] * r + inside).reshape(h)


def random_transform(
    dims: Dims,
    seed: int,
    ffn: bool = True,
    attn: bool = True,
    rescale: bool = True,
    scale_range: tuple[float, float] = (0.5, 2.0),
    heads: bool = False,
) -> LayerTransform:
    """A random element of the seed paper's group for one block (seeded, reproducible),
    shaped by `dims`: one Q-K and one V-O map per KV group, Q-K maps that commute with rotary
    embeddings when `dims.rope` is set (a random angle and, with `rescale`, a scale per
    frequency pair), and per-unit up/down scales of a gated FFN when `ffn` and `rescale`.

    `heads` adds a random head permutation (keeping KV groups whole), drawn last so the other
    parts stay the same. Plain models draw exactly what they drew before these cases existed."""
    gen = torch.Generator().manual_seed(seed)
    h, dh = dims.n_kv_heads, dims.d_head
    perm = torch.randperm(dims.d_ffn, generator=gen) if ffn else None
    qk = vo = None
    if attn or rescale:
        eye = torch.eye(dh, dtype=torch.float64).expand(h, dh, dh)
        if dims.qk_norm:  # q/k norms: a random sign per frequency pair, valid for any gains
            n = len(rope_pairs(dh, dims.rope)[0]) if dims.rope else dh // 2
            signs = (torch.randint(0, 2, (h, n), generator=gen, dtype=torch.float64) * 2 - 1
                     if attn else torch.ones(h, n, dtype=torch.float64))
            qk = rope_maps(signs, torch.zeros_like(signs), dims.rope or "rotate_half")
        elif dims.rope is None:
            qk = random_orthogonal(h, dh, gen) if attn else eye.clone()
        else:
            qk = random_rope_maps(h, dh, dims.rope, gen, rotate=attn,
                                  scale_range=scale_range if rescale else None)
        vo = random_orthogonal(h, dh, gen) if attn else eye.clone()
        if rescale:
            lo, hi = scale_range
            if dims.rope is None and not dims.qk_norm:  # (rotary maps carry theirs per pair)
                qk = qk * (lo + (hi - lo) * torch.rand(h, 1, 1, generator=gen,
                                                       dtype=torch.float64))
            vo = vo * (lo + (hi - lo) * torch.rand(h, 1, 1, generator=gen, dtype=torch.float64))
    ffn_scale = None
    if ffn and rescale and dims.gated:
        lo, hi = scale_range
        ffn_scale = lo + (hi - lo) * torch.rand(dims.d_ffn, generator=gen, dtype=torch.float64)
    head_perm = random_head_permutation(dims, gen) if heads else None
    return LayerTransform(perm, qk, vo, head_perm, ffn_scale)


def random_element(dims: Dims, seed: int, **kinds) -> dict[int, LayerTransform]:
    """A random group element for the whole model: one independent draw per block. `kinds`
    switch the per-layer symmetries of rotviz.symmetry.registry on or off (their `draw`)."""
    known = {s.draw for s in SYMMETRIES if s.scope == "layer"} | {"scale_range"}
    unknown = sorted(set(kinds) - known)
    if unknown:
        raise RotvizError(f"no random draw for {', '.join(unknown)}: use "
                          f"{', '.join(sorted(known))}")
    return {i: random_transform(dims, seed * 1000 + i, **kinds) for i in range(dims.n_layers)}

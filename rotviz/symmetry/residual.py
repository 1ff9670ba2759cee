"""The residual stream's symmetry: one d x d map Q that every writer and reader shares.

Every tensor that touches the stream holds rows that live in it, and Q acts on those rows as
X -> X Q (row vectors, docs/conventions.md): readers W (out, d) -> W Q; writers W (d, in) -> Q^T W
and their biases b -> b Q; embedding tables and tokens (..., d) -> E Q. Which Q keep the
function depends on the norm, and is read from the `ArchSpec`:

- RMSNorm, pre-norm: any orthogonal Q, once the norm gains are folded into the readers;
- LayerNorm, pre-norm: orthogonal Q with Q 1 = 1 ("centred"), once gains are folded (the
  norm keeps a bias beta / gamma, which turns with the stream) and writers are centred;
- LayerNorm on the stream (post-norm): coordinate permutations, with every gain and bias.

Folding and centring (`canonicalise`) change the parameters, not the function. Matching runs
on canonical forms, and `restore` puts the result into the anchor's own gauge (its gains and
writer means), so the anchor never changes and paths between the two are the same functions
as paths between their canonical forms.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

import torch

from rotviz.arch.spec import STREAM_SITES
from rotviz.errors import RotvizError
from rotviz.groups import (
    assign,
    centred_lift,
    ones_complement,
    permutation_matrix,
    random_orthogonal,
    rotation_angles,
)
from rotviz.match.memo import TensorMemo, cached
from rotviz.symmetry.view import FFN, Block, ModelView, Norm

Tensor = torch.Tensor

GROUPS = ("orthogonal", "centred", "permutation")
GROUP_TEXT = {
    "orthogonal": "orthogonal O(d) (RMSNorm)",
    "centred": "orthogonal with Q 1 = 1 (pre-norm LayerNorm)",
    "permutation": "coordinate permutation (a norm on the stream, or on what each layer "
                   "writes to it)",
}


def gain(view: ModelView, weight: Tensor | None) -> Tensor | None:
    """A norm's gain from its stored weight (`ArchSpec.norm_offset`: Gemma stores gain - 1)."""
    off = view.spec.norm_offset
    return weight if weight is None or not off else weight + off


def stored(view: ModelView, g: Tensor) -> Tensor:
    """The stored weight of a norm whose gain is `g`."""
    off = view.spec.norm_offset
    return g if not off else g - off


def moves_with_stream(site: str, group: str) -> bool:
    """Whether a block norm's gain is a vector in the stream that a residual map permutes:
    norms on the stream, and every norm once the group is permutations only."""
    return site in STREAM_SITES or group == "permutation"


def group_of(view: ModelView) -> str:
    """The residual group this architecture has."""
    spec = view.spec
    if spec.placement == "post" or spec.branch_norms or spec.stream_norms:
        return "permutation"  # (a pre-norm model's embedding norm sits on the stream too)
    return "orthogonal" if spec.norm_kind == "rmsnorm" else "centred"


def check_group(view: ModelView, wanted: str | None) -> str:
    """The residual group to solve over: the architecture's own (`auto`), or a subgroup of
    it (permutations fit every stream; centred maps fit RMSNorm). Anything larger is an
    error that says what is allowed."""
    own = group_of(view)
    if wanted in (None, "auto", own):
        return own
    if wanted not in GROUPS:
        raise RotvizError(f"unknown residual group '{wanted}': use auto, {', '.join(GROUPS)}")
    if wanted == "permutation" or (wanted == "centred" and own == "orthogonal"):
        return wanted
    spec = view.spec
    where = ("norms on its sub-layers' outputs" if spec.branch_norms
             else "a norm on its embeddings' output"
             if spec.placement == "pre" and spec.stream_norms
             else f"{spec.placement}-norm {spec.norm_kind}")
    raise RotvizError(
        f"residual {wanted} maps do not exist on {spec.family} ({where}): its stream allows "
        f"only {GROUP_TEXT[own]}; use residual auto"
    )


def unsupported(view: ModelView) -> str | None:
    """Why residual maps cannot be used on this model, or None when they can."""
    lay, spec = view.layout, view.spec
    readers = {f"{r}.weight" for r in lay.readers}
    for module, owner in spec.hidden_ties:
        if f"{module}.weight" in view.other:
            return (f"{module} decodes with the stream writer {owner} from a space of its own; "
                    "match a model with another head (e.g. a classifier), or match without "
                    "residual")
    for alias, owner in tied_pairs(view):
        if owner not in lay.writers:
            continue
        if alias not in readers:
            return (f"{alias} is tied to the stream writer {owner} but reads another space; "
                    "untie them (tie_word_embeddings=false) or match without residual")
        if group_of(view) != "permutation":  # gains are folded into readers
            final = gain(view, _final_gain(view))
            if spec.norm_kind != "rmsnorm" or (final is not None
                                               and not bool((final == 1).all())):
                return (f"the output head {alias} is tied to the embedding {owner}, and the "
                        "final norm's gain cannot be folded into one without the other; use a "
                        "model saved with tie_word_embeddings=false, or match without residual")
    return None


def tied_pairs(view: ModelView) -> list[tuple[str, str]]:
    """The spec's (alias, owner) pairs that this model really ties: one storage, or equal
    values (a copy made on the way, e.g. by a dtype cast)."""
    out = []
    for alias, owner in view.spec.tied:
        a, o = view.other.get(alias), view.other.get(owner)
        if a is None or o is None or a.shape != o.shape:
            continue
        same = a.data_ptr() == o.data_ptr() or bool(torch.equal(a.detach(), o.detach().to(a)))
        if same:
            out.append((alias, owner))
    return out


def _final_gain(view: ModelView) -> Tensor | None:
    fn = view.layout.final_norm
    return None if fn is None else view.other.get(f"{fn}.weight")


# ---- walking the stream's tensors ------------------------------------------------------------


@dataclass(frozen=True)
class Gauge:
    """What `canonicalise` took out of one model: norm gains and writer means, to put back."""

    gains: Mapping[str, Tensor]  # norm id -> gain
    means: Mapping[str, Tensor]  # writer id -> the mean part removed (same shape)


def _norm_ids(view: ModelView) -> Iterator[tuple[str, int | None, str]]:
    """(id, layer, site) of every pre-norm whose output feeds readers."""
    for i, blk in enumerate(view.blocks):
        for site in blk.norms:
            if site in ("attn_in", "ffn_in"):
                yield f"{i}.{site}", i, site
    if view.layout.final_norm is not None and f"{view.layout.final_norm}.weight" in view.other:
        yield "final", None, "final"


def _fold(view: ModelView, gains: Mapping[str, Tensor], inverse: bool) -> ModelView:
    """Move each pre-norm's gain into its readers (inverse: move `gains` back out)."""
    blocks = list(view.blocks)
    other = dict(view.other)

    def g_of(nid: str, norm_w: Tensor) -> Tensor:
        return gains[nid] if inverse else gain(view, norm_w)

    for nid, i, site in _norm_ids(view):
        if i is None:
            key_w = f"{view.layout.final_norm}.weight"
            key_b = f"{view.layout.final_norm}.bias"
            w = other[key_w]
            g = g_of(nid, w).to(w)
            f = 1 / g if inverse else g
            other[key_w] = stored(view, g.clone() if inverse else torch.ones_like(w))
            if key_b in other:
                other[key_b] = other[key_b] * g if inverse else other[key_b] / g
            for r in view.layout.readers:
                other[f"{r}.weight"] = other[f"{r}.weight"] * f
            continue
        blk = blocks[i]
        norm = blk.norms[site]
        g = g_of(nid, norm.weight).to(norm.weight)
        f = 1 / g if inverse else g
        bias = None if norm.bias is None else (norm.bias * g if inverse else norm.bias / g)
        new_norm = Norm(stored(view, g.clone() if inverse else torch.ones_like(norm.weight)),
                        bias, site)
        # one norm feeding both sub-layers (spec.shared_input_norm, Falcon-7B's parallel block)
        both = (site == "attn_in" and view.spec.shared_input_norm
                and "ffn_in" not in blk.norms)
        if site == "attn_in":
            a = blk.attn
            attn = replace(a, wq=a.wq * f, wk=a.wk * f, wv=a.wv * f)
            blk = replace(blk, attn=attn)
        if site == "ffn_in" or both:
            fn = blk.ffn
            blk = replace(blk, ffn=replace(fn, w_in=fn.w_in * f,
                                           w_gate=None if fn.w_gate is None else fn.w_gate * f))
        blocks[i] = replace(blk, norms={**blk.norms, site: new_norm})
    return replace(view, blocks=tuple(blocks), other=other)


def _writer_means(view: ModelView) -> dict[str, Tensor]:
    """Every writer's component along the all-ones direction of the stream."""
    out: dict[str, Tensor] = {}
    for i, blk in enumerate(view.blocks):
        a, f = blk.attn, blk.ffn
        out[f"{i}.wo"] = a.wo.mean(dim=-2, keepdim=True).expand_as(a.wo)
        out[f"{i}.w_out"] = f.w_out.mean(dim=0, keepdim=True).expand_as(f.w_out)
        if a.bo is not None:
            out[f"{i}.bo"] = a.bo.mean().expand_as(a.bo)
        if f.b_out is not None:
            out[f"{i}.b_out"] = f.b_out.mean().expand_as(f.b_out)
    for key in view.layout.writers:
        t = view.other[key]
        dim = 0 if _is_projection(view, key) else -1
        out[key] = t.mean(dim=dim, keepdim=True).expand_as(t)
    return out


def _shift(view: ModelView, means: Mapping[str, Tensor], sign: float) -> ModelView:
    """Add `sign` times each writer's mean part."""
    blocks = []
    for i, blk in enumerate(view.blocks):
        a, f = blk.attn, blk.ffn

        def s(t: Tensor | None, key: str) -> Tensor | None:
            return t if t is None or key not in means else t + sign * means[key].to(t)

        attn = replace(a, wo=s(a.wo, f"{i}.wo"), bo=s(a.bo, f"{i}.bo"))
        ffn = replace(f, w_out=s(f.w_out, f"{i}.w_out"), b_out=s(f.b_out, f"{i}.b_out"))
        blocks.append(replace(blk, attn=attn, ffn=ffn))
    other = dict(view.other)
    for key in view.layout.writers:
        if key in means:
            other[key] = other[key] + sign * means[key].to(other[key])
    return replace(view, blocks=tuple(blocks), other=other)


def _is_projection(view: ModelView, key: str) -> bool:
    return key.endswith(".weight") and any(
        key.endswith(f"{p}.weight") for p in view.spec.projections)


def canonicalise(view: ModelView) -> tuple[ModelView, Gauge]:
    """The same function with every pre-norm gain folded into its readers (the norms keep
    gain 1 and bias beta / gamma) and, for LayerNorm, every writer centred. Post-norm models
    are returned as they are. Gains must be non-zero."""
    if group_of(view) == "permutation":
        return view, Gauge({}, {})
    why = unsupported(view)
    if why:
        raise RotvizError(f"cannot canonicalise {view.spec.family}: {why}")
    gains = {}
    for nid, i, site in _norm_ids(view):
        g = gain(view, view.other[f"{view.layout.final_norm}.weight"] if i is None else
                 view.blocks[i].norms[site].weight)
        if g is None:
            continue
        if bool((g.abs() <= torch.finfo(g.dtype).tiny).any()):
            raise RotvizError(
                f"norm gain {nid} has zero entries, so it cannot be folded into its readers; "
                "match without residual"
            )
        gains[nid] = g.detach().clone()
    out = _fold(view, gains, inverse=False)
    means: dict[str, Tensor] = {}
    if view.spec.norm_kind != "rmsnorm":
        means = {k: v.detach().clone() for k, v in _writer_means(out).items()}
        out = _shift(out, means, -1.0)
    return out, Gauge(gains, means)


def restore(view: ModelView, gauge: Gauge) -> ModelView:
    """A canonical model put into the gauge of another (its gains and writer means)."""
    if not gauge.gains and not gauge.means:
        return view
    out = _shift(view, gauge.means, 1.0) if gauge.means else view
    return _fold(out, gauge.gains, inverse=True)


# ---- the action -------------------------------------------------------------------------------


def _check_element(view: ModelView, q: Tensor, group: str, tol: float = 1e-6) -> None:
    d = view.dims.d_model
    if q.shape != (d, d):
        raise RotvizError(f"residual map must be {d} x {d} for this model, got {tuple(q.shape)}")
    qd = q.detach().double()
    eye = torch.eye(d, dtype=torch.float64, device=qd.device)
    if float((qd.t() @ qd - eye).abs().max()) > tol:
        raise RotvizError("residual map is not orthogonal: only orthogonal maps keep the function")
    if group == "centred":
        ones = torch.ones(d, dtype=torch.float64, device=qd.device)
        if float((qd @ ones - ones).abs().max()) > tol:
            raise RotvizError(
                f"on {view.spec.family} (pre-norm LayerNorm) the residual map must keep the "
                "all-ones vector (Q 1 = 1); a full rotation changes the function. Use a centred "
                "map (rotviz.symmetry.residual.random_map or matching with residual)"
            )
    if group == "permutation" and not bool(((qd - qd.round()).abs() <= tol).all()):
        raise RotvizError(
            f"on {view.spec.family} (a norm sits on the stream) residual rotations "
            "change the function; only coordinate permutations keep it"
        )
    if group != "permutation":
        for nid, i, site in _norm_ids(view):
            g = gain(view, view.other[f"{view.layout.final_norm}.weight"] if i is None else
                     view.blocks[i].norms[site].weight)
            if g is not None and not bool((g == 1).all()):
                raise RotvizError(
                    f"norm gain {nid} is not folded: canonicalise the model "
                    "(rotviz.symmetry.residual.canonicalise) before a residual rotation"
                )


PARTS = ("all", "ffn", "rest")  # what a residual map is applied to or summed over


def _check_part(which: str) -> None:
    if which not in PARTS:
        raise ValueError(f"which must be one of {PARTS}, got {which!r}")


def apply_residual(view: ModelView, q: Tensor, check: bool = True,
                   which: str = "all") -> ModelView:
    """The model with its stream turned by Q: x -> x Q. New tensors; differentiable in Q.

    `which`: "ffn" turns only the blocks' FFN and norm tensors, "rest" everything else, so
    a caller can defer the largest tensors while only the rest moves (rotviz.match.alternating);
    applying both parts equals applying "all"."""
    _check_part(which)
    group = group_of(view)
    if check:
        _check_element(view, q, group)
        why = unsupported(view)
        if why:
            raise RotvizError(f"residual maps unavailable: {why}")
    qt = q.transpose(0, 1)

    def r(t: Tensor | None) -> Tensor | None:  # rows in the stream: t (..., d) -> t Q
        return None if t is None else t @ q.to(t)

    blocks = []
    for blk in view.blocks:
        a, f, norms = blk.attn, blk.ffn, blk.norms
        if which != "ffn":
            a = replace(a, wq=r(a.wq), wk=r(a.wk), wv=r(a.wv), wo=qt.to(a.wo) @ a.wo,
                        bo=r(a.bo), wpq=r(a.wpq), wpk=r(a.wpk))  # (they read stream-space
            # tables: DeBERTa's relative embeddings, which are writers here)
        if which != "rest":
            f = FFN(r(f.w_in), f.b_in, qt.to(f.w_out) @ f.w_out, r(f.b_out), f.activation,
                    r(f.w_gate), f.b_gate)
            norms = {}
            for site, n in blk.norms.items():
                if moves_with_stream(site, group):  # a vector in the stream: permuted with it
                    norms[site] = Norm(r(n.weight), r(n.bias), site)
                else:  # gain 1 (checked); the bias is a vector in the stream
                    norms[site] = Norm(n.weight, r(n.bias), site)
        blocks.append(Block(a, f, norms))
    if which == "ffn":
        return replace(view, blocks=tuple(blocks))
    other = dict(view.other)
    lay = view.layout
    for key in lay.writers:
        t = other[key]
        if _is_projection(view, key):
            other[key] = (qt.to(t) @ t.reshape(t.shape[0], -1)).reshape(t.shape)
        else:
            other[key] = r(t)
    for mod in lay.readers:
        other[f"{mod}.weight"] = r(other[f"{mod}.weight"])
    stream = list(lay.stream_norms) + ([lay.final_norm] if lay.final_norm else [])
    for mod in stream:
        for part in ("weight", "bias"):
            key = f"{mod}.{part}"
            if key in other and (part == "bias" or group == "permutation"):
                other[key] = r(other[key])
    for alias, owner in tied_pairs(view):  # one tensor: the alias follows its owner
        if alias not in {f"{m}.weight" for m in lay.readers}:
            other[alias] = other[owner]
    return replace(view, blocks=tuple(blocks), other=other)


# ---- the matching problem ----------------------------------------------------------------------


Pair = tuple[Tensor | None, Tensor | None, str]  # source tensor, anchor tensor, stream axis


def _rest_pairs(src: ModelView, anc: ModelView) -> list[Pair]:
    """The stream tensors outside the blocks (embeddings, heads, stream norms), paired."""
    lay = src.layout
    tied = {a for a, _ in tied_pairs(src)}
    rest = [(src.other[k], anc.other[k], "first" if _is_projection(src, k) else "last")
            for k in lay.writers]
    rest += [(src.other[f"{mod}.weight"], anc.other[f"{mod}.weight"], "last")
             for mod in lay.readers if f"{mod}.weight" not in tied]
    for mod in list(lay.stream_norms) + ([lay.final_norm] if lay.final_norm else []):
        rest.append((src.other.get(f"{mod}.bias"), anc.other.get(f"{mod}.bias"), "last"))
        if group_of(src) == "permutation":  # gains are permuted, not folded
            rest.append((src.other.get(f"{mod}.weight"), anc.other.get(f"{mod}.weight"), "last"))
    return rest


def cross(src: ModelView, anc: ModelView, memo: TensorMemo | None = None,
          which: str = "all") -> Tensor:
    """M = sum over every stream tensor X_src^T X_anc (d x d, float64): the distance after
    X_src -> X_src Q is constant - 2 tr(Q^T M). With `memo`, the part of M from a group of
    tensors seen before (a block's attention, its FFN and norms, the rest; the same objects)
    is not computed again; one d x d sum per group keeps the memo small. `which` as in
    apply_residual: "ffn" sums the blocks' FFN and norm groups, "rest" the others."""
    _check_part(which)
    d = src.dims.d_model
    # (a view of the tensors outside the blocks alone has no blocks: rotviz.match.at_size_residual)
    dev = (src.blocks[0].attn.wq if src.blocks else next(iter(src.other.values()))).device

    def rows(x: Tensor, layout: str) -> Tensor:  # (n, d): one stream vector per row
        if layout == "heads":  # W_O (H, d, d_h)
            return x.transpose(-1, -2).reshape(-1, d)
        if layout == "first":  # stream on the first axis (writers stored (d, in))
            return x.reshape(d, -1).t()
        return x.reshape(-1, d)

    def part(pairs: list[Pair]) -> Tensor:
        out = torch.zeros(d, d, dtype=torch.float64, device=dev)
        for xs, xa, layout in pairs:
            dtype = torch.promote_types(xs.dtype, torch.float32)
            xs = rows(xs.detach().to(device=dev, dtype=dtype), layout)
            xa = rows(xa.detach().to(device=dev, dtype=dtype), layout)
            out.add_((xs.t() @ xa).to(torch.float64))
        return out

    parts: list[list[Pair]] = []
    group = group_of(src)
    for bs, ba in zip(src.blocks, anc.blocks, strict=True):
        a_s, a_a, f_s, f_a = bs.attn, ba.attn, bs.ffn, ba.ffn
        if which != "ffn":
            parts.append([(a_s.wq, a_a.wq, "last"), (a_s.wk, a_a.wk, "last"),
                          (a_s.wv, a_a.wv, "last"), (a_s.wo, a_a.wo, "heads"),
                          (a_s.bo, a_a.bo, "last"), (a_s.wpq, a_a.wpq, "last"),
                          (a_s.wpk, a_a.wpk, "last")])
        if which == "rest":
            continue
        ffn = [(f_s.w_in, f_a.w_in, "last"), (f_s.w_gate, f_a.w_gate, "last"),
               (f_s.w_out, f_a.w_out, "first"), (f_s.b_out, f_a.b_out, "last")]
        for site, n in bs.norms.items():
            na = ba.norms[site]
            ffn.append((n.bias, na.bias, "last"))
            if moves_with_stream(site, group):
                ffn.append((n.weight, na.weight, "last"))
        parts.append(ffn)
    if which != "ffn":
        parts.append(_rest_pairs(src, anc))
    m = torch.zeros(d, d, dtype=torch.float64, device=dev)
    for pairs in parts:
        pairs = [p for p in pairs if p[0] is not None and p[1] is not None]
        if pairs:
            key = [t for xs, xa, _ in pairs for t in (xs, xa)]
            tag = "cross:" + ",".join(layout for *_, layout in pairs)
            m.add_(cached(memo, tag, key, lambda pairs=pairs: part(pairs)))
    return m


def solve(m: Tensor, group: str) -> Tensor:
    """argmax tr(Q^T M) over the group (float64): Procrustes, centred Procrustes or a linear
    assignment."""
    d = m.shape[0]
    if group == "permutation":
        return permutation_matrix(assign(m.detach().cpu().numpy())).to(m.device)
    if group == "orthogonal":
        u, _, vh = torch.linalg.svd(m)
        return u @ vh
    bz = ones_complement(d, device=m.device)
    u, _, vh = torch.linalg.svd(bz.t() @ m @ bz)
    return centred_lift(u @ vh, bz)


def random_map(view: ModelView, seed: int, group: str | None = None) -> Tensor:
    """A random element of the model's residual group (seeded, float64)."""
    group = check_group(view, group)
    d = view.dims.d_model
    gen = torch.Generator().manual_seed(seed)
    if group == "permutation":
        return permutation_matrix(torch.randperm(d, generator=gen))
    if group == "orthogonal":
        return random_orthogonal(1, d, gen)[0]
    return centred_lift(random_orthogonal(1, d - 1, gen)[0], ones_complement(d))


def angles(q: Tensor, group: str) -> list[float]:
    """Eigen-angles of Q in degrees (largest first); the fixed all-ones axis of a centred map
    is left out. For a permutation: 0 or the angles of its cycles."""
    qd = q.detach().double().cpu()
    if group == "centred":
        bz = ones_complement(qd.shape[0])
        qd = bz.t() @ qd @ bz
    ang, _ = rotation_angles(qd)
    return ang.tolist()

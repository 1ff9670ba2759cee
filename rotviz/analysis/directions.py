"""Directions in parameter space: the one place that draws, normalises and projects them (the
slice record, rotviz.measures.slice, lays its line or plane along them; docs/landscape.md,
"slice"). Seeded random Gaussian directions, the top Hessian eigenvectors, the direction
toward another point, and directions inside (`tangent`) or orthogonal to (`gauge`) the
symmetry orbit's tangent space, each normalised by `filter`, `layer`, `unit` or `none`.
`directions_for` builds any kind.

Each tensor's random directions are drawn from a generator seeded by (seed, the tensor's
parameter name), not from one generator running through the model: a tensor's draw is then
the same whatever order the tensors are read in, which lets a model larger than memory be
sliced at size with exactly the directions drawn here.

Why normalise the directions: a random direction of unit Gaussian entries moves a layer whose
weights are small far more, relative to its scale, than a layer whose weights are large; and
networks with scale symmetries (norms after linear maps) can look sharp or flat at will. Li et
al. (NeurIPS 2018) scale each filter of the direction to the norm of that filter of the
weights, so that one unit along the axis moves every filter by its own size. rotviz offers:

- `filter`: each output row of a weight (first index: the rows of an nn.Linear's (out, in)
  matrix, an embedding's vectors) gets the norm of that row of the weights;
- `layer`: each tensor gets the norm of the tensor;
- `unit`: each FFN unit and each head (a KV group under GQA) together (below);
- `none`: raw Gaussian entries.

Biases and norm gains (1-D tensors) are zeroed by default, as the reference's `biasbn` off;
`keep_1d` keeps them, normalised the same way (with `filter`, a 1-D tensor's rows are its
entries: each entry becomes plus or minus the weight's magnitude). Floating buffers are never
moved. Everything is evaluated through `rotviz.evaluation.Evaluator` (torch.func's
functional_call): the loaded model and the caller's tensors are never modified.

Why `unit` normalisation: filter normalisation scales every output row of a weight to that
row's norm, but a Q-K or V-O rotation mixes the rows of a head, so the filter-normalised
direction of a rotated model is not the rotated direction of the model: the picture depends
on which member of the symmetry class is sliced. `unit` instead scales together what the
symmetry moves together: per FFN unit k its input row(s) (W_in[k], the gate row W_gate[k] of
a gated FFN) and its output column W_out[:, k]; per attention head its Q rows, its K and V
rows and its O columns. Under grouped-query attention several query heads share one K/V
head, and the maps act on the KV group, so the group (its query heads' Q rows and O
columns, its K and V rows) is scaled as one. Permutations and orthogonal maps keep these
groups' norms, so `unit` normalisation commutes with them (tested). Every other tensor
(embeddings, norms, the head) is filter normalised. Biases of a unit or head join its group
when they are kept (`keep_1d`); otherwise they are zeroed, as with every other norm.

Why the order of gauge fixing: a gauge-fixed direction is a seeded random direction,
normalised like a random one, with its component in the span of the symmetry tangents at
the centre projected out (rotviz.analysis.tangents). Normalising *after* the projection
rescales rows and units by different factors, which brings back a component along the
tangents (an FFN unit's tangent is its own rows and column: rescaling them unevenly is not
orthogonal to it). So the normalisation comes first, then the projection, and last one
global factor that gives the direction back the length it had before the projection: a
single scalar keeps every inner product with a tangent at zero. The direction is then
orthogonal to every tangent to rounding, and its rows' norms differ from the weights' by the
small part the projection removed. With biases zeroed the projection is onto the tangents
restricted to the moved (2-D and larger) tensors, so the direction stays zero on biases and
is still orthogonal to the full tangents.

A `tangent` direction is the other part of the same draw: the projection of the normalised
random direction onto the tangents' span, rescaled to the random direction's length. It is
a combination of tangents, so it includes their bias components even when biases are
zeroed (without them it would leave the orbit at first order). Along it the loss is flat to
first order everywhere and, at a trained model, nearly flat to second order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch

from rotviz.analysis.tangents import f64_view
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.limits import SEED
from rotviz.sources.loading import Loaded

Tensor = torch.Tensor
F64 = torch.float64
EPS = 1e-12  # a direction row this small (never, for Gaussian draws) is left as it is
TENSOR_NORMS = ("filter", "layer", "none")  # what one tensor's weights alone normalise
NORMS = ("filter", "layer", "unit", "none")  # `unit` reads a whole block


def normalise(d: Tensor, w: Tensor, norm: str, keep_1d: bool = False) -> Tensor:
    """The direction `d` of one tensor, normalised against its weights `w` (a new tensor).

    `filter`: every row (first index) of d rescaled to the L2 norm of that row of w; a 1-D
    tensor's rows are its entries. `layer`: d rescaled to |w|. `none`: d. A 1-D tensor (bias,
    norm gain) becomes zeros unless `keep_1d`. Computed in float64, returned in d's dtype."""
    if d.dim() <= 1 and not keep_1d:
        return torch.zeros_like(d)
    if norm == "none":
        return d.clone()
    dd, ww = d.double(), w.double()
    if norm == "layer":
        dn = torch.linalg.vector_norm(dd)
        out = dd * (torch.linalg.vector_norm(ww) / dn) if dn > EPS else dd
        return out.to(d.dtype)
    if norm != "filter":
        raise RotvizError(f"unknown --norm '{norm}': use one of {', '.join(TENSOR_NORMS)}")
    rows_d = dd.reshape(dd.shape[0], -1) if dd.dim() >= 1 else dd.reshape(1, 1)
    rows_w = ww.reshape(rows_d.shape)
    dn = torch.linalg.vector_norm(rows_d, dim=1, keepdim=True)
    wn = torch.linalg.vector_norm(rows_w, dim=1, keepdim=True)
    scale = torch.where(dn > EPS, wn / dn.clamp_min(EPS), torch.ones_like(dn))
    return (rows_d * scale).reshape(d.shape).to(d.dtype)


def tensor_seed(seed: int, name: str) -> int:
    """The seed of one tensor's draws, from (`seed`, the tensor's name): a tensor's directions
    then do not depend on which tensors come before it, so a model read block by block (in
    whatever order; the slice at size) draws exactly what the loaded model draws."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def tensor_directions(name: str, w: Tensor, count: int, seed: int = 0, norm: str = "filter",
                      keep_1d: bool = False) -> list[Tensor]:
    """`count` directions of the one tensor `w` called `name` (the module's parameter name):
    Gaussian entries drawn on the CPU in float32 from a generator seeded by
    `tensor_seed(seed, name)` (direction 1, then 2), cast to w's device and dtype and
    normalised against w by `normalise`."""
    if w.dim() <= 1 and not keep_1d:  # zeroed whatever the draw
        return [torch.zeros_like(w) for _ in range(count)]
    gen = torch.Generator().manual_seed(tensor_seed(seed, name))
    raws = [torch.randn(tuple(w.shape), generator=gen, dtype=torch.float32)
            for _ in range(count)]
    return [normalise(r.to(w.device, w.dtype), w, norm, keep_1d) for r in raws]


def random_directions(params: Mapping[str, Tensor], movable: set[str], count: int,
                      seed: int = 0, norm: str = "filter", keep_1d: bool = False
                      ) -> list[dict[str, Tensor]]:
    """`count` seeded Gaussian directions over `params`, each tensor's drawn on its own by
    `tensor_directions` (seeded from `seed` and the tensor's name, in float32 on the CPU: a
    seed gives the same directions on every device, in any order of the tensors, and read
    at size) and normalised by `normalise`; tensors not in `movable`
    (buffers) get zeros."""
    SEED.check(seed)
    out: list[dict[str, Tensor]] = [{} for _ in range(count)]
    for k, w in params.items():
        if k not in movable or not w.is_floating_point():
            ds = [torch.zeros_like(w) for _ in range(count)]
        else:
            ds = tensor_directions(k, w, count, seed, norm, keep_1d)
        for d, t in zip(out, ds, strict=True):
            d[k] = t
    return out


def hessian_directions(ev: Evaluator, theta: Mapping[str, Tensor], count: int,
                       seed: int = 0, norm: str = "filter", keep_1d: bool = False,
                       steps: int = 100, info: dict | None = None
                       ) -> tuple[list[dict[str, Tensor]], list[float]]:
    """The top-`count` eigenvectors of the Hessian of the split's mean loss at `theta`
    (rotviz.analysis.lanczos: seeded Lanczos, Ritz vectors), each tensor then normalised by
    `normalise` like a random direction; with `none` they stay unit, orthonormal eigenvectors.
    Returns the directions and their eigenvalues (largest first).

    Which Hessian: the one of the parameters a slice moves. With biases and norm gains zeroed
    (not `keep_1d`) that is the principal sub-matrix without the 1-D tensors, so that with
    `none` a direction is exactly an eigenvector of the curvature the slice sees, and the
    1D slice's second derivative at the centre is its eigenvalue times |d|^2. With a dict
    `info`, the Lanczos run's `residual` and `converged` (`top_eigenvectors`)."""
    from rotviz.analysis.hvp import Curvature, restricted
    from rotviz.analysis.lanczos import top_eigenvectors

    SEED.check(seed)
    cur = Curvature(ev, theta)
    mask = None
    hvp = cur.hvp
    if not keep_1d:
        mask = torch.cat([torch.full((size,), len(shape) > 1, dtype=torch.bool)
                          for size, shape in zip(cur.sizes, cur.shapes, strict=True)]
                         ).to(cur.device)
        hvp = restricted(cur.hvp, mask)
    gen = torch.Generator().manual_seed(seed)
    vals, vecs = top_eigenvectors(hvp, cur.n, count, gen, cur.dtype, cur.device, mask,
                                  steps, info=info)
    if len(vecs) < count:
        raise RotvizError(f"found {len(vecs)} Hessian eigenvectors, fewer than --dims {count}")
    out = []
    for v in vecs:
        parts = dict(zip(cur.names, cur.unflat(v), strict=True))
        d = {}
        for k, w in theta.items():
            if k not in parts:
                d[k] = torch.zeros_like(w)
                continue
            d[k] = normalise(parts[k].to(w.device, w.dtype), w, norm, keep_1d)
        out.append(d)
    return out, vals


def norm_of(d: Mapping[str, Tensor]) -> float:
    """The L2 norm of a whole direction (float64 sums)."""
    return float(torch.sqrt(sum(torch.sum(v.double() ** 2) for v in d.values())))


def inner(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    """<a, b> over a's names (float64 sums)."""
    return float(sum(torch.sum(a[k].double() * b[k].double()) for k in a))


HEAD_FIELDS = ("wq", "wo", "wpq")  # one slab per query head: a KV group holds r of them
KV_FIELDS = ("wk", "wv", "wpk")  # one slab per KV group
HEAD_BIASES, KV_BIASES = ("bq", "bpq"), ("bk", "bv", "bpk")
UNIT_ROWS, UNIT_BIASES = ("w_in", "w_gate"), ("b_in", "b_gate")


def _grouped(blk, keep_1d: bool) -> dict[str, list[tuple[str, Tensor]]]:
    """The block's tensors that `unit` scales, each reshaped so that its first index is the
    group (KV group for attention, unit for the FFN): {"attn": [(field, t)], "ffn": [...]}.
    The reshapes are views, so scaling them in place scales the field."""
    a, f = blk.attn, blk.ffn
    r = a.n_heads // a.n_kv_heads
    attn, ffn = [], []
    heads = HEAD_FIELDS + (HEAD_BIASES if keep_1d else ())
    kv = KV_FIELDS + (KV_BIASES if keep_1d else ())
    for name in heads + kv:
        t = getattr(a, name)
        if t is not None:
            attn.append((name, t.reshape(a.n_kv_heads, r if name in heads else 1, -1)))
    for name in UNIT_ROWS + (UNIT_BIASES if keep_1d else ()):
        t = getattr(f, name)
        if t is not None:
            ffn.append((name, t.reshape(t.shape[0], -1)))
    ffn.append(("w_out", f.w_out.t()))
    return {"attn": attn, "ffn": ffn}


def _sq(parts: list[tuple[str, Tensor]]) -> Tensor:
    """Each group's squared norm over the parts."""
    return sum(t.pow(2).reshape(t.shape[0], -1).sum(1) for _, t in parts)


def unit_normalise(loaded: Loaded, d: Mapping[str, Tensor], w: Mapping[str, Tensor],
                   keep_1d: bool = False) -> dict[str, Tensor]:
    """The whole direction `d` (a dict over `w`'s names) normalised by `unit` against the
    weights `w` (module docstring): each FFN unit's and each KV group's entries together
    to the norm of the same entries of `w`; every other entry as `filter`. New tensors, in
    d's dtypes."""
    from rotviz.symmetry.view import write_block

    out = {k: normalise(v, w[k], "filter", keep_1d) if v.is_floating_point() else v.clone()
           for k, v in d.items()}
    dv, wv = (f64_view(loaded, {k: s.get(k, v) for k, v in loaded.state.items()})
              for s in (d, w))
    for li, (bd, bw) in enumerate(zip(dv.blocks, wv.blocks, strict=True)):
        bd = replace(bd, attn=_cloned(bd.attn), ffn=_cloned(bd.ffn))
        ones = replace(bd, attn=_zeros(bd.attn), ffn=_zeros(bd.ffn),
                       norms={s: _zeros(n) for s, n in bd.norms.items()})
        gd, gw, gm = (_grouped(b, keep_1d) for b in (bd, bw, ones))
        for kind in ("attn", "ffn"):
            dn, wn = _sq(gd[kind]), _sq(gw[kind])
            scale = torch.where(dn > EPS ** 2, (wn / dn.clamp_min(EPS ** 2)).sqrt(),
                                torch.ones_like(dn))
            for (_, t), (_, m) in zip(gd[kind], gm[kind], strict=True):
                t.mul_(scale.reshape(-1, *([1] * (t.dim() - 1))))
                m.fill_(1.0)
        prefix = dv.layout.blocks[li]
        values, where = write_block(dv, bd, prefix), write_block(dv, ones, prefix)
        for key, val in values.items():
            if key in out and bool(where[key].ne(0).any()):
                out[key] = torch.where(where[key].ne(0).to(out[key].device),
                                       val.to(out[key].device),
                                       out[key].double()).to(out[key].dtype)
    return out


def _cloned(obj):
    """A copy of a view dataclass with contiguous tensors (reshaped in place above)."""
    return replace(obj, **{f: getattr(obj, f).clone(memory_format=torch.contiguous_format)
                           for f in obj.__dataclass_fields__
                           if isinstance(getattr(obj, f), torch.Tensor)})


def _zeros(obj):
    """A copy of a view dataclass with contiguous zero tensors."""
    return replace(obj, **{f: torch.zeros(getattr(obj, f).shape, dtype=getattr(obj, f).dtype)
                           for f in obj.__dataclass_fields__
                           if isinstance(getattr(obj, f), torch.Tensor)})


def normalise_all(loaded: Loaded, d: Mapping[str, Tensor], w: Mapping[str, Tensor],
                  norm: str, keep_1d: bool, movable: set[str]) -> dict[str, Tensor]:
    """Any normalisation of a whole direction: `unit` over the model, the others tensor by
    tensor (`normalise`); entries not in `movable` become zeros."""
    if norm == "unit":
        out = unit_normalise(loaded, d, w, keep_1d)
    else:
        out = {k: normalise(v, w[k], norm, keep_1d) if v.is_floating_point() else v.clone()
               for k, v in d.items()}
    return {k: v if k in movable else torch.zeros_like(v) for k, v in out.items()}


def drawn(loaded: Loaded, theta: Mapping[str, Tensor], movable: set[str], count: int,
          seed: int, norm: str, keep_1d: bool) -> list[dict[str, Tensor]]:
    """`count` seeded random directions at `theta` normalised by `norm`, `unit` included:
    the same Gaussian draws as `random_directions` makes for the other
    norms (a `unit` plane and a `filter` plane of one seed start from one draw)."""
    if norm != "unit":
        return random_directions(theta, movable, count, seed, norm, keep_1d)
    raw = random_directions(theta, movable, count, seed, "none", True)
    return [normalise_all(loaded, r, theta, "unit", keep_1d, movable) for r in raw]


def toward_directions(loaded: Loaded, theta: Mapping[str, Tensor], target: Mapping[str, Tensor],
                      movable: set[str], count: int, seed: int, norm: str, keep_1d: bool
                      ) -> list[dict[str, Tensor]]:
    """d1 = target - theta normalised by `norm` (`none`: the raw difference, so x = 1 is the
    target; 1-D tensors zeroed unless `keep_1d`, so with biases zeroed x = 1 reaches the
    target's weights with the centre's biases). In 2D, d2 is the seeded random direction of
    `seed` (normalised likewise), minus its component along d1, then rescaled by one factor
    to the length it had: exactly orthogonal to d1, so the plane's axes are Euclidean."""
    diff = {k: (target[k].to(v.device, torch.float64) - v.double()).to(v.dtype)
            if k in movable and v.is_floating_point() else torch.zeros_like(v)
            for k, v in theta.items()}
    d1 = normalise_all(loaded, diff, theta, norm, keep_1d, movable)
    n1 = norm_of(d1)
    if n1 <= EPS:
        raise RotvizError("the target equals the centre (a zero direction): slice around "
                          "another point (--around) or toward the other model (--toward)")
    out = [d1]
    if count == 2:
        (r,) = drawn(loaded, theta, movable, 1, seed, norm, keep_1d)
        before = norm_of(r)
        c = inner(r, d1) / n1 ** 2
        d2 = {k: r[k].double() - c * d1[k].double() for k in r}
        after = norm_of(d2)
        out.append({k: (v * (before / after if after > EPS else 1.0)).to(r[k].dtype)
                    for k, v in d2.items()})
    return out


def _flat(d: Mapping[str, Tensor], names: Sequence[str]) -> Tensor:
    return torch.cat([d[n].detach().cpu().to(F64).reshape(-1) for n in names])


def _unflat(row: Tensor, like: Mapping[str, Tensor], names: Sequence[str]
            ) -> dict[str, Tensor]:
    out = {k: torch.zeros_like(v) for k, v in like.items()}
    start = 0
    for n in names:
        size = like[n].numel()
        out[n] = row[start:start + size].reshape(like[n].shape).to(like[n].device,
                                                                     like[n].dtype)
        start += size
    return out


def _restricted(blocks, names: Sequence[str], like: Mapping[str, Tensor]):
    """The tangent blocks restricted to the coordinates of 2-D and larger tensors."""
    from rotviz.analysis.tangents import TangentBlock

    keep = torch.cat([torch.full((like[n].numel(),), like[n].dim() > 1, dtype=torch.bool)
                      for n in names])
    out = []
    for b in blocks:
        sel = keep[b.idx]
        if bool(sel.any()):
            out.append(TangentBlock(b.layer, b.kind, b.group, b.idx[sel], b.t[:, sel]))
    return out


def symmetry_directions(loaded: Loaded, theta: Mapping[str, Tensor], movable: set[str],
                        count: int, seed: int, norm: str, keep_1d: bool, kind: str
                        ) -> tuple[list[dict[str, Tensor]], float]:
    """`gauge` or `tangent` directions at `theta` (module docstring): the seeded random
    directions of `seed` normalised by `norm`, then their component orthogonal to (gauge)
    or inside (tangent) the span of the symmetry tangents at theta, then one factor back to
    their length before the projection. Returns them and the largest |cosine| of any of
    them with any single tangent (rounding for gauge)."""
    from rotviz.analysis.tangents import gauge_fixed_blockwise, parameter_names, tangent_blocks

    if kind not in ("gauge", "tangent"):
        raise RotvizError(f"unknown symmetry direction '{kind}': use gauge or tangent")
    names = parameter_names(loaded)
    blocks = tangent_blocks(loaded, {**loaded.state, **theta})
    if not blocks:
        raise RotvizError(f"{loaded.ref} has no continuous symmetry to project: use "
                          "--directions random")
    base = drawn(loaded, theta, movable, count, seed, norm, keep_1d)
    flat = torch.stack([_flat(d, names) for d in base])
    project = blocks if (kind == "tangent" or keep_1d) else _restricted(blocks, names, theta)
    fixed = gauge_fixed_blockwise(flat, project)
    moved = fixed if kind == "gauge" else flat - fixed
    out = []
    for row, before in zip(moved, flat, strict=True):
        n = float(row.norm())
        out.append(_unflat(row * (float(before.norm()) / n if n > EPS else 1.0), theta,
                           names))
    return out, max_tangent_cosine([_flat(d, names) for d in out], blocks)


def max_tangent_cosine(flats: Sequence[Tensor], blocks) -> float:
    """The largest |<d, t>| / (|d| |t|) over the directions (flat, float64) and every
    single tangent of `blocks`."""
    worst = 0.0
    for d in flats:
        dn = float(d.norm())
        if dn <= EPS:
            continue
        for b in blocks:
            tn = b.t.norm(dim=1)
            cos = (b.t @ d[b.idx]).abs() / (tn.clamp_min(EPS) * dn)
            worst = max(worst, float(cos.max()))
    return worst


def directions_for(kind: str, loaded: Loaded, ev: Evaluator, theta: Mapping[str, Tensor],
                   movable: set[str], dims: int, seed: int, norm: str, keep_1d: bool,
                   steps: int = 100, target: Mapping[str, Tensor] | None = None
                   ) -> tuple[list[dict[str, Tensor]], dict]:
    """The `dims` directions of `kind` at `theta` (`ev`'s parameters), normalised by `norm`
    (any of NORMS, `unit` included): random; hessian (the top eigenvectors, then normalised);
    toward `target` (B' or B; `toward_directions`); tangent or gauge (`symmetry_directions`).
    Returns them and what the slice reports beside them (target_loss and target_x;
    tangent_cosine; eigenvalues, residual and converged)."""
    extra: dict = {}
    if kind == "toward":
        if target is None:
            raise RotvizError("--directions toward needs a second model to point at: add "
                              "--source MODEL")
        goal = ev.params(target)
        ds = toward_directions(loaded, theta, goal, movable, dims, seed, norm, keep_1d)
        extra["target_loss"] = ev.evaluate(goal)[0]
        extra["target_x"] = 1.0 if norm == "none" and keep_1d else None  # exactly on the axis
    elif kind in ("tangent", "gauge"):
        ds, extra["tangent_cosine"] = symmetry_directions(loaded, theta, movable, dims, seed,
                                                          norm, keep_1d, kind)
    elif kind == "hessian":  # the eigenvectors, then normalised (unit: over the model)
        lanczos: dict = {}
        raw, extra["eigenvalues"] = hessian_directions(ev, theta, dims, seed, "none", keep_1d,
                                                       steps, lanczos)
        extra["residual"], extra["converged"] = lanczos["residual"], lanczos["converged"]
        ds = [normalise_all(loaded, d, theta, norm, keep_1d, movable) for d in raw]
    else:
        ds = drawn(loaded, theta, movable, dims, seed, norm, keep_1d)
    return ds, extra


def gauge_fixed_directions(loaded: Loaded, state: Mapping[str, Tensor] | None = None,
                           count: int = 2, seed: int = 0, norm: str = "filter"
                           ) -> list[dict[str, Tensor]]:
    """`count` random directions as rotviz.analysis.loss_grid draws them (seeded, normalised by
    `norm`), with the symmetry tangents at `state` projected out: ready for
    `slice_at(..., given=...)`, so that a plane along them shows only changes of the function
    that the blocks' symmetries do not explain (the residual map's tangents stay: see
    `tangent_blocks`).
    The projection comes after the normalisation (normalising afterwards would bring the
    tangents back); each tensor keeps its parameter's dtype."""
    from rotviz.analysis.tangents import gauge_fixed_blockwise, parameter_names, tangent_blocks

    st = loaded.state if state is None else state
    names = parameter_names(loaded)
    params = {n: st[n] for n in names}
    raw = random_directions(params, set(names), count, seed, norm)
    flat_d = torch.stack([torch.cat([d[n].to(F64).reshape(-1) for n in names]) for d in raw])
    fixed = gauge_fixed_blockwise(flat_d, tangent_blocks(loaded, st))
    out = []
    for row in fixed:
        d: dict[str, Tensor] = {k: torch.zeros_like(v) for k, v in st.items()
                                if v.is_floating_point()}
        start = 0
        for n in names:
            size = st[n].numel()
            d[n] = row[start:start + size].reshape(st[n].shape).to(st[n].dtype)
            start += size
        out.append(d)
    return out

"""Slices around any point of a pair, along directions that know the model's symmetries
(docs/landscape.md, "Around any point of the pair"): the symmetry-aware `unit` normalisation,
the direction toward another point, and directions inside (`tangent`) or orthogonal to
(`gauge`) the symmetry orbit's tangent space. `slice_with` builds the directions and hands
them to rotviz.analysis.slices.slice_at as given ones (so the grid, the exact centre and the
progress stay slice_at's); `slice_around` centres it on A, B, B', a point of the matched
path or a merge. This module sits above slices.py and tangents.py (tangents.py draws its
random directions from slices.py), so that no import runs in a circle.

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

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch

from rotviz.analysis.slices import (
    Slice,
    check_choices,
    hessian_directions,
    normalise,
    random_directions,
    slice_at,
)
from rotviz.data.split import Split
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.limits import GRID, SEED, SPAN
from rotviz.sources.loading import Loaded
from rotviz.types import Progress

Tensor = torch.Tensor
F64 = torch.float64
EPS = 1e-12
NORMS = ("filter", "layer", "unit", "none")
DIRECTIONS = ("random", "hessian", "toward", "tangent", "gauge")
CENTRES = ("anchor", "source", "matched", "path", "merged")
TOWARD = ("matched", "source")


def _f64_view(loaded: Loaded, state: Mapping[str, Tensor]):
    """The canonical view of `state` (missing names: the model's own) in float64, written
    back in float64."""
    from rotviz.symmetry.view import read_view

    full = {k: state.get(k, v) for k, v in loaded.state.items()}
    view = read_view(loaded.spec, loaded.config, full).to(F64)
    return replace(view, dtypes={k: F64 for k in view.dtypes})


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
    dv, wv = _f64_view(loaded, d), _f64_view(loaded, w)
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
    tensor (rotviz.analysis.slices.normalise); entries not in `movable` become zeros."""
    if norm == "unit":
        out = unit_normalise(loaded, d, w, keep_1d)
    else:
        out = {k: normalise(v, w[k], norm, keep_1d) if v.is_floating_point() else v.clone()
               for k, v in d.items()}
    return {k: v if k in movable else torch.zeros_like(v) for k, v in out.items()}


def drawn(loaded: Loaded, theta: Mapping[str, Tensor], movable: set[str], count: int,
          seed: int, norm: str, keep_1d: bool) -> list[dict[str, Tensor]]:
    """`count` seeded random directions at `theta` normalised by `norm`, `unit` included:
    the same Gaussian draws as rotviz.analysis.slices.random_directions makes for the other
    norms (a `unit` plane and a `filter` plane of one seed start from one draw)."""
    if norm != "unit":
        return random_directions(theta, movable, count, seed, norm, keep_1d)
    raw = random_directions(theta, movable, count, seed, "none", True)
    return [normalise_all(loaded, r, theta, "unit", keep_1d, movable) for r in raw]


def _norm(d: Mapping[str, Tensor]) -> float:
    return float(sum(v.double().pow(2).sum() for v in d.values())) ** 0.5


def _dot(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    return float(sum((a[k].double() * b[k].double()).sum() for k in a))


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
    n1 = _norm(d1)
    if n1 <= EPS:
        raise RotvizError("the target equals the centre (a zero direction): slice around "
                          "another point (--around) or toward the other model (--toward)")
    out = [d1]
    if count == 2:
        (r,) = drawn(loaded, theta, movable, 1, seed, norm, keep_1d)
        before = _norm(r)
        c = _dot(r, d1) / n1 ** 2
        d2 = {k: r[k].double() - c * d1[k].double() for k in r}
        after = _norm(d2)
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


def slice_with(
    loaded: Loaded,
    split: Split,
    dims: int = 2,
    directions: str = "random",
    norm: str = "filter",
    keep_1d: bool = False,
    grid: int = 21,
    span: float = 1.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    batch_size: int = 512,
    point: Mapping[str, Tensor] | None = None,
    evaluator: Evaluator | None = None,
    steps: int = 100,
    target: Mapping[str, Tensor] | None = None,
) -> Slice:
    """slice_with(model, split, directions="gauge", norm="unit", ...) -> Slice

    `slice_at` (rotviz.analysis.slices) with every direction kind and normalisation:
    random and hessian as there, also under `unit`; `toward` from the point to `target`
    (B' or B); `tangent` and `gauge` at the point (module docstring). The directions are
    built here and evaluated by slice_at as given ones, so the grid, the exact centre and
    the progress are slice_at's; the result names the kind, the norm and the seed."""
    check_choices(norm, directions, dims, NORMS, DIRECTIONS)
    if directions in ("random", "hessian") and norm != "unit":
        return slice_at(loaded, split, dims, directions, norm, keep_1d, grid, span, seed,
                        device, progress, batch_size, point, None, evaluator, steps)
    GRID.check(grid)
    SPAN.check(span)
    SEED.check(seed)
    t0 = time.perf_counter()
    ev = evaluator or Evaluator(loaded, split, device, batch_size)
    theta = ev.params(loaded.state if point is None else point)
    movable = {n for n, _ in loaded.model.named_parameters()}
    extra: dict = {}
    if directions == "toward":
        if target is None:
            raise RotvizError("--directions toward needs a second model to point at: add "
                              "--source MODEL")
        goal = ev.params(target)
        ds = toward_directions(loaded, theta, goal, movable, dims, seed, norm, keep_1d)
        extra["target_loss"] = ev.evaluate(goal)[0]
        extra["target_x"] = 1.0 if norm == "none" and keep_1d else None  # exactly on the axis
    elif directions in ("tangent", "gauge"):
        ds, extra["tangent_cosine"] = symmetry_directions(loaded, theta, movable, dims, seed,
                                                          norm, keep_1d, directions)
    elif directions == "hessian":  # under unit: the eigenvectors, then normalised
        lanczos: dict = {}
        raw, extra["eigenvalues"] = hessian_directions(ev, theta, dims, seed, "none", keep_1d,
                                                       steps, lanczos)
        extra["residual"], extra["converged"] = lanczos["residual"], lanczos["converged"]
        ds = [normalise_all(loaded, d, theta, "unit", keep_1d, movable) for d in raw]
    else:
        ds = drawn(loaded, theta, movable, dims, seed, norm, keep_1d)
    s = slice_at(loaded, split, dims, "random", "none", keep_1d, grid, span, seed, device,
                 progress, batch_size, point, ds, ev, steps)
    return replace(s, directions=directions, norm=norm, seconds=time.perf_counter() - t0,
                   **extra)


def needs_source(around: str, directions: str) -> str | None:
    """The option that needs a second model (a phrase for the one-line error), or None."""
    if around != "anchor":
        return f"--around {around}"
    if directions == "toward":
        return "--directions toward"
    return None


def centre_state(ends, around: str, alpha: float = 0.5, merge: str = "simple",
                 split: Split | None = None, device: str | torch.device = "cpu"
                 ) -> Mapping[str, Tensor] | None:
    """The parameter set a slice is centred on, from held endpoints (rotviz.match.endpoints):
    `anchor` A (None: the anchor's own state), `source` B, `matched` B', `path` the point
    (1 - alpha) A + alpha B' of the matched straight path (float64, cast back), `merged`
    the matched pair merged by the registered method `merge` with the source's weight
    `alpha` (`simple` at 0.5 is the plain average; methods with statistics take them from
    the split's train sibling, rotviz.analysis.merges.merge_on)."""
    if around not in CENTRES:
        raise RotvizError(f"unknown --around '{around}': use one of {', '.join(CENTRES)}")
    if around == "anchor":
        return None
    if around == "source":
        return ends.source.state
    if around == "matched":
        return ends.matched
    if around == "path":
        a, b = ends.anchor.state, ends.matched
        return {k: ((1.0 - alpha) * v.double() + alpha * b[k].double()).to(v.dtype)
                if v.is_floating_point() else v for k, v in a.items()}
    from rotviz.analysis.merges import merge_on

    if split is None:
        raise RotvizError("--around merged needs data for the merge: give --data")
    return merge_on(ends, merge, split, alpha, device).state


def slice_around(ends, split: Split, around: str = "anchor", alpha: float = 0.5,
                 merge: str = "simple", toward: str = "matched", directions: str = "random",
                 **kw) -> Slice:
    """slice_around(endpoints, split, around="matched", directions="toward", ...) -> Slice

    A slice (`slice_with`, whose keywords `kw` takes) centred on a point of held endpoints
    (`centre_state`), with `toward` directions pointing at the matched source B'
    (`toward="matched"`) or the source B as it is (`"source"`). Endpoints of one model (its
    anchor and source the same reference) can only be sliced around the anchor."""
    if toward not in TOWARD:
        raise RotvizError(f"unknown --toward '{toward}': use one of {', '.join(TOWARD)}")
    why = needs_source(around, directions)
    if why and ends.source_ref == ends.anchor_ref:
        raise RotvizError(f"{why} needs a second model: add --source MODEL (and --match SPEC)")
    point = centre_state(ends, around, alpha, merge, split, kw.get("device", "cpu"))
    target = None
    if directions == "toward":
        target = ends.matched if toward == "matched" else ends.source.state
    s = slice_with(ends.anchor, split, directions=directions, point=point, target=target, **kw)
    return replace(s, around=around, alpha=float(alpha) if around in ("path", "merged") else None,
                   merge=merge if around == "merged" else None,
                   toward=toward if directions == "toward" else None,
                   source=ends.source_ref if why else "", match=ends.match if why else "none")

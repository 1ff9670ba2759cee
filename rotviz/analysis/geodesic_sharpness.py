"""Geodesic sharpness (da Silva, Dangel & Oore, "Hide & Seek: Transformer Symmetries Obscure
Sharpness & Riemannian Geometry Finds It", ICML 2025, arXiv 2505.05409): sharpness measured
on the quotient of parameter space by the transformer's symmetry group, so that no element
of the group (which keeps every output) can change it (docs/landscape.md, "geodesic
sharpness", has the definition with the paper's equation numbers).

Why each piece is there (the group G is rotviz.symmetry.actions': per KV group a Q-K map
A in GL(d_h), W_Q -> A^T W_Q, W_K -> A^-1 W_K, restricted under RoPE and q/k norms; a V-O
map B; positive FFN unit scales for gated and ReLU FFNs; head and unit permutations):

- Factors. Every tensor a continuous map acts on is written as a matrix F (n x h) on which
  the map acts from the right: the Q factor of a KV group stacks W_Q^T, b_Q (and DeBERTa's
  position projections) of its query heads, F -> F A; the K factor F -> F A^-T; V: F -> F B;
  O (the group's W_O columns): F -> F B^-T; an FFN unit's up row with its bias is a
  (d+1) x 1 factor, F -> s F, its down column F -> F / s, its gate row never moves. The rest
  (norms, output biases, embeddings, head) is one factor per number.
- Metric. On a factor, g_F(xi, eta) = tr(xi (F^T F)^-1 eta^T) (the metric the paper puts on
  each GL(h) factor; for h = 1 it is ||xi||^2 / ||F||^2, for one number (xi / w)^2: adaptive
  sharpness' scaling). F -> F M maps xi -> xi M and (F^T F)^-1 -> M^-1 (F^T F)^-1 M^-T, so g
  is unchanged: every element of G is an isometry, and permutations only reorder factors.
- Horizontal space. The orbit's tangents at a point are the vertical space (for Q-K,
  (F_Q L, -F_K L^T) for L in the group's Lie algebra: all of gl(d_h), or the RoPE / q/k-norm
  generators of rotviz.analysis.tangents.qk_generators). Directions are projected onto its
  g-orthogonal complement (solving the Gram system by conjugate gradients); the projection
  commutes with the group because the metric and the vertical space do.
- Geodesic. A geodesic of the quotient is the projection of a horizontal geodesic of the
  total space (a Riemannian submersion). To second order, gamma(1) = theta + xi + 1/2 a(xi),
  with, on each factor, a = -F P xi^T xi + xi P (xi^T F + F^T xi), P = (F^T F)^-1 (the
  Christoffel term of g, derived from its geodesic equation), and xi^2 / w per number.
  `order=1` drops a: the first-order (adaptive-sharpness-like) variant.
- Random directions. A seeded Gaussian drawn in parameter coordinates is not equivariant:
  the element moves the weights but not the draw. Here the draw is xi = E F with one
  Gaussian matrix E (rows x rows) per layer and role, shared by the heads (units) of the
  layer: then xi(F M) = E F M = xi(F) M exactly, draw for draw, and a permutation of heads
  or units permutes the draws with them. Its rows are N(0, F^T F): exactly the metric's
  isotropic Gaussian. A number's direction is |w| z. So the average over seeded directions,
  and gradient ascent started from them, are invariant for every seed, not only in
  expectation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from rotviz.symmetry.view import Attention, ModelView

Tensor = torch.Tensor
F64 = torch.float64

_Q = (("wq", "w"), ("bq", "b"), ("wpq", "w"), ("bpq", "b"))
_K = (("wk", "w"), ("bk", "b"), ("wpk", "w"), ("bpk", "b"))
_V = (("wv", "w"), ("bv", "b"))
_O = (("wo", "o"),)
ROLES = {"q": _Q, "k": _K, "v": _V, "o": _O}


def _pack(attn: Attention, fields) -> tuple[Tensor, int]:
    """(per head factor rows (H, r, d_h), r): W^T and bias rows of each head, stacked."""
    parts = []
    for name, how in fields:
        t = getattr(attn, name)
        if t is None:
            continue
        parts.append(t.transpose(1, 2) if how == "w" else t[:, None, :] if how == "b" else t)
    t = torch.cat(parts, 1)
    return t, t.shape[1]


def _unpack(attn: Attention, fields, t: Tensor) -> dict[str, Tensor]:
    out, i = {}, 0
    for name, how in fields:
        old = getattr(attn, name)
        if old is None:
            continue
        r = 1 if how == "b" else old.shape[2 if how == "w" else 1]
        p = t[:, i:i + r]
        i += r
        out[name] = p.transpose(1, 2) if how == "w" else p[:, 0, :] if how == "b" else p
    return out


def factors(view: ModelView, params: set[str]) -> tuple[dict[str, Tensor], dict[str, int]]:
    """(factors, chunk rows): 'm:' factors (batch, n, h), acted on from the right, whose
    rows come in chunks of one head or unit (the shared draw E acts per chunk); 'e:'
    factors, one per number (trainable floating tensors outside the maps)."""
    out: dict[str, Tensor] = {}
    chunk: dict[str, int] = {}
    for i, blk in enumerate(view.blocks):
        a, hkv = blk.attn, blk.attn.n_kv_heads
        for role, fields in ROLES.items():
            t, r = _pack(a, fields)
            out[f"m:{i}.{role}"] = t.reshape(hkv, -1, t.shape[-1])
            chunk[f"m:{i}.{role}"] = r
        f = blk.ffn
        for role, w, b in (("in", f.w_in, f.b_in), ("gate", f.w_gate, f.b_gate)):
            if w is not None:
                t = w if b is None else torch.cat([w, b[:, None]], 1)
                out[f"m:{i}.{role}"], chunk[f"m:{i}.{role}"] = t[:, :, None], t.shape[1]
        out[f"m:{i}.out"], chunk[f"m:{i}.out"] = f.w_out.t()[:, :, None], f.w_out.shape[0]
        for name, t in (("bo", a.bo), ("bout", f.b_out), ("gq", a.gq), ("gk", a.gk)):
            if t is not None:
                out[f"e:{i}.{name}"] = t
        for site, norm in blk.norms.items():
            for part in ("weight", "bias"):
                if getattr(norm, part) is not None:
                    out[f"e:{i}.norm.{site}.{part}"] = getattr(norm, part)
    for k, t in view.other.items():
        if k in params and t.is_floating_point():
            out[f"e:other.{k}"] = t
    return out, chunk


def rebuild(view: ModelView, fs: Mapping[str, Tensor]) -> ModelView:
    """The view whose tensors are the factors `fs` (the inverse of `factors`)."""
    blocks = []
    for i, blk in enumerate(view.blocks):
        a, f = blk.attn, blk.ffn
        new: dict = {}
        for role, fields in ROLES.items():
            t = fs[f"m:{i}.{role}"]
            new.update(_unpack(a, fields, t.reshape(-1, _pack(a, fields)[1], t.shape[-1])))
        for name in ("bo", "gq", "gk"):
            if f"e:{i}.{name}" in fs:
                new[name] = fs[f"e:{i}.{name}"]
        fnew: dict = {"w_out": fs[f"m:{i}.out"][:, :, 0].t()}
        for role, w, b in (("in", "w_in", "b_in"), ("gate", "w_gate", "b_gate")):
            if f"m:{i}.{role}" in fs:
                t = fs[f"m:{i}.{role}"][:, :, 0]
                fnew[w] = t if getattr(f, b) is None else t[:, :-1]
                if getattr(f, b) is not None:
                    fnew[b] = t[:, -1]
        if f"e:{i}.bout" in fs:
            fnew["b_out"] = fs[f"e:{i}.bout"]
        norms = {site: replace(n, **{p: fs[f"e:{i}.norm.{site}.{p}"] for p in ("weight", "bias")
                                     if f"e:{i}.norm.{site}.{p}" in fs})
                 for site, n in blk.norms.items()}
        blocks.append(replace(blk, attn=replace(a, **new), ffn=replace(f, **fnew), norms=norms))
    other = {k: fs.get(f"e:other.{k}", t) for k, t in view.other.items()}
    return replace(view, blocks=tuple(blocks), other=other)


def _inv_gram(fs: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """P = (F^T F)^-1 of every matrix factor; a rank-deficient one (a dead unit, a zero
    head) has no such metric and is refused."""
    from rotviz.errors import RotvizError

    out = {}
    for k, t in fs.items():
        if k.startswith("m:"):
            p, info = torch.linalg.inv_ex(t.transpose(1, 2) @ t)
            if bool((info != 0).any()) or not bool(torch.isfinite(p).all()):
                raise RotvizError(f"geodesic sharpness needs every head's and unit's weights "
                                  f"of full rank, and block {k[2:]} has a rank-deficient one "
                                  "(a zero unit or head); use --geodesic no")
            out[k] = p
    return out


def inner(fs, p, xi, eta) -> Tensor:
    """g(xi, eta) at the point `fs` (P: its `_inv_gram`)."""
    total = torch.zeros((), dtype=next(iter(fs.values())).dtype)
    for k, w in fs.items():
        if k.startswith("m:"):
            total = total + torch.einsum("bnh,bhg,bng->", xi[k], p[k], eta[k])
        else:
            live = w != 0
            total = total + ((xi[k] * eta[k])[live] / (w[live] ** 2)).sum()
    return total


def acceleration(fs, p, xi) -> dict[str, Tensor]:
    """The second-order term of the geodesic with initial velocity `xi` (see the module
    docstring): gamma(t) = theta + t xi + t^2 / 2 acceleration + O(t^3)."""
    out = {}
    for k, w in fs.items():
        x = xi[k]
        if k.startswith("m:"):
            xt = x.transpose(1, 2)
            out[k] = -w @ p[k] @ (xt @ x) + x @ p[k] @ (xt @ w + w.transpose(1, 2) @ x)
        else:
            out[k] = torch.where(w != 0, x * x / torch.where(w != 0, w, 1), 0)
    return out


def geodesic_point(fs, p, xi, order: int = 2) -> dict[str, Tensor]:
    """gamma_xi(1) to first (theta + xi) or second order (Hide & Seek's approximation)."""
    if order == 1:
        return {k: fs[k] + xi[k] for k in fs}
    acc = acceleration(fs, p, xi)
    return {k: fs[k] + xi[k] + 0.5 * acc[k] for k in fs}


def draw(fs, chunk: Mapping[str, int], gen: torch.Generator) -> dict[str, Tensor]:
    """An equivariant random direction (module docstring): xi = E F per head or unit chunk,
    one E per factor shared by its heads / units, and |w| z per number."""
    out = {}
    for k in sorted(fs):
        w = fs[k]
        if k.startswith("m:"):
            r = chunk[k]
            e = torch.randn(r, r, generator=gen, dtype=F64).to(w)
            out[k] = (e @ w.reshape(-1, r, w.shape[-1])).reshape(w.shape)
        else:
            out[k] = w.abs() * torch.randn(w.shape, generator=gen, dtype=F64).to(w)
    return out


def _cg(op, b: Tensor, tol: float = 1e-13, iters: int = 1000) -> Tensor:
    """Batched conjugate gradients for op(x) = b on (batch, h, h) (op symmetric positive
    definite on the Lie algebra, in the Frobenius inner product)."""
    x = torch.zeros_like(b)
    r = b.clone()
    q = r.clone()
    rs = (r * r).sum((1, 2))
    stop = tol * rs.max().sqrt().clamp_min(1e-300)
    for _ in range(iters):
        if float(rs.max().sqrt()) <= stop:
            break
        aq = op(q)
        alpha = rs / (q * aq).sum((1, 2)).clamp_min(1e-300)
        x = x + alpha[:, None, None] * q
        r = r - alpha[:, None, None] * aq
        new = (r * r).sum((1, 2))
        q = r + (new / rs.clamp_min(1e-300))[:, None, None] * q
        rs = new
    return x


DIRECT = 32  # up to this h, the Gram system is solved directly (h^2 x h^2), else by CG


def _pair_solver(f1, f2, p1, p2, basis: Tensor | None):
    """L(m): the algebra element whose vertical direction (F1 L, -F2 L^T) has the metric
    moments m, i.e. the solution of Pi(P1^-1 L P1 + P2 L P2^-1) = m on the algebra (Pi: the
    Frobenius projection on it; `basis`: its orthonormal (h^2, k) columns, None: gl(h)).
    Factorised once per point and pair, reused by every direction."""
    h = f1.shape[-1]
    p1i, p2i = torch.linalg.inv(p1), torch.linalg.inv(p2)
    if h <= DIRECT:
        k = (torch.einsum("bik,blj->bijkl", p1i, p1) + torch.einsum("bik,blj->bijkl", p2, p2i))
        k = k.reshape(k.shape[0], h * h, h * h)
        if basis is not None:
            k = basis.t() @ k @ basis
        lu = torch.linalg.lu_factor(k)

        def direct(m: Tensor) -> Tensor:
            v = m.reshape(m.shape[0], -1)
            v = v if basis is None else v @ basis
            x = torch.linalg.lu_solve(*lu, v[..., None])[..., 0]
            x = x if basis is None else x @ basis.t()
            return x.reshape(m.shape[0], h, h)

        return direct

    def proj(m: Tensor) -> Tensor:
        if basis is None:
            return m
        return ((m.reshape(m.shape[0], -1) @ basis) @ basis.t()).reshape(m.shape[0], h, h)

    return lambda m: _cg(lambda x: proj(p1i @ x @ p1 + p2 @ x @ p2i), proj(m))


def _project_pair(f1, f2, p1, p2, x1, x2, solve):
    """Remove from (x1, x2) its g-orthogonal projection on the vertical space
    {(F1 L, -F2 L^T): L in the algebra} of a pair F1 -> F1 A, F2 -> F2 A^-T: its moments
    m = F1^T x1 P1 - P2 x2^T F2 against the algebra, solved by `solve` (_pair_solver)."""
    lam = solve(f1.transpose(1, 2) @ x1 @ p1 - p2 @ x2.transpose(1, 2) @ f2)
    return x1 - f1 @ lam, x2 + f2 @ lam.transpose(1, 2)


def _qk_basis(view: ModelView, i: int) -> Tensor | None:
    from rotviz.analysis.tangents import qk_generators

    a, dims = view.blocks[i].attn, view.dims
    gens = qk_generators(a, dims.rope, dims.qk_norm)
    dh = a.wq.shape[1]
    if len(gens) == dh * dh and dims.rope is None and not dims.qk_norm:
        return None
    m = torch.stack([e.reshape(-1) for e, _ in gens], 1).to(F64)
    q, _ = torch.linalg.qr(m)
    return q.to(a.wq)


def horizontal(view: ModelView, fs, p, xi, cache: dict | None = None) -> dict[str, Tensor]:
    """The g-orthogonal projection of `xi` on the horizontal space (orthogonal to every
    orbit direction of the group: Q-K, V-O maps, FFN unit scales where they are symmetries).
    `cache`: the pairs' solvers at this point, kept for the next direction."""
    from rotviz.analysis.tangents import ffn_has_scales

    cache = {} if cache is None else cache
    out = dict(xi)
    for i, blk in enumerate(view.blocks):
        pairs = [("q", "k", True), ("v", "o", False)]
        if ffn_has_scales(blk.ffn):
            pairs.append(("in", "out", False))
        for a, b, qk in pairs:
            ka, kb = f"m:{i}.{a}", f"m:{i}.{b}"
            if ka not in cache:
                cache[ka] = _pair_solver(fs[ka], fs[kb], p[ka], p[kb],
                                         _qk_basis(view, i) if qk else None)
            out[ka], out[kb] = _project_pair(fs[ka], fs[kb], p[ka], p[kb], out[ka], out[kb],
                                             cache[ka])
    return out


def scaled(xi, s) -> dict[str, Tensor]:
    return {k: v * s for k, v in xi.items()}


def riemannian_gradient(fs, egrad) -> dict[str, Tensor]:
    """The metric's gradient from the Euclidean one: G^-1 e, i.e. e F^T F on a matrix
    factor and e w^2 on a number."""
    return {k: (e @ (fs[k].transpose(1, 2) @ fs[k]) if k.startswith("m:") else e * fs[k] ** 2)
            for k, e in egrad.items()}


def norm(fs, p, xi) -> Tensor:
    return inner(fs, p, xi, xi).clamp_min(0).sqrt()


class Landscape:
    """The split's mean loss at points given as factors of one model (run functionally
    through rotviz.analysis.hvp.Curvature's loss: the model and `state` are never touched)."""

    def __init__(self, loaded, state, split, device="cpu", batch_size: int = 512,
                 dtype: torch.dtype | None = None):
        from rotviz.analysis.hvp import Curvature
        from rotviz.analysis.tangents import f64_view, parameter_names
        from rotviz.evaluation import Evaluator

        st = loaded.state if state is None else state
        self.cur = Curvature(Evaluator(loaded, split, device, batch_size), st, dtype)
        self.view = f64_view(loaded, st).to(device=self.cur.device)
        self.fs, self.chunk = factors(self.view, set(parameter_names(loaded)))
        self.p = _inv_gram(self.fs)
        self.base = self.cur.loss()
        self.solvers: dict = {}  # the horizontal projection's, at this point

    def _tensors(self, fs) -> list[Tensor]:
        from rotviz.symmetry.view import write_state

        st = write_state(rebuild(self.view, fs))
        return [st[n].to(self.cur.dtype) for n in self.cur.names]

    def loss(self, fs) -> float:
        with torch.no_grad():
            ps = self._tensors(fs)
            return float(sum(self.cur._loss(ps, x, y) for x, y in self.cur.ev.batches))

    def loss_and_grad(self, xi, order: int) -> tuple[float, dict[str, Tensor]]:
        """L(gamma_xi(1)) and its Euclidean gradient with respect to `xi`, batch by batch."""
        xs = {k: v.detach().requires_grad_(True) for k, v in xi.items()}
        total = 0.0
        with torch.enable_grad():
            for x, y in self.cur.ev.batches:
                ps = self._tensors(geodesic_point(self.fs, self.p, xs, order))
                loss = self.cur._loss(ps, x, y)
                loss.backward()
                total += float(loss.detach())
        return total, {k: v.grad if v.grad is not None else torch.zeros_like(v)
                       for k, v in xs.items()}

    def direction(self, gen: torch.Generator, rho: float, sphere: bool) -> dict[str, Tensor]:
        """A seeded horizontal direction (equivariant, see above): the metric's isotropic
        Gaussian on the horizontal space times `rho` (each number's scale rho in the
        metric), or with `sphere` scaled to metric length `rho`."""
        xi = horizontal(self.view, self.fs, self.p, draw(self.fs, self.chunk, gen),
                        self.solvers)
        return scaled(xi, rho / float(norm(self.fs, self.p, xi)) if sphere else rho)


def average(land: Landscape, rho: float, samples: int, gen: torch.Generator, order: int = 2,
            progress=None) -> tuple[list[float], list[float]]:
    """Average-case: L(gamma_xi(1)) - L(theta) over `samples` seeded horizontal Gaussian
    directions of scale rho, to second order and (on the same directions) to first order."""
    second, first = [], []
    for s in range(samples):
        if progress is not None:
            progress(s, samples, f"direction {s + 1}")
        xi = land.direction(gen, rho, sphere=False)
        second.append(land.loss(geodesic_point(land.fs, land.p, xi, order)) - land.base)
        first.append(land.loss(geodesic_point(land.fs, land.p, xi, 1)) - land.base)
    return second, first


def worst(land: Landscape, rho: float, steps: int, gen: torch.Generator, order: int = 2,
          progress=None) -> list[float]:
    """Worst-case: normalised Riemannian gradient ascent of L(gamma_xi(1)) on the horizontal
    sphere ||xi||_g = rho from a seeded direction; the rise at each iterate (the value is
    their maximum, a lower bound of the ball's supremum)."""
    xi = land.direction(gen, rho, sphere=True)
    rises = []
    for s in range(steps + 1):
        if progress is not None:
            progress(s, steps + 1, f"ascent step {s}")
        value, egrad = land.loss_and_grad(xi, order)
        rises.append(value - land.base)
        if s == steps:
            break
        rg = horizontal(land.view, land.fs, land.p, riemannian_gradient(land.fs, egrad),
                        land.solvers)
        size = float(norm(land.fs, land.p, rg))
        if size == 0.0:
            break
        xi = {k: xi[k].detach() + rho * rg[k] / size for k in xi}
        xi = scaled(xi, rho / float(norm(land.fs, land.p, xi)))
    return rises


KINDS = ("average", "worst")


def geodesic_sharpness(loaded, state, split, device="cpu", *, kind: str = "average",
                       rho: float = 0.1, samples: int = 4, steps: int = 3, order: int = 2,
                       seed: int = 0, examples: int | None = None, batch_size: int = 512,
                       dtype: torch.dtype | None = None, progress=None) -> dict:
    """Geodesic sharpness of the split's mean loss at `state` (the model's own by default):
    'average' (the mean rise over `samples` seeded horizontal Gaussian directions of scale
    `rho`, with the first-order value on the same directions) or 'worst' (`steps` of
    Riemannian ascent on the geodesic sphere of radius `rho`). `order` 2 is the paper's
    second-order geodesic, 1 its first-order (adaptive-sharpness-like) reduction. Seeded,
    and the same for every point of the symmetry orbit. Never mutates `state` or `loaded`."""
    import time

    from rotviz.errors import RotvizError

    if kind not in KINDS:
        raise RotvizError(f"geodesic sharpness kind {kind!r} is not one of {', '.join(KINDS)}; "
                          "use average or worst")
    t0 = time.perf_counter()
    if examples is not None:
        split = split.subset(min(int(examples), split.n))
    land = Landscape(loaded, state, split, device, batch_size, dtype)
    gen = torch.Generator().manual_seed(int(seed))
    out = {"kind": kind, "rho": float(rho), "order": int(order), "seed": int(seed),
           "loss": land.base, "n": split.n}
    if kind == "average":
        rises, first = average(land, rho, samples, gen, order, progress)
        out.update(value=sum(rises) / len(rises), first_order=sum(first) / len(first),
                   rises=rises, samples=int(samples))
    else:
        rises = worst(land, rho, steps, gen, order, progress)
        out.update(value=max(rises), rises=rises, steps=int(steps))
    out["seconds"] = time.perf_counter() - t0
    return out

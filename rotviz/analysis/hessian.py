"""Curvature of the test loss: Hessian-vector products, the top eigenvalues (Lanczos), the
trace (Hutchinson) and the eigenvalue density (stochastic Lanczos quadrature), for the whole
model or restricted to a group of parameters (one block, one module kind).

The loss is the split's mean loss, L(theta) = sum_i loss_i(theta) / sum_i count_i, exactly
what `Evaluator.evaluate` reports, taken over the whole split (full batch), so every number
here is a property of one deterministic function of the parameters. The Hessian is never
formed: H v is a double backward pass through the anchor's module run functionally
(`Evaluator.logits` -> torch.func.functional_call), batch by batch, summed, so neither the
caller's tensors nor the loaded model are touched.

A restriction to a group G of parameters is the principal sub-matrix H_GG: the probe is zero
outside G and only G's part of H v is kept. Its eigenvalues interlace the full ones (Cauchy),
and its trace is the part of the full trace that G holds, so the groups' traces sum to the
whole trace.

Groups (docs/landscape.md, "Curvature"): by block, every tensor under a block prefix of the
model's resolved layout (rotviz.symmetry.view.resolve_layout: `vit.layers.3.`, `h.3.`, ...)
belongs to that block and everything else to "outside" (embeddings, final norm, head); by
kind, a block tensor is "qk" (queries and keys), "vo" (values and the output projection),
"qkv" (a fused projection that holds both), "ffn", "norms" (per-head q/k norms too) or
"other", and a tensor outside the blocks "embeddings", "norms" or "head".
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from rotviz.data.tasks import sample_losses
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.sources.loading import Loaded
from rotviz.types import Progress

Tensor = torch.Tensor
Hvp = Callable[[Tensor], Tensor]  # flat vector -> flat H v
# Unit vectors per batched pass of an exact trace (Curvature.hvp_rows): 64 rows of a small
# model's parameters cost a few MB and one double backward, where 64 passes cost 64.
EXACT_ROWS = 64


# ---- the loss and its Hessian-vector product -------------------------------------------

class Curvature:
    """H v of the split's mean loss at one parameter set of `ev`'s module, on flat vectors.

    The parameters that count are the module's trainable floating parameters (tied weights
    once, as `Evaluator.names` lists them; floating buffers are held fixed). `dtype` casts
    the parameters, buffers and inputs (float64 gives exact comparisons on tiny models)."""

    def __init__(self, ev: Evaluator, state: Mapping[str, Tensor],
                 dtype: torch.dtype | None = None):
        params = ev.params(state)
        module_params = {n for n, _ in ev.loaded.model.named_parameters()}
        self.ev = ev
        self.names = [n for n in ev.names
                      if n in module_params and params[n].is_floating_point()]
        self.fixed = {n: t for n, t in params.items() if n not in set(self.names)}

        def cast(t: Tensor) -> Tensor:
            return t.to(dtype) if dtype is not None and t.is_floating_point() else t

        self.cast = cast
        self.point = [cast(params[n]).detach() for n in self.names]
        self.shapes = [t.shape for t in self.point]
        self.sizes = [t.numel() for t in self.point]
        self.n = int(sum(self.sizes))
        self.dtype = self.point[0].dtype
        self.device = self.point[0].device
        self.count = 0.0
        self._buffers = {n: cast(b) for n, b in ev.buffers.items()}
        self._fixed = {n: cast(t) for n, t in self.fixed.items()}
        for _, y in ev.batches:
            self.count += float(self._count(y))
        self.hvps = 0  # how many products were taken (for the summary)

    def _count(self, y: Tensor) -> int:
        """Predictions a batch's labels count (tokens, labels or outputs), as the loss does."""
        task = self.ev.split.task
        if task in ("multi-label", "regression"):
            return int(y.reshape(y.shape[0], -1).shape[1] * y.shape[0])
        from rotviz.data.splits import IGNORE

        return int((y != IGNORE).sum())

    def _cast_inputs(self, x):
        if isinstance(x, Mapping):
            return {k: self.cast(v) for k, v in x.items()}
        return self.cast(x)

    def _loss(self, tensors: list[Tensor], x, y) -> Tensor:
        params = {**self._fixed, **dict(zip(self.names, tensors, strict=True))}
        from rotviz.sources.adapters import call

        with math_attention():
            logits = call(self.ev.loaded.spec, self.ev.loaded.model,
                          {**self._buffers, **params}, self._cast_inputs(x))
        loss, _, _ = sample_losses(self.ev.split.task, logits.to(self.dtype), y,
                                   lambda t: t)
        return loss.sum() / self.count

    @staticmethod
    def _grads(loss: Tensor, ps: list[Tensor], create_graph: bool = True) -> list[Tensor]:
        """d loss / d p for each p, zeros for the parameters the loss does not reach (a
        pre-training model's next-sentence head and pooler, under its masked-LM loss: their
        gradient and their rows of the Hessian are exactly 0)."""
        g = torch.autograd.grad(loss, ps, create_graph=create_graph, allow_unused=True)
        return [gi if gi is not None else torch.zeros_like(p) for gi, p in zip(g, ps,
                                                                                strict=True)]

    def flat(self, tensors: list[Tensor]) -> Tensor:
        return torch.cat([t.reshape(-1) for t in tensors])

    def unflat(self, v: Tensor) -> list[Tensor]:
        return [p.reshape(s) for p, s in zip(torch.split(v, self.sizes), self.shapes,
                                              strict=True)]

    def loss(self) -> float:
        with torch.no_grad():
            return float(sum(self._loss(self.point, x, y) for x, y in self.ev.batches))

    def gradient(self) -> Tensor:
        total = torch.zeros(self.n, dtype=self.dtype, device=self.device)
        for x, y in self.ev.batches:
            ps = [p.clone().requires_grad_(True) for p in self.point]
            g = self._grads(self._loss(ps, x, y), ps, create_graph=False)
            total += self.flat(list(g))
        return total

    def hvp(self, v: Tensor) -> Tensor:
        """H v (v flat, of length `n`): a double backward pass per batch, summed."""
        vs = self.unflat(v.to(self.dtype))
        total = torch.zeros(self.n, dtype=self.dtype, device=self.device)
        with torch.enable_grad():
            for x, y in self.ev.batches:
                ps = [p.clone().requires_grad_(True) for p in self.point]
                g = self._grads(self._loss(ps, x, y), ps)
                dot = sum((gi * vi).sum() for gi, vi in zip(g, vs, strict=True))
                hv = torch.autograd.grad(dot, ps, allow_unused=True)
                total += self.flat([h if h is not None else torch.zeros_like(p)
                                    for h, p in zip(hv, ps, strict=True)])
        self.hvps += 1
        return total.detach()

    def hvp_rows(self, vs: Tensor) -> Tensor:
        """H V for the rows of `vs` (k, n) at once: one double backward pass per batch with
        k batched output gradients (torch.autograd.grad's is_grads_batched, a vmap over the
        second backward), the same numbers as k calls of `hvp`."""
        vs = vs.to(dtype=self.dtype, device=self.device)
        k = vs.shape[0]
        total = torch.zeros(k, self.n, dtype=self.dtype, device=self.device)
        parts = torch.split(vs, self.sizes, dim=1)
        with torch.enable_grad():
            for x, y in self.ev.batches:
                ps = [p.clone().requires_grad_(True) for p in self.point]
                g = self._grads(self._loss(ps, x, y), ps)
                live = [i for i, gi in enumerate(g) if gi.requires_grad]  # others: H rows 0
                outs = [parts[i].reshape(k, *self.shapes[i]) for i in live]
                hv = torch.autograd.grad([g[i] for i in live], ps, outs, allow_unused=True,
                                         is_grads_batched=True)
                total += torch.cat([h.reshape(k, -1) if h is not None else
                                    torch.zeros(k, p.numel(), dtype=self.dtype,
                                                device=self.device)
                                    for h, p in zip(hv, ps, strict=True)], dim=1)
        self.hvps += k
        return total.detach()

    def masks(self, by: str, loaded: Loaded) -> dict[str, Tensor]:
        """Boolean masks over the flat vector, one per group of `by` ('block' or 'kind')."""
        names = group_names(self.names, loaded, by)
        out: dict[str, Tensor] = {}
        start = 0
        for name, size in zip(self.names, self.sizes, strict=True):
            g = names[name]
            if g not in out:
                out[g] = torch.zeros(self.n, dtype=torch.bool, device=self.device)
            out[g][start:start + size] = True
            start += size
        return out


def math_attention():
    """Attention by its plain formula: the fused kernels (flash, memory-efficient) have no
    second derivative, which every Hessian-vector product needs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def restricted(hvp: Hvp, mask: Tensor) -> Hvp:
    """H_GG v: the product of the principal sub-matrix of the parameters in `mask`, on vectors
    of the full length that are zero outside it (and give zero there)."""
    def f(v: Tensor) -> Tensor:
        return hvp(v * mask) * mask

    return f


# ---- groups of parameters ----------------------------------------------------------------

_KINDS = {"q": "qk", "k": "qk", "v": "vo", "o": "vo", "qkv": "qkv"}


def group_names(names: list[str], loaded: Loaded, by: str) -> dict[str, str]:
    """Each parameter name -> its group: 'block <i>' / 'outside', or a module kind."""
    from rotviz.symmetry.view import resolve_layout

    if by not in ("block", "kind"):
        raise RotvizError(f"unknown grouping '{by}': use block or kind")
    lay = resolve_layout(loaded.spec, loaded.state)
    out = {}
    for name in names:
        block = next((i for i, p in enumerate(lay.blocks) if name.startswith(p)), None)
        if by == "block":
            out[name] = "outside" if block is None else f"block {block}"
            continue
        module = name.rsplit(".", 1)[0]
        if block is None:
            if name in lay.writers:
                out[name] = "embeddings"
            elif module in lay.stream_norms or module == lay.final_norm:
                out[name] = "norms"
            else:
                out[name] = "head"
            continue
        rel = module[len(lay.blocks[block]):]
        role = next((r for r, m in lay.roles.items() if rel == m or rel.startswith(m + ".")),
                    None)
        if role is not None:
            out[name] = _KINDS.get(role, "ffn" if role.startswith("ffn") else "other")
        elif any(rel == m or rel.startswith(m + ".") for m in lay.norms.values()) \
                or "norm" in rel.rsplit(".", 1)[-1]:  # also per-head q/k norms (Qwen3)
            out[name] = "norms"
        else:
            out[name] = "other"
    return out


# a Ritz value counts as converged when its residual ||H y - theta y|| (which bounds its
# distance to an eigenvalue of H) is at most this times the largest |Ritz value|
CONVERGED = 1e-4

# ---- Lanczos, Hutchinson, density ----------------------------------------------------------

def lanczos(hvp: Hvp, v0: Tensor, steps: int, mask: Tensor | None = None,
            top: int | None = None, tol: float = 1e-7,
            progress: Progress | None = None, keep: list[Tensor] | None = None,
            info: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The tridiagonal matrix of `steps` Lanczos steps from v0, with full
    reorthogonalisation (every new vector is made orthogonal to all earlier ones, twice, so
    no spurious copies of converged eigenvalues appear). Returns (alpha, beta).

    With `top`, it stops early once the `top` largest Ritz values have residual
    beta_m |s_m| below `tol` times the largest |Ritz value|; it stops too when the Krylov
    space is exhausted (beta ~ 0). With a list `keep`, the Lanczos vectors (one per alpha)
    are put in it, for Ritz vectors (`top_eigenvectors`). With a dict `info`, info["beta"]
    is the norm of the last step's remainder, beta_m: Ritz pair i's residual
    ||H y_i - theta_i y_i|| is beta_m |s_mi| (`ritz_residuals`)."""
    q = v0 / v0.norm()
    basis = [] if keep is None else keep
    basis.append(q)
    alphas: list[float] = []
    betas: list[float] = []
    for j in range(steps):
        w = hvp(q)
        a = float(w @ q)
        alphas.append(a)
        for _ in range(2):
            qs = torch.stack(basis)
            w = w - qs.T @ (qs @ w)
        if mask is not None:
            w = w * mask
        b = float(w.norm())
        if progress is not None:
            progress(j + 1, steps, f"Lanczos step {j + 1} (of at most {steps})")
        if top is not None and len(alphas) >= top:
            theta, s = _ritz(alphas, betas)
            scale = max(float(np.abs(theta).max()), 1e-30)
            res = np.abs(b * s[-1, -top:])
            if np.all(res <= tol * scale):
                break
        if b <= 1e-10 * max(1.0, abs(a)) or j == steps - 1:
            break
        betas.append(b)
        q = w / b
        basis.append(q)
    if info is not None:
        info["beta"] = b
    return np.asarray(alphas), np.asarray(betas[:len(alphas) - 1])


def _ritz(alphas: list[float], betas: list[float]) -> tuple[np.ndarray, np.ndarray]:
    t = np.diag(np.asarray(alphas, dtype=np.float64))
    if betas:
        b = np.asarray(betas[:len(alphas) - 1], dtype=np.float64)
        t += np.diag(b, 1) + np.diag(b, -1)
    return np.linalg.eigh(t)


def ritz_residuals(s: np.ndarray, beta: float, k: int) -> list[float]:
    """||H y - theta y|| of the k largest Ritz pairs (largest first): beta_m |s_mi|, the
    standard Lanczos bound, which also bounds each Ritz value's distance to an eigenvalue
    of H (exact arithmetic; full reorthogonalisation keeps it so)."""
    return [float(abs(beta * s[-1, i])) for i in range(s.shape[1] - 1, -1, -1)][:k]


def rademacher(n: int, gen: torch.Generator, dtype, device) -> Tensor:
    return (torch.randint(0, 2, (n,), generator=gen, dtype=torch.int64) * 2 - 1).to(
        dtype=dtype, device=device)


def hutchinson(hvp: Hvp, n: int, probes: int, gen: torch.Generator, dtype, device,
               mask: Tensor | None = None, progress: Progress | None = None,
               rows: Hvp | None = None) -> tuple[float, float | None]:
    """tr(H) ~ mean over Rademacher probes z of z^T H z, with the standard error of that mean
    (sample standard deviation / sqrt(probes)). A single probe has no spread, so its error is
    undefined: None, never NaN (a NaN would reach the JSON, which is strict, and print as a
    number).

    When `probes` is at least the number of parameters, the n unit vectors are exact and no
    more work: the trace is then sum_i e_i^T H e_i, with standard error 0. `rows` (H V for
    the rows of V: Curvature.hvp_rows) takes EXACT_ROWS unit vectors per pass."""
    idx = torch.arange(n, device=device) if mask is None else mask.nonzero().flatten()
    m = int(idx.numel())
    if probes >= m and rows is not None:
        total = 0.0
        for chunk in idx.split(EXACT_ROWS):
            k = torch.arange(len(chunk), device=device)
            e = torch.zeros(len(chunk), n, dtype=dtype, device=device)
            e[k, chunk] = 1.0
            total += float(rows(e)[k, chunk].sum())
        return total, 0.0
    if probes >= m:
        total = 0.0
        for i in idx.tolist():
            e = torch.zeros(n, dtype=dtype, device=device)
            e[i] = 1.0
            total += float(hvp(e)[i])
        return total, 0.0
    vals = []
    for i in range(probes):
        z = rademacher(n, gen, dtype, device)
        if mask is not None:
            z = z * mask
        vals.append(float(z @ hvp(z)))
        if progress is not None:
            progress(i + 1, probes, f"trace probe {i + 1} of {probes}")
    arr = np.asarray(vals)
    se = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else None
    return float(arr.mean()), se


def density(hvp: Hvp, n: int, probes: int, steps: int, gen: torch.Generator, dtype, device,
            mask: Tensor | None = None, points: int = 201, width: float | None = None
            ) -> dict:
    """The eigenvalue density by stochastic Lanczos quadrature: for each Rademacher probe z,
    Lanczos's tridiagonal T gives nodes theta_k (its eigenvalues) and weights tau_k^2 (the
    squared first components of its eigenvectors): the Gauss quadrature of the spectral
    measure of H seen from z. The density is the average over probes of the nodes, each
    spread as a Gaussian of `width` (default 1/100 of the span), and normalised to
    integrate to 1 (its mass at a value is the fraction of eigenvalues near it)."""
    nodes, weights = [], []
    for _ in range(probes):
        z = rademacher(n, gen, dtype, device)
        if mask is not None:
            z = z * mask
        a, b = lanczos(hvp, z, steps, mask)
        theta, s = _ritz(list(a), list(b))
        nodes.append(theta)
        weights.append(s[0] ** 2 / probes)
    th, wt = np.concatenate(nodes), np.concatenate(weights)
    lo, hi = float(th.min()), float(th.max())
    span = max(hi - lo, 1e-12)
    sigma = width or span / 100
    grid = np.linspace(lo - 0.05 * span, hi + 0.05 * span, points)
    dens = (wt[None, :] * np.exp(-((grid[:, None] - th[None, :]) ** 2) / (2 * sigma**2))
            ).sum(1) / (sigma * math.sqrt(2 * math.pi))
    return {"grid": grid.tolist(), "density": dens.tolist(), "nodes": th.tolist(),
            "weights": wt.tolist(), "sigma": sigma}


# ---- the measurement ---------------------------------------------------------------------

@dataclass
class GroupCurvature:
    group: str
    n_params: int
    eigenvalues: list[float]
    trace: float | None = None
    trace_se: float | None = None  # None without a trace, or from one probe (no spread)
    residual: float = 0.0  # the largest ||H y - theta y|| of the group's top Ritz pairs
    converged: bool = True


@dataclass
class HessianResult:
    """What `hessian` found; `to_dict()` is the JSON (eigenvalues largest first)."""

    model: str
    split: str  # the split's name (test, train), as every record's JSON says it
    n: int  # examples
    n_params: int
    loss: float
    eigenvalues: list[float]
    trace: float | None
    trace_se: float | None  # None without a trace, or from one probe (no spread)
    probes: int
    by: str
    groups: list[GroupCurvature] = field(default_factory=list)
    density: dict | None = None
    hvps: int = 0
    seconds: float = 0.0
    device: str = "cpu"
    # the largest ||H y - theta y|| of the reported Ritz pairs, and whether every one is at
    # most CONVERGED times the largest |eigenvalue| (each eigenvalue is then that close to
    # one of H's); False: too few --iterations for these eigenvalues
    residual: float = 0.0
    converged: bool = True
    data: str = ""  # the data reference the split was read from (digits, text:FILE)

    def to_dict(self) -> dict:
        return asdict(self)


def top_eigenvalues(hvp: Hvp, n: int, k: int, gen: torch.Generator, dtype, device,
                    mask: Tensor | None = None, steps: int = 100, tol: float = 1e-7,
                    progress: Progress | None = None) -> list[float]:
    """The k largest eigenvalues (largest first) by Lanczos with full reorthogonalisation
    from a seeded Gaussian start (restricted to `mask` when given)."""
    return top_ritz(hvp, n, k, gen, dtype, device, mask, steps, tol, progress)[0]


def top_ritz(hvp: Hvp, n: int, k: int, gen: torch.Generator, dtype, device,
             mask: Tensor | None = None, steps: int = 100, tol: float = 1e-7,
             progress: Progress | None = None) -> tuple[list[float], list[float]]:
    """`top_eigenvalues` and each one's residual ||H y - theta y|| (`ritz_residuals`), so a
    caller can say when the steps allowed did not make them converge."""
    m = n if mask is None else int(mask.sum())
    v0 = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
    if mask is not None:
        v0 = v0 * mask
    info: dict = {}
    a, b = lanczos(hvp, v0, min(steps, m), mask, top=min(k, m), tol=tol, progress=progress,
                   info=info)
    theta, s = _ritz(list(a), list(b))
    return [float(t) for t in theta[::-1][:k]], ritz_residuals(s, info["beta"], k)


def converged(eigenvalues: list[float], residuals: list[float], want: int = 0) -> bool:
    """Every residual at most CONVERGED times the largest |eigenvalue|, and at least `want`
    eigenvalues (as many as asked, where the space allows)."""
    scale = max((abs(e) for e in eigenvalues), default=0.0)
    return len(eigenvalues) >= want and all(r <= CONVERGED * max(scale, 1e-30)
                                            for r in residuals)


def top_eigenvectors(hvp: Hvp, n: int, k: int, gen: torch.Generator, dtype, device,
                     mask: Tensor | None = None, steps: int = 100, tol: float = 1e-7,
                     info: dict | None = None) -> tuple[list[float], list[Tensor]]:
    """The k largest eigenvalues (largest first) and their unit eigenvectors (flat, zero
    outside `mask`), as Ritz pairs of the same seeded Lanczos run as `top_eigenvalues`: the
    Ritz vector of Ritz value theta_i is sum_j s_ji q_j over the Lanczos vectors q_j. The
    vectors are orthonormal (full reorthogonalisation keeps the q_j so). With a dict `info`,
    info["residual"] and info["converged"] say how far the pairs are from converged (as
    `hessian` reports them), for a slice along them."""
    m = n if mask is None else int(mask.sum())
    v0 = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
    if mask is not None:
        v0 = v0 * mask
    basis: list[Tensor] = []
    last: dict = {}
    a, b = lanczos(hvp, v0, min(steps, m), mask, top=min(k, m), tol=tol, keep=basis,
                   info=last)
    theta, s = _ritz(list(a), list(b))
    if info is not None:
        vals, res = [float(t) for t in theta[::-1][:k]], ritz_residuals(s, last["beta"], k)
        info["residual"], info["converged"] = max(res, default=0.0), converged(vals, res)
    qs = torch.stack(basis[:len(a)]).to(torch.float64)
    vecs = []
    for i in range(len(theta) - 1, max(len(theta) - 1 - k, -1), -1):
        v = qs.T @ torch.as_tensor(s[:, i], dtype=torch.float64, device=qs.device)
        vecs.append((v / v.norm()).to(dtype))
    return [float(t) for t in theta[::-1][:k]], vecs


def hessian(loaded: Loaded, state: Mapping[str, Tensor] | None, split, device="cpu",
            top: int = 3, probes: int = 0, by: str = "none", seed: int = 0,
            batch_size: int = 512, steps: int = 100, density_probes: int = 0,
            dtype: torch.dtype | None = None, progress: Progress | None = None
            ) -> HessianResult:
    """Top-`top` eigenvalues of the Hessian of the split's mean loss at `state` (the model's
    own state by default), its Hutchinson trace with `probes` probes (0: none), and with `by`
    ('block' or 'kind') the same per group of parameters; with `density_probes`, the SLQ
    density. Seeded: the same call gives the same numbers."""
    t0 = time.perf_counter()
    ev = Evaluator(loaded, split, device, batch_size)
    cur = Curvature(ev, loaded.state if state is None else state, dtype)
    gen = torch.Generator().manual_seed(int(seed))
    dt, dev = cur.dtype, cur.device

    eig, res = top_ritz(cur.hvp, cur.n, top, gen, dt, dev, steps=steps, progress=progress)
    ok = converged(eig, res, min(top, cur.n))
    tr = se = None
    if probes:
        tr, se = hutchinson(cur.hvp, cur.n, probes, gen, dt, dev, progress=progress,
                            rows=cur.hvp_rows)
    groups = []
    if by != "none":
        masks = cur.masks(by, loaded)
        for i, (g, mask) in enumerate(masks.items()):
            if progress is not None:
                progress(i, len(masks), f"group {g}")
            h = restricted(cur.hvp, mask)
            ge, gr = top_ritz(h, cur.n, top, gen, dt, dev, mask, steps)
            gt = gse = None
            if probes:
                gt, gse = hutchinson(h, cur.n, probes, gen, dt, dev, mask)
            groups.append(GroupCurvature(g, int(mask.sum()), ge, gt, gse, max(gr, default=0.0),
                                         converged(ge, gr, min(top, int(mask.sum())))))
    dens = density(cur.hvp, cur.n, density_probes, min(steps, cur.n), gen, dt, dev) \
        if density_probes else None
    return HessianResult(loaded.ref, split.split, split.n, cur.n, cur.loss(), eig, tr, se,
                         probes, by, groups, dens, cur.hvps, time.perf_counter() - t0,
                         str(ev.device), max(res, default=0.0), ok, data=split.data)

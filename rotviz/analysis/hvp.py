"""Hessian-vector products of the test loss, and the groups of parameters a curvature is
restricted to: the one place that differentiates a model twice (the hessian, sharpness and
flat records, the slice's Hessian directions all take their products here).

The loss is the split's mean loss, L(theta) = sum_i loss_i(theta) / sum_i count_i, exactly
what `Evaluator.evaluate` reports, taken over the whole split (full batch), so every number
built on it is a property of one deterministic function of the parameters. The Hessian is
never formed: H v is a double backward pass through the anchor's module run functionally
(`Evaluator.logits` -> torch.func.functional_call), batch by batch, summed, so neither the
caller's tensors nor the loaded model are touched.

Products are the costly part (a Lanczos run takes one per step, a trace one per probe), so
the graph of each batch's gradient (forward pass, then a backward pass that builds its own
graph) is kept after the first product and every later product is one backward pass through
it: about 0.6 of the cost of building it afresh (docs/landscape.md, "hessian"). The graphs
are kept only while their saved tensors fit `RETAIN_BYTES` in all (counted on the first
build, batch by batch): the batches past that budget are differentiated afresh each time,
as before, so a large model or split costs time, never the memory of the whole split.

A restriction to a group G of parameters is the principal sub-matrix H_GG: the probe is zero
outside G and only G's part of H v is kept (`restricted`). Its eigenvalues interlace the full
ones (Cauchy), and its trace is the part of the full trace that G holds, so the groups'
traces sum to the whole trace.

Groups (docs/landscape.md, "hessian"): by block, every tensor under a block prefix of the
model's resolved layout (rotviz.symmetry.view.resolve_layout: `vit.layers.3.`, `h.3.`, ...)
belongs to that block and everything else to "outside" (embeddings, final norm, head); by
kind, a block tensor is "qk" (queries and keys), "vo" (values and the output projection),
"qkv" (a fused projection that holds both), "ffn", "norms" (per-head q/k norms too) or
"other", and a tensor outside the blocks "embeddings", "norms" or "head".
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rotviz.analysis.lanczos import Hvp
from rotviz.data.tasks import sample_losses
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.sources.loading import Loaded

Tensor = torch.Tensor
CHUNK = 64  # unit vectors per batched Hessian-vector product of a dense block
# the most bytes of saved tensors the kept gradient graphs may hold, all batches together
# (the digits ViT on its 397 test images needs about 0.2 GB; a batch past it is recomputed)
RETAIN_BYTES = 2 << 30


class Curvature:
    """H v of the split's mean loss at one parameter set of `ev`'s module, on flat vectors.

    The parameters that count are the module's trainable floating parameters (tied weights
    once, as `Evaluator.names` lists them; floating buffers are held fixed). `dtype` casts
    the parameters, buffers and inputs (float64 gives exact comparisons on tiny models).
    `retain`: the byte budget of the kept gradient graphs (0: keep none, every product
    differentiates afresh)."""

    def __init__(self, ev: Evaluator, state: Mapping[str, Tensor],
                 dtype: torch.dtype | None = None, retain: int = RETAIN_BYTES):
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
        self.retain = int(retain)
        self.kept_bytes = 0  # saved-tensor bytes of the kept graphs
        self._kept: dict[int, _Graph] = {}  # batch index -> its kept gradient graph
        self._built = False  # every batch's graph built once (kept or dropped)

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

    def _build(self, x, y, count: bool) -> _Graph:
        """One batch's loss and the graph of its gradient; with `count`, the bytes of the
        tensors the graph saves (each storage once) go in its `bytes`."""
        seen: dict[tuple[int, int], int] = {}

        def pack(t: Tensor) -> Tensor:
            try:
                st = t.untyped_storage()
                seen[(st.data_ptr(), t.device.index or 0)] = st.nbytes()
            except (RuntimeError, NotImplementedError):  # no plain storage: as its elements
                seen[(id(t), -1)] = t.numel() * t.element_size()
            return t

        ps = [p.clone().requires_grad_(True) for p in self.point]
        with torch.enable_grad():
            if count:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    loss = self._loss(ps, x, y)
                    g = self._grads(loss, ps)
            else:
                loss = self._loss(ps, x, y)
                g = self._grads(loss, ps)
        return _Graph(ps, g, float(loss.detach()), int(sum(seen.values())))

    def _graphs(self):
        """(batch's graph, keep it for later products) for each batch: the kept ones as they
        are; the others built afresh. On the first pass every batch is built and kept while
        the kept graphs' bytes stay within `retain`."""
        for i, (x, y) in enumerate(self.ev.batches):
            if i in self._kept:
                yield self._kept[i], True
                continue
            graph = self._build(x, y, count=not self._built and self.retain > 0)
            keep = not self._built and 0 < graph.bytes <= self.retain - self.kept_bytes
            if keep:
                self._kept[i] = graph
                self.kept_bytes += graph.bytes
            yield graph, keep
        self._built = True

    def release(self) -> None:
        """Drop the kept graphs (their memory); later products differentiate afresh."""
        self._kept.clear()
        self.kept_bytes = 0
        self._built = True

    def loss(self) -> float:
        if self._built and len(self._kept) == len(self.ev.batches):
            return float(sum(g.loss for g in self._kept.values()))
        with torch.no_grad():
            return float(sum(self._loss(self.point, x, y) for x, y in self.ev.batches))

    def gradient(self) -> Tensor:
        total = torch.zeros(self.n, dtype=self.dtype, device=self.device)
        for i, (x, y) in enumerate(self.ev.batches):
            if i in self._kept:
                total += self.flat([gi.detach() for gi in self._kept[i].g])
                continue
            ps = [p.clone().requires_grad_(True) for p in self.point]
            g = self._grads(self._loss(ps, x, y), ps, create_graph=False)
            total += self.flat(list(g))
        return total

    def hvp(self, v: Tensor) -> Tensor:
        """H v (v flat, of length `n`): one backward pass per batch through the batch's
        gradient graph (kept, or built afresh), summed."""
        vs = self.unflat(v.to(self.dtype))
        total = torch.zeros(self.n, dtype=self.dtype, device=self.device)
        with torch.enable_grad():
            for graph, keep in self._graphs():
                live = graph.live()  # the others' H rows are 0
                if not live:
                    continue
                hv = torch.autograd.grad([graph.g[i] for i in live], graph.ps,
                                         [vs[i] for i in live], retain_graph=keep,
                                         allow_unused=True)
                total += self.flat([h if h is not None else torch.zeros_like(p)
                                    for h, p in zip(hv, graph.ps, strict=True)])
        self.hvps += 1
        return total.detach()

    def hvp_rows(self, vs: Tensor) -> Tensor:
        """H V for the rows of `vs` (k, n) at once: one backward pass per batch with k
        batched output gradients (torch.autograd.grad's is_grads_batched, a vmap over the
        second backward), the same numbers as k calls of `hvp`."""
        vs = vs.to(dtype=self.dtype, device=self.device)
        k = vs.shape[0]
        total = torch.zeros(k, self.n, dtype=self.dtype, device=self.device)
        parts = torch.split(vs, self.sizes, dim=1)
        with torch.enable_grad():
            for graph, keep in self._graphs():
                live = graph.live()
                if not live:
                    continue
                outs = [parts[i].reshape(k, *self.shapes[i]) for i in live]
                hv = torch.autograd.grad([graph.g[i] for i in live], graph.ps, outs,
                                         retain_graph=keep, allow_unused=True,
                                         is_grads_batched=True)
                total += torch.cat([h.reshape(k, -1) if h is not None else
                                    torch.zeros(k, p.numel(), dtype=self.dtype,
                                                device=self.device)
                                    for h, p in zip(hv, graph.ps, strict=True)], dim=1)
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


class _Graph:
    """One batch's gradient graph: the leaf copies of the parameters `ps`, the gradient `g`
    (built with create_graph), the batch's loss and the bytes the graph saves."""

    def __init__(self, ps: list[Tensor], g: list[Tensor], loss: float, nbytes: int):
        self.ps, self.g, self.loss, self.bytes = ps, g, loss, nbytes

    def live(self) -> list[int]:
        """The parameters whose gradient depends on the parameters (the rest: H rows 0)."""
        return [i for i, gi in enumerate(self.g) if gi.requires_grad]


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


def dense_block(cur: Curvature, mask: Tensor) -> Tensor:
    """H_GG (m x m, symmetrised) for the coordinates in `mask`: one column per unit vector,
    CHUNK columns per batched product."""
    idx = mask.nonzero().flatten()
    m = int(idx.numel())
    out = torch.empty(m, m, dtype=cur.dtype, device=cur.device)
    for start in range(0, m, CHUNK):
        cols = idx[start:start + CHUNK]
        e = torch.zeros(len(cols), cur.n, dtype=cur.dtype, device=cur.device)
        e[torch.arange(len(cols)), cols] = 1.0
        out[start:start + len(cols)] = cur.hvp_rows(e)[:, idx]
    return (out + out.T) / 2

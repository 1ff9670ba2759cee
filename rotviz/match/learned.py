"""Learned matching (GLMC paper): tune the maps on data so the path has no barrier.

Start from activation matching (`learned` alone) or weight matching (`weight,learned`), on
canonical forms (rotviz.symmetry.residual). Parametrise the residual map as a rotation (the
Cayley map of S - S^T), and every per-head Q-K and V-O map as an invertible exp(S) (a rotation
where the architecture allows no more), applied on top of that start, and minimise the task
loss of the interpolated model (1 - lam) anchor + lam source' at lam ~ U(lam_lo, lam_hi) on
training batches (Adam, a short linear warm-up, then cosine decay to zero).
Permutations stay as weight matching left them. The maps are float64 group elements
(write_state hands the model the moved weights in the checkpoint's dtype).
Every `eval_every` steps the barrier is measured on the validation split. By default the maps
of the last step are kept (falling back to the start if their validation barrier is higher);
`keep="best"` keeps the maps of the best check and stops after `patience` checks without
improvement (see docs/solvers.md for why the last maps are the default). Every map is a
group element, so the function never changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from rotviz.analysis.paths import path_point
from rotviz.data.inputs import Inputs, cat_inputs, map_inputs
from rotviz.data.split import Split
from rotviz.data.tasks import sample_losses
from rotviz.devices import resolve_device, wide_device
from rotviz.evaluation import IGNORE, Evaluator, barrier_of
from rotviz.groups import centred_lift, ones_complement, rope_free, rope_pairs
from rotviz.match.options import LearnOptions
from rotviz.sources.loading import Loaded
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import LayerTransform, apply
from rotviz.symmetry.view import ModelView, write_state
from rotviz.types import Progress

Tensor = torch.Tensor


@dataclass
class LearnInfo:
    steps: int = 0
    best_step: int = 0
    stopped: str = ""  # "patience", "steps" or "cancelled"
    seconds: float = 0.0
    val_barrier_start: float = 0.0
    val_barrier: float = 0.0  # of the maps kept
    history: list[dict] = field(default_factory=list)  # per check: step, train_loss, val_barrier
    learned: list[str] = field(default_factory=list)  # which maps were tuned

    def to_dict(self) -> dict:
        return dict(vars(self))


def rope_mask(view: ModelView) -> Tensor | None:
    """Under rotary embeddings only per-frequency-pair rotations keep Q-K: the skew
    generator may only pair i with its partner, and mix freely the dims rotary embeddings
    leave alone (partial rotary)."""
    rope = view.dims.rope
    if rope is None:
        return None
    dh = view.blocks[0].attn.wq.shape[1]
    mask = torch.zeros(dh, dh)
    if view.dims.qk_norm:  # q/k norms (Qwen3) fix most pairs' angles: no learned Q-K turn
        return mask
    a, b = rope_pairs(dh, rope)
    mask[a, b] = 1.0
    mask[b, a] = 1.0
    k = rope_free(dh, rope)
    mask[k[:, None], k] = 1.0
    return mask


def rope_generator(s: Tensor, rope: str) -> Tensor:
    """The part of free generators `s` (..., d_h, d_h) whose exponential commutes with rotary
    embeddings: on each frequency pair (i, j) a turn (s_ij - s_ji on the pair, skew) and one
    scale (the mean of s_ii and s_jj on both), zero between pairs, and anything among the dims
    rotary embeddings leave alone. exp of it is a 2x2 rotation times a scale per pair."""
    dh = s.shape[-1]
    i, j = rope_pairs(dh, rope)
    k = rope_free(dh, rope)
    g = torch.zeros_like(s)
    turn = s[..., i, j] - s[..., j, i]
    scale = 0.5 * (s[..., i, i] + s[..., j, j])
    g[..., i, j] = turn
    g[..., j, i] = -turn
    g[..., i, i] = scale
    g[..., j, j] = scale
    g[..., k[:, None], k] = s[..., k[:, None], k]
    return g


class Maps(torch.nn.Module):
    """Generators of the learned maps, all zero at the start (= weight matching): a rotation
    of the stream (the Cayley map of S - S^T), and per KV group a Q-K and a V-O map, exp(S)
    (invertible: the whole group of these maps, docs/symmetries.md) with `opts.invertible`,
    else rotations. Under rotary embeddings the Q-K generator keeps to rotation-scales per
    frequency pair (`rope_generator`); under q/k norms the Q-K map stays the identity."""

    def __init__(self, view: ModelView, group: str | None, opts: LearnOptions):
        super().__init__()
        d = view.dims.d_model
        self.group = group
        self.invertible = opts.invertible
        self.rope = view.dims.rope
        self.qk_fixed = bool(view.dims.qk_norm)
        self.residual = None
        if opts.residual and group in ("orthogonal", "centred"):
            k = d - 1 if group == "centred" else d
            self.residual = torch.nn.Parameter(torch.zeros(k, k, dtype=torch.float64))
            self.register_buffer("bz", ones_complement(d) if group == "centred" else None)
        self.qk = self.vo = None
        if opts.heads:
            a = view.blocks[0].attn
            shape = (len(view.blocks), a.wk.shape[0], a.wk.shape[1], a.wk.shape[1])
            self.qk = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float64))
            self.vo = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float64))
        mask = rope_mask(view)
        self.register_buffer("mask", None if mask is None else mask.double())

    @staticmethod
    def _rot(s: Tensor, mask: Tensor | None = None) -> Tensor:
        """The Cayley map (I - A)^-1 (I + A) of the skew A = S - S^T (masked: block-diagonal
        A gives block-diagonal rotations): orthogonal with determinant 1 to rounding for every
        S, and every rotation without the eigenvalue -1 is one, which a map grown from the
        identity never needs. Forward and backward at d = 64: 0.6 ms against matrix_exp's
        4.5 ms (one CPU thread), about 4% of a learned step on the default pair."""
        a = s - s.transpose(-1, -2)
        if mask is not None:
            a = a * mask
        eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        return torch.linalg.solve(eye - a, eye + a)

    def _qk(self) -> Tensor:
        if self.qk_fixed:  # the identity (its generator gets no gradient)
            return torch.eye(self.qk.shape[-1], dtype=self.qk.dtype,
                             device=self.qk.device).expand_as(self.qk)
        if not self.invertible:
            return self._rot(self.qk, self.mask)
        s = self.qk if self.rope is None else rope_generator(self.qk, self.rope)
        return torch.linalg.matrix_exp(s)

    def _vo(self) -> Tensor:
        return torch.linalg.matrix_exp(self.vo) if self.invertible else self._rot(self.vo)

    def names(self) -> list[str]:
        return [n for n, p in (("residual", self.residual), ("qk", self.qk), ("vo", self.vo))
                if p is not None]

    def transform(self, view: ModelView) -> ModelView:
        """The view moved by the current maps (differentiable)."""
        if self.qk is not None:
            qk, vo = self._qk(), self._vo()
            view = apply(view, {i: LayerTransform(qk=qk[i], vo=vo[i])
                                for i in range(len(view.blocks))})
        if self.residual is not None:
            r = self._rot(self.residual)
            q = centred_lift(r, self.bz) if self.group == "centred" else r
            view = rs.apply_residual(view, q, check=False)
        return view


def lr_factor(k: int, opts: LearnOptions) -> float:
    """The learning rate of step k + 1 over `opts.lr`: a linear warm-up over `opts.warmup`
    steps (a quarter of a shorter run), then cosine decay to zero at `opts.steps`."""
    w = min(opts.warmup, opts.steps // 4)
    if k < w:
        return (k + 1) / (w + 1)
    return 0.5 * (1 + np.cos(np.pi * min(k - w, opts.steps - w) / (opts.steps - w)))


def _train_loss(ev: Evaluator, params: dict[str, Tensor], x: Inputs, y: Tensor) -> Tensor:
    logits = ev.logits(params, x).float()
    if ev.split.task in ("multi-label", "regression"):  # the head's own mean loss
        loss, _, count = sample_losses(ev.split.task, logits, y, lambda t: t)
        return loss.sum() / count.sum()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                           ignore_index=IGNORE)


def learn(
    anchor: Loaded,
    anchor_c: ModelView,
    start_c: ModelView,
    group: str | None,
    train: Split,
    val: Split,
    opts: LearnOptions | None = None,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    cancel: Callable[[], bool] | None = None,
) -> tuple[ModelView, LearnInfo]:
    """Tune the maps on top of `start_c` (the weight-matched source, canonical) against
    `anchor_c` (the canonical anchor). Returns the tuned canonical source and what happened."""
    t0 = time.perf_counter()
    opts = opts or LearnOptions()
    info = LearnInfo()
    torch.manual_seed(opts.seed)
    gen = np.random.default_rng(opts.seed)
    device = wide_device(resolve_device(device))  # float64 maps: the CPU stands in for MPS
    ev_train = Evaluator(anchor, train, device, batch_size=opts.batch_size)
    ev_val = Evaluator(anchor, val, device)
    dev = ev_train.device
    anchor_c = anchor_c.to(torch.float64, dev)
    start_c = start_c.to(torch.float64, dev)
    maps = Maps(start_c, group, opts).to(dev)
    info.learned = maps.names()
    pa = ev_train.params(write_state(anchor_c))
    pa = {k: v.detach() for k, v in pa.items()}

    def source_params() -> dict[str, Tensor]:  # not detached: gradients reach the maps
        state = write_state(maps.transform(start_c))
        return {n: state[n].to(dev) for n in ev_train.names}

    with torch.no_grad():
        ends = [ev_val.evaluate(pa)[0], ev_val.evaluate(source_params())[0]]

    alphas = np.linspace(0.0, 1.0, opts.val_points).tolist()

    def val_barrier() -> float:
        with torch.no_grad():
            ps = source_params()
            loss = [ends[0]] + [ev_val.evaluate(path_point(pa, ps, a))[0]
                                for a in alphas[1:-1]] + [ends[1]]
        return barrier_of(alphas, loss)

    def snapshot() -> dict[str, Tensor]:
        return {k: v.detach().clone() for k, v in maps.state_dict().items()}

    start = best = val_barrier()
    info.val_barrier_start = best
    start_state = best_state = snapshot()
    info.history.append({"step": 0, "train_loss": None, "val_barrier": best})
    if not info.learned:
        info.stopped = "nothing to learn"
        info.val_barrier = best
        return start_c, info
    optim = torch.optim.Adam(maps.parameters(), lr=opts.lr)
    # cosine decay to zero: late steps refine instead of hopping between nearby maps
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda k: lr_factor(k, opts))
    batches = ev_train.batches
    xs = cat_inputs([x for x, _ in batches])
    ys = torch.cat([y for _, y in batches])
    n = len(ys)
    bad = 0
    recent: list[float] = []
    last = start
    info.stopped = "steps"
    for step in range(1, opts.steps + 1):
        if cancel is not None and cancel():
            info.stopped = "cancelled"
            break
        idx = torch.as_tensor(gen.choice(n, size=min(opts.batch_size, n), replace=False))
        lam = float(gen.uniform(*opts.lam))
        ps = source_params()
        params = path_point(pa, ps, lam)
        pick = idx.to(ys.device)
        loss = _train_loss(ev_train, params, map_inputs(xs, lambda t, i=pick: t[i]), ys[pick])
        optim.zero_grad()
        loss.backward()
        optim.step()
        sched.step()
        value = float(loss.detach())
        recent.append(value)
        info.steps = step
        if progress:
            progress(step, opts.steps, f"step {step}: loss at lam {lam:.2f} = {value:.3f}")
        if step % opts.eval_every == 0 or step == opts.steps:
            last = val_barrier()
            info.history.append({"step": step, "train_loss": float(np.mean(recent)),
                                 "val_barrier": last})
            recent = []
            if opts.keep == "best":
                if last < best - 1e-6:
                    best, bad = last, 0
                    info.best_step = step
                    best_state = snapshot()
                else:
                    bad += 1
                    if bad >= opts.patience:
                        info.stopped = "patience"
                        break
    if opts.keep == "last" and info.steps:
        if info.history[-1]["step"] != info.steps:  # cancelled between checks
            last = val_barrier()
            info.history.append({"step": info.steps,
                                 "train_loss": float(np.mean(recent)) if recent else None,
                                 "val_barrier": last})
        if last <= start:
            best, best_state, info.best_step = last, snapshot(), info.steps
        else:  # worse than weight matching on validation: keep the start
            best, best_state, info.best_step = start, start_state, 0
    maps.load_state_dict(best_state)
    with torch.no_grad():
        out = maps.transform(start_c)
    info.val_barrier = best
    info.seconds = time.perf_counter() - t0
    return out, info

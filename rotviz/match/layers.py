"""The seed paper's matching (Algorithm 1): move the source next to the anchor in its class.

- FFN (Eq. 7): linear assignment on [W_in, b_in, W_out^T] (and a gated FFN's W_gate, b_gate);
  with rescaling, a gated FFN's units then get the best up/down scale each (the quartic below).
- Attention (Theorem 4.1): per-head orthogonal Procrustes for Q-K and V-O, biases included,
  all heads of a layer in one batched SVD. Under grouped-query attention one map per KV group,
  from cross matrices summed over the group's query heads. Under rotary embeddings the Q-K map
  is solved per frequency pair (a 2x2 rotation, then a scale per pair), which keeps it in the
  group that commutes with the position rotations.
- Head permutation (beyond the paper, off by default): per layer, every (source head, anchor
  head) pair is scored by its Procrustes gain (nuclear norms of its Q-K and V-O cross matrices,
  all H x H pairs in one batched SVD), and a linear assignment picks the heads before rotating.
  Under grouped-query attention whole KV groups are assigned, with the query heads of each pair
  of groups assigned inside it first.
- Rescaling (Eq. 11-12): per head, the real root of A a^4 - B a^3 + D a - C = 0 that minimises
  f(a) = A a^2 - 2 B a + C / a^2 - 2 D / a.
The anchor is never changed; the source's view is replaced, not modified. The solvers
themselves: rotviz.match.layer_solvers; here, the algorithm that runs them layer by layer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import torch

from rotviz.groups import (
    assign,
    procrustes,
    rope_free,
    rope_pairs,
    rope_procrustes,
    rotation_angles,
)
from rotviz.match.distances import Distances, distances
from rotviz.match.layer_solvers import (
    _assign_heads,
    ffn_cost,
    ffn_scales,
    free_scales_after,
    gain_dots,
    pair_parts,
    qk_parts,
    rope_scales_after,
    scales_after,
    vo_parts,
)
from rotviz.match.memo import TensorMemo
from rotviz.match.options import MatchOptions
from rotviz.match.report import HeadReport, MatchReport, MatchResult
from rotviz.symmetry.actions import (
    LayerTransform,
    apply_layer,
    check_heads_movable,
    permute_ffn,
    permute_heads,
    qk_fixed_pairs,
)
from rotviz.symmetry.view import Attention, ModelView
from rotviz.types import Progress

Tensor = torch.Tensor

# ---- the algorithm --------------------------------------------------------------------------


# Threads (at most; never more than the usable cores) that run scipy's assignment solver,
# which releases the GIL, while the main thread builds the next cost matrices; 0 solves
# inline. At most this many cost matrices are alive at once. Layers narrower than
# LSA_INLINE_BELOW units are solved inline: a thread pool costs more than they do.
LSA_THREADS = 4
LSA_INLINE_BELOW = 1024


def _ffn_tensors(view: ModelView, i: int) -> tuple[Tensor | None, ...]:
    f = view.blocks[i].ffn
    return f.w_in, f.b_in, f.w_out, f.w_gate, f.b_gate


def _ffn_permutations(anchor: ModelView, source: ModelView, layers: Sequence[int],
                      tick: Callable[[str], None],
                      memo: TensorMemo | None = None) -> dict[int, Tensor]:
    out: dict[int, Tensor] = {}
    keys = {i: ("ffn-perm", (*_ffn_tensors(source, i), *_ffn_tensors(anchor, i)))
            for i in layers}  # (match() keeps these tags in step)
    todo = []
    for i in layers:  # layers solved before with these very tensors are look-ups
        found, perm = memo.find(*keys[i]) if memo is not None else (False, None)
        if found:
            tick(f"FFN, layer {i} (unchanged)")
            out[i] = perm
        else:
            todo.append(i)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = min(LSA_THREADS, cores or 1, len(todo))
    if todo and source.blocks[todo[0]].ffn.w_in.shape[0] < LSA_INLINE_BELOW:
        threads = 0
    if threads <= 0:
        for i in todo:
            tick(f"FFN, layer {i}")
            out[i] = assign(ffn_cost(anchor, source, i))
    else:
        futures: dict[int, Future] = {}
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for i in todo:
                tick(f"FFN, layer {i}")
                running = [f for f in futures.values() if not f.done()]
                if len(running) >= threads:  # bound memory: one cost matrix per thread
                    wait(running, return_when=FIRST_COMPLETED)
                futures[i] = pool.submit(assign, ffn_cost(anchor, source, i))
            out.update({i: f.result() for i, f in futures.items()})
    if memo is not None:
        for i in todo:
            memo.put(*keys[i], out[i])
    return {i: out[i] for i in layers}


def _match_attention(
    src: Attention, anc: Attention, options: MatchOptions, rep: HeadReport,
    rope: str | None = None,
) -> tuple[Tensor | None, Tensor, Tensor]:
    """One layer's head permutation (None unless options.heads) and Q-K and V-O maps
    (rotation times scale, per KV group, acting on the permuted heads); fills `rep`. With
    `rope` the Q-K maps are per-pair rotations and per-pair scales."""
    # The d_h x d_h problems are solved on the CPU (LAPACK beats GPU solvers at this size),
    # the SVD in float32 unless the weights are float64: the cross matrices of float32
    # weights hold no more digits, and float32 halves the cost of the largest step here.
    solve = torch.float64 if src.wq.dtype == torch.float64 else torch.float32
    fixed = qk_fixed_pairs(src, rope)  # q/k norms: pairs that may only turn by 0 or pi
    heads = None
    if options.heads:
        parts = tuple(p.cpu() for p in pair_parts(src, anc))
        heads, (mq, mk, mv, mo) = _assign_heads(parts, rope, solve, fixed, gain_dots(src, anc))
        rep.head_perm = heads.tolist()
        parts_qk, parts_vo = (mq, mk), (mv, mo)
        src = permute_heads(src, heads)
    else:
        parts_qk = tuple(p.cpu() for p in qk_parts(src, anc))
        parts_vo = tuple(p.cpu() for p in vo_parts(src, anc))
    h, dh = parts_qk[0].shape[:2]
    qk = vo = torch.eye(dh, dtype=torch.float64).expand(h, dh, dh)
    if options.attn:
        m_qk = parts_qk[0] + parts_qk[1]
        m = torch.stack([m_qk, parts_vo[0] + parts_vo[1]])
        both, sv = procrustes(m.to(solve))  # one batched SVD per layer
        both = both.double()
        qk, vo = both[0], both[1]
        if rope is not None:  # only rotations that commute with the position rotations
            qk = rope_procrustes(m_qk, rope, fixed)[0]
            both = torch.stack([qk, vo])
        rep.qk_singular, rep.vo_singular = sv[0].tolist(), sv[1].tolist()
        angles, dets = rotation_angles(both)
        rep.qk_angles, rep.vo_angles = angles[0].tolist(), angles[1].tolist()
        rep.qk_det, rep.vo_det = dets[0].tolist(), dets[1].tolist()
    if options.rescale:
        a_s, b_s = scales_after(src, qk, vo, parts_qk, parts_vo)
        if src.gq is not None:  # q/k norms divide any Q-K scale out: only V-O is rescaled
            a_s = torch.ones_like(a_s)
        elif rope is not None:
            pair = rope_scales_after(src, qk, parts_qk, rope)  # (H_kv, r / 2)
            free = free_scales_after(src, qk, parts_qk, rope)  # (H_kv,) or None
            i, j = rope_pairs(dh, rope)
            per_dim = torch.empty(h, dh, dtype=torch.float64)
            per_dim[:, i], per_dim[:, j] = pair, pair
            if free is not None:
                per_dim[:, rope_free(dh, rope)] = free[:, None]
                rep.qk_free_scale = free.tolist()
            qk = qk * per_dim[:, None, :]  # each pair's block times its scale
            rep.qk_pair_scale = pair.tolist()
            a_s = (pair.abs().log().mean(dim=-1).exp() if free is None  # |det A|^(1/d_h)
                   else per_dim.abs().log().mean(dim=-1).exp())
        else:
            qk = qk * a_s[:, None, None]
        rep.qk_scale, rep.vo_scale = a_s.tolist(), b_s.tolist()
        vo = vo * b_s[:, None, None]
    return heads, qk, vo


def match_layers(
    anchor: ModelView,
    source: ModelView,
    options: MatchOptions,
    progress: Progress | None = None,
    memo: TensorMemo | None = None,
) -> MatchResult:
    """The per-layer maps of `options` (FFN, attention, rescale, heads; not the residual
    stream: rotviz.match.engine picks the alternation for that). Returns the matched view,
    the group element and a report. `memo` lets repeated calls on partly unchanged views
    (alternation rounds) skip the FFN solves and distances of tensors they have seen."""
    t0 = time.perf_counter()
    if options.heads:
        check_heads_movable(source)
    layers = options.layers if options.layers is not None else tuple(range(anchor.dims.n_layers))
    reports = {i: HeadReport(layer=i) for i in layers}
    do_attn = options.attn or options.rescale
    total = len(layers) * (int(do_attn) + int(options.ffn))
    done = 0

    def tick(message: str) -> None:
        nonlocal done
        if progress:
            progress(done, total, message)
        done += 1

    attn: dict[int, tuple[Tensor | None, Tensor, Tensor]] = {}
    if do_attn:  # cheap: all of it before the FFN solver threads compete for the cores
        for i in layers:
            tick(f"attention, layer {i}")
            attn[i] = _match_attention(source.blocks[i].attn, anchor.blocks[i].attn,
                                       options, reports[i], anchor.dims.rope)
    perms = _ffn_permutations(anchor, source, layers, tick, memo) if options.ffn else {}
    view = source
    transforms: dict[int, LayerTransform] = {}
    for i in layers:
        perm = perms.get(i)
        scale = None
        if perm is not None:
            reports[i].ffn_moved = int((perm != torch.arange(len(perm))).sum())
            if options.rescale and source.dims.gated:
                moved = permute_ffn(source.blocks[i].ffn, perm)
                scale = ffn_scales(anchor.blocks[i].ffn, moved)
                q = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64)
                reports[i].ffn_scale_quantiles = torch.quantile(scale, q).tolist()
        heads, qk, vo = attn.get(i, (None, None, None))
        transforms[i] = LayerTransform(perm, qk, vo, heads, scale)
        view = apply_layer(view, i, transforms[i])
        if memo is not None and perm is not None and scale is None:
            # the units now sit where the optimum put them: on these tensors the identity
            # is an optimal assignment, so a later round need not solve it again
            memo.put("ffn-perm", (*_ffn_tensors(view, i), *_ffn_tensors(anchor, i)),
                     torch.arange(len(perm)))
    if progress:
        progress(total, total, "done")
    before = distances(source, anchor, memo=memo)
    kinds = (("ffn_in", "ffn_out") if options.ffn else ()) + (
        ("q", "k", "v", "o") if options.attn or options.rescale else ()) + (
        # projection q/k norms (OLMo-2): a head permutation moves the gain rows too
        ("norms",) if options.heads and source.spec.qk_norm_scope == "projection" else ())
    touched = {(i, k) for i in layers for k in kinds}  # every other cell is the same tensors
    after = Distances({**before.cells,
                       **distances(view, anchor, only=touched, memo=memo).cells})
    report = MatchReport(options, before, after, [reports[i] for i in layers])
    report.seconds = time.perf_counter() - t0
    return MatchResult(view, transforms, report)

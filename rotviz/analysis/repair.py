"""REPAIR (Jordan, Sedghi, Saukh, Entezari and Neyshabur, ICLR 2023): an interpolated or
merged model's units lose variance ("variance collapse", rotviz.measures.collapse); REPAIR
resets each unit's mean and standard deviation to the interpolation of the endpoints',

    target mean = (1 - alpha) mean_A + alpha mean_B',
    target std = (1 - alpha) std_A + alpha std_B',

measured on the TRAIN split, and folds the affine reset y -> s y + t (s = target std / std,
t = target mean - s mean) into the weights, so the result is a stock model of the same class.

Units corrected, per block (rotviz.analysis.activations):
- each head's output dimension: the rows of the value projection W_V and its bias are
  scaled and shifted. A head's output is sum_j a_ij (W_V x_j + b_V) with attention weights
  a_ij summing to 1 over the keys, so (s W_V, s b_V + t) maps the head output o to s o + t
  exactly, and leaves the attention pattern alone;
- each FFN hidden unit before the activation: the rows of the FFN-in projection and its bias.

Order: block by block, and within a block the heads first, then the FFN (the heads' fix
changes what the FFN reads). Each fix is measured on the model with every earlier fix in
place, as REPAIR resets its networks layer by layer, so every corrected unit ends with its
target statistics exactly (to float32 rounding). The residual stream itself is not reset:
no stock parameter of a pre-norm transformer scales it per coordinate, and the next
LayerNorm re-standardises what each sub-layer reads anyway.

A family without biases on V and the FFN-in projection (LLaMA and its kin), a gated FFN or
grouped-query attention (a value head shared by several query heads) cannot take the fold,
and is refused in one line (`refusal`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from rotviz.analysis.activations import UnitStats, activation_stats
from rotviz.analysis.merges import Merged
from rotviz.analysis.paths import Curve
from rotviz.data.split import Split
from rotviz.errors import RotvizError
from rotviz.sources.loading import Loaded

Tensor = torch.Tensor
TINY = 1e-12  # a unit whose std is below this is only shifted (its scale stays 1)


def refusal(loaded: Loaded) -> str | None:
    """Why REPAIR cannot fold into this model (one line), or None."""
    from rotviz.symmetry.view import read_view

    view = read_view(loaded.spec, loaded.config, loaded.state)
    blk = view.blocks[0]
    missing = [w for w, t in (("the value projection", blk.attn.bv),
                              ("the FFN-in projection", blk.ffn.b_in)) if t is None]
    why = (f"it has no bias on {' or '.join(missing)}" if missing else
           "its FFN is gated" if view.spec.gated else
           "its value heads are shared by several query heads"
           if view.dims.n_kv_heads != view.dims.n_heads else None)
    if why is None:
        return None
    return (f"--repair folds an affine reset into biases, and this {view.spec.family} model "
            f"cannot take it: {why}; drop --repair")


def check(loaded: Loaded) -> None:
    """Refuse, in one line, a model REPAIR cannot fold into."""
    why = refusal(loaded)
    if why is not None:
        raise RotvizError(why)


def endpoint_stats(loaded: Loaded, state_a: Mapping[str, Tensor],
                   state_b: Mapping[str, Tensor], train: Split, device="cpu",
                   batch_size: int = 256, evaluator=None) -> tuple[UnitStats, UnitStats]:
    """The FFN and head statistics of both endpoints on the train split (measured once for
    every alpha of a path)."""
    kinds = ("ffn", "heads")
    return tuple(activation_stats(loaded, s, train, device, batch_size, kinds,
                                  evaluator=evaluator) for s in (state_a, state_b))


def _affine(mean: Tensor, std: Tensor, t_mean: Tensor, t_std: Tensor
            ) -> tuple[Tensor, Tensor]:
    """(s, t) with s * y + t having mean t_mean and std t_std where y has mean and std."""
    s = torch.where(std > TINY, t_std / std.clamp_min(TINY), torch.ones_like(std))
    return s, t_mean - s * mean


def repair(loaded: Loaded, state: Mapping[str, Tensor], state_a: Mapping[str, Tensor],
           state_b: Mapping[str, Tensor], alpha: float, train: Split, device="cpu",
           batch_size: int = 256, ends: tuple[UnitStats, UnitStats] | None = None,
           evaluator=None) -> dict[str, Tensor]:
    """repair(loaded, merged_state, anchor_state, matched_state, alpha, train) -> state dict

    `state` (an interpolated or merged model of `loaded`'s class) with each head output's
    and FFN hidden unit's statistics on `train` reset to the interpolation, at `alpha`, of
    those of `state_a` and `state_b` (`ends`: already measured by `endpoint_stats`). A new
    state dict with the same keys, shapes and dtypes; the inputs are not modified."""
    from rotviz.evaluation import Evaluator
    from rotviz.symmetry.view import read_view, write_block

    check(loaded)
    ev = evaluator or Evaluator(loaded, train, device, batch_size)
    sa, sb = ends or endpoint_stats(loaded, state_a, state_b, train, device, batch_size, ev)
    view = read_view(loaded.spec, loaded.config, state)
    out = dict(state)
    dh = view.dims.d_head

    def target(kind: str, i: int) -> tuple[Tensor, Tensor]:
        return ((1 - alpha) * sa.mean[kind][i] + alpha * sb.mean[kind][i],
                (1 - alpha) * sa.std[kind][i] + alpha * sb.std[kind][i])

    for i, prefix in enumerate(view.layout.blocks):
        blk = view.blocks[i]
        now = activation_stats(loaded, out, train, kinds=("heads",), blocks=[i], evaluator=ev)
        s, t = _affine(now.mean["heads"][0], now.std["heads"][0], *target("heads", i))
        a = blk.attn
        s, t = s.reshape(-1, dh), t.reshape(-1, dh)
        attn = replace(a, wv=a.wv * s.unsqueeze(-1).to(a.wv.dtype),
                       bv=(a.bv * s + t).to(a.bv.dtype))
        blk = replace(blk, attn=attn)
        out.update(write_block(view, blk, prefix))
        now = activation_stats(loaded, out, train, kinds=("ffn",), blocks=[i], evaluator=ev)
        s, t = _affine(now.mean["ffn"][0], now.std["ffn"][0], *target("ffn", i))
        f = blk.ffn
        blk = replace(blk, ffn=replace(f, w_in=f.w_in * s.unsqueeze(-1).to(f.w_in.dtype),
                                       b_in=(f.b_in * s + t).to(f.b_in.dtype)))
        out.update(write_block(view, blk, prefix))
    return out


# ---- the barrier and the merge, repaired -------------------------------------------------------


@dataclass
class RepairedCurve(Curve):
    """A barrier curve whose every point was REPAIRed, beside the same path without it."""

    repair: bool = True
    barrier_unrepaired: float = 0.0
    loss_unrepaired: list[float] = field(default_factory=list)
    acc_unrepaired: list[float] = field(default_factory=list)
    repair_split: str = "train"


def repaired_fields(ev, loaded: Loaded, state_a: Mapping[str, Tensor],
                    state_b: Mapping[str, Tensor], alphas, train: Split, repeats: int = 1,
                    seed: int = 0, progress=None, group=None, probe=None,
                    batch_size: int = 256) -> dict | None:
    """`path_curve`'s fields (rotviz.analysis.paths) of the path whose every point is
    REPAIRed on `train` before `ev` evaluates it; the endpoint statistics are measured once."""
    from rotviz.analysis.paths import path_point, path_points
    from rotviz.dist import SINGLE
    from rotviz.evaluation import Evaluator

    check(loaded)
    tev = Evaluator(loaded, train, ev.device, batch_size)
    ends = endpoint_stats(loaded, state_a, state_b, train, evaluator=tev)

    def evaluate(a: float) -> tuple:
        fixed = repair(loaded, path_point(state_a, state_b, a), state_a, state_b, a, train,
                       ends=ends, evaluator=tev)
        params = ev.params(fixed)
        one: list[dict[str, float]] = []
        per = ev.per_sample(params, one)
        return (per, one[0]) if probe is None else (per, one[0], probe(params))

    return path_points(evaluate, alphas, ev.n, ev.split.task, repeats, seed, progress,
                       group or SINGLE)


def repaired_curve(curve: Curve, plain: dict) -> RepairedCurve:
    """The repaired `curve`, with the barrier, loss and accuracy of the same path without
    REPAIR (`plain`: `path_curve`'s fields)."""
    from dataclasses import fields

    base = {f.name: getattr(curve, f.name) for f in fields(Curve)}
    return RepairedCurve(**base, barrier_unrepaired=plain["barrier"],
                         loss_unrepaired=list(plain["loss"]), acc_unrepaired=list(plain["acc"]))


@dataclass
class RepairedMerge(Merged):
    """A merged model REPAIRed at alpha = the merge's weight, beside the merge without it."""

    repair: bool = True
    loss_unrepaired: float = 0.0
    acc_unrepaired: float = 0.0
    repair_split: str = "train"


def repair_merged(r: Merged, anchor: Loaded, matched: Mapping[str, Tensor], split: Split,
                  device="cpu") -> RepairedMerge:
    """The merge `r` of `anchor` and `matched` REPAIRed (alpha = its weight) on the train
    split of `split`'s data, evaluated on `split`."""
    import time
    from dataclasses import fields

    from rotviz.evaluation import Evaluator

    t0 = time.perf_counter()
    train = split.sibling("train")
    fixed = repair(anchor, r.state, anchor.state, matched, r.weight, train, device)
    ev = Evaluator(anchor, split, device)
    loss, acc = ev.evaluate(ev.params(fixed))
    base = {f.name: getattr(r, f.name) for f in fields(Merged)}
    base.update(loss=loss, acc=acc, state=fixed, scores=ev.scores(ev.params(fixed)),
                seconds=r.seconds + time.perf_counter() - t0)
    return RepairedMerge(**base, loss_unrepaired=r.loss, acc_unrepaired=r.acc)

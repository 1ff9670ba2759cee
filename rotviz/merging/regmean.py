"""RegMean (Jin et al., 2023, "Dataless Knowledge Fusion by Merging Weights of Language
Models"): every linear layer's weight solves the regression
min_W sum_i l_i ||X_i W^T - X_i W_i^T||^2, i.e. W^T = (sum l_i G_i)^-1 sum l_i G_i W_i^T with
G_i = X_i^T X_i the Gram matrix of the layer's inputs in model i, for N >= 2 models. Padding
never enters G_i: the hooks drop padded positions (rotviz.data.inputs.without_padding) before the
product, so only real tokens are regressed on. Off-diagonal entries of each
G_i are scaled by `alpha` (1 = the plain regression, 0 = diagonal only). Every other tensor
(biases, norms, embeddings, a weight tied to another) is averaged simply.

It is written as a correction to the simple average, so merging a model with itself gives
it back exactly, however ill-conditioned its Gram matrices are.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rotviz.limits import ALPHA
from rotviz.merging.registry import MergeMethod, register
from rotviz.merging.statistics import STATS_PARAMS, linear_layers, stats_batches
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    from rotviz.data.split import Split
    from rotviz.merging.registry import MergeJob
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

    Tensor = torch.Tensor


def gram_matrices(
    loaded: Loaded,
    state: Mapping[str, Tensor],
    split: Split,
    batches: int = 8,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    progress: Progress | None = None,
) -> dict[str, Tensor]:
    """Per linear layer (by weight name), the mean Gram matrix X^T X / n of its inputs (float64).

    Hooks go on a private copy of the module, never on the loaded (possibly shared) one.
    """
    import torch

    from rotviz.data.inputs import to_device, token_mask, without_padding
    from rotviz.data.reading import check_fits
    from rotviz.devices import resolve_device
    from rotviz.evaluation import Evaluator
    from rotviz.sources.adapters import call
    from rotviz.sources.loading import to_wide

    check_fits(loaded, split)
    dev = resolve_device(device)
    ev = Evaluator(loaded, split.subset(1), dev)
    params = ev.params(state)
    module = copy.deepcopy(loaded.model)
    layers = linear_layers(module)
    sums: dict[str, Tensor] = {}
    counts: dict[str, int] = {}
    handles = []

    real: list[Tensor | None] = [None]  # the batch's real-token mask (None: no padding)

    def hook(name: str):
        def fn(_mod, args):
            x = without_padding(args[0].detach(), real[0])
            x = to_wide(x.reshape(-1, x.shape[-1]))
            sums[name] = sums.get(name, 0) + x.T @ x
            counts[name] = counts.get(name, 0) + x.shape[0]

        return fn

    for name, (mod, _) in layers.items():
        handles.append(mod.register_forward_pre_hook(hook(f"{name}.weight" if name else "weight")))
    todo = list(stats_batches(split, batches, batch_size, seed))
    try:
        with torch.inference_mode():
            for j, (x, _) in enumerate(todo):
                x = to_device(x, dev)
                real[0] = token_mask(x)
                call(loaded.spec, module, {**ev.buffers, **params}, x, strict=True)
                if progress:
                    progress(j + 1, len(todo), "Gram matrices")
    finally:
        for h in handles:
            h.remove()
    return {k: s / counts[k] for k, s in sums.items()}


def reduce_off_diagonal(gram: Tensor, alpha: float) -> Tensor:
    """alpha G + (1 - alpha) diag(G): RegMean's shrinkage of the Gram matrix."""
    import torch

    diag = torch.diag_embed(torch.diagonal(gram, dim1=-2, dim2=-1))
    return alpha * gram + (1.0 - alpha) * diag


def regmean_combine(weights_t: Sequence[Tensor], grams: Sequence[Tensor], weights: Sequence[float],
                    alpha: float = 0.9, in_out: bool = False) -> Tensor:
    """RegMean for one linear layer. `weights_t` are (out, in) weights ((in, out) with `in_out`).

    W^T = (sum l_i G_i)^-1 sum l_i G_i W_i^T, computed as the simple mean plus
    (sum l_i G_i)^-1 sum l_i G_i (W_i - mean)^T in float64, so equal inputs give back the mean.
    """
    import torch

    weights = _normalised(weights)  # the solution is scale-free; the mean needs sum 1
    ws = [(w if in_out else w.T).double() for w in weights_t]  # (in, out)
    gs = [reduce_off_diagonal(g.double().to(ws[0].device), alpha) for g in grams]
    mean = sum(float(lw) * w for lw, w in zip(weights, ws, strict=True))
    total = sum(float(lw) * g for lw, g in zip(weights, gs, strict=True))
    rhs = sum(float(lw) * g @ (w - mean) for lw, g, w in zip(weights, gs, ws, strict=True))
    scale = float(torch.diagonal(total).abs().mean())
    ridge = 1e-12 * (scale if scale > 0 else 1.0)
    eye = torch.eye(total.shape[0], dtype=total.dtype, device=total.device)
    out = mean + torch.linalg.solve(total + ridge * eye, rhs)
    return (out if in_out else out.T).to(weights_t[0].dtype)



def _normalised(weights: Sequence[float]) -> list[float]:
    total = sum(float(w) for w in weights)
    return [float(w) / total for w in weights]


def _statistics(loaded: Loaded, state: Mapping[str, Tensor], split: Split, device,
                seed: int = 0, progress: Progress | None = None, batches: int = 8,
                batch_size: int = 32, **_) -> dict[str, Tensor]:
    return gram_matrices(loaded, state, split, batches, batch_size, device, seed, progress)


def _prepare(loaded: Loaded) -> dict[str, bool]:
    """Weight name -> whether it is stored (in, out) (GPT-2's Conv1D), for RegMean's layers."""
    layers = linear_layers(loaded.model)
    return {f"{n}.weight" if n else "weight": c for n, (_, c) in layers.items()}


def _combine(job: MergeJob, name: str, tensors: Sequence[Tensor],
             base: Tensor | None) -> Tensor | None:
    if name not in job.prepared or any(name not in st for st in job.stats):
        return None
    return regmean_combine(tensors, [st[name] for st in job.stats], job.weights,
                           job.params["alpha"], in_out=job.prepared[name])


REGMEAN = register(MergeMethod(
    "regmean", "RegMean",
    "each linear layer solves a regression on every model's inputs, padding never counted "
    "(Jin et al., 2023)",
    _combine,
    params=(*STATS_PARAMS,
            Param("alpha", 0.9, "scale of off-diagonal Gram entries in [0, 1] (default 0.9)",
                  ALPHA, label="RegMean: off-diagonal scale α", widget=(0.0, 1.0, 0.05))),
    statistics=_statistics, prepare=_prepare, order=30))

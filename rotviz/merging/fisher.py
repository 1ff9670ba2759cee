"""Fisher merging (Matena & Raffel, 2022, "Merging Models with Fisher-Weighted Averaging"):
per parameter, theta = sum_i l_i F_i theta_i / sum_i l_i F_i over N >= 2 models, with F_i the
diagonal empirical Fisher of model i (the mean over samples of the squared gradient of the
log-likelihood of the true label) and l the models' weights ((1 - w, w) for a pair).

Two variants (`fisher_norm`): `none` (default) is Matena & Raffel's, each model's Fisher as
measured; `model` divides each model's Fisher by its L2 norm over all of that model's
parameters first (FusionBench's `normalize_fisher_weight`), so a model whose gradients are
larger overall does not outweigh the others everywhere.

It is written as a correction to the simple average, so merging a model with itself gives
it back exactly; `FISHER_FLOOR` is added to every Fisher value so that parameters no sample
moves fall back to the simple average.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import MergeMethod, register
from rotviz.merging.statistics import STATS_PARAMS, stats_batches, unpadded
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    from rotviz.data.split import Split
    from rotviz.merging.registry import MergeJob
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

    Tensor = torch.Tensor
FISHER_FLOOR = 1e-6  # added to every Fisher value: parameters no sample moves average simply
FISHER_NORMS = ("none", "model")  # each model's Fisher as measured, or divided by its norm


def fisher_diag(
    loaded: Loaded,
    state: Mapping[str, Tensor],
    split: Split,
    batches: int = 8,
    batch_size: int = 32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    progress: Progress | None = None,
) -> dict[str, Tensor]:
    """Diagonal empirical Fisher of the parameter set `state` (on `loaded`'s module), per tensor.

    F = mean over samples of (d log p(y | x) / d theta)^2, with per-sample gradients from
    torch.func (vmap of grad). For text, a sample is a sequence and log p sums over its tokens.
    """
    import torch
    import torch.nn.functional as F
    from torch.func import grad, vmap

    from rotviz.data.inputs import Inputs, map_inputs, to_device
    from rotviz.data.reading import check_fits
    from rotviz.data.tasks import sample_losses
    from rotviz.devices import resolve_device, wide_device
    from rotviz.evaluation import IGNORE, Evaluator
    from rotviz.sources.adapters import call
    from rotviz.sources.loading import to_wide

    check_fits(loaded, split)
    dev = resolve_device(device)
    ev = Evaluator(loaded, split.subset(1), dev)  # names and buffers of the module
    params = ev.params(state)
    trainable = [n for n, _ in loaded.model.named_parameters()]
    frozen = ev.buffers | {k: v for k, v in params.items() if k not in trainable}
    n_params = sum(params[n].numel() for n in trainable)
    chunk = max(1, int(2.5e8 // max(n_params, 1)))  # ~1 GB of per-sample gradients at a time

    task = split.task

    def log_lik(p: dict[str, Tensor], x: Inputs, y: Tensor) -> Tensor:  # noqa: F821
        one = map_inputs(x, lambda t: t.unsqueeze(0))
        logits = call(loaded.spec, loaded.model, {**frozen, **p}, one, strict=True).float()
        if task in ("multi-label", "regression"):  # the head's own likelihood
            return -sample_losses(task, logits, y.unsqueeze(0), lambda t: t)[0].sum()
        y = y.reshape(-1)
        return -F.cross_entropy(logits.reshape(y.numel(), -1), y, reduction="sum",
                                ignore_index=IGNORE)

    per_sample = vmap(grad(log_lik), in_dims=(None, 0, 0), chunk_size=chunk)
    # transformers builds attention masks with data-dependent steps that vmap cannot batch;
    # an example cut to its own tokens needs no mask, and gives the same gradient
    one = grad(log_lik)
    p = {n: params[n] for n in trainable}
    out = {n: torch.zeros_like(t, dtype=torch.float64, device=wide_device(dev))
           for n, t in params.items()}
    count = 0
    batched = True  # per-sample gradients by vmap, until a model shows it cannot be batched
    todo = list(stats_batches(split, batches, batch_size, seed))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*batching rule.*")
        for j, (x, y) in enumerate(todo):
            x, y = to_device(x, dev), y.to(dev)
            if isinstance(x, dict):  # padded text: one example at a time, cut to its tokens
                for xi, yi in unpadded(x, y):
                    gi = one(p, xi, yi)
                    for n in trainable:
                        out[n] += to_wide(gi[n]) ** 2
            else:
                if batched:
                    try:
                        g = per_sample(p, x, y)
                    except RuntimeError as e:  # a model vmap cannot batch (DeBERTa's
                        if "vmap" not in str(e):  # relative positions): one at a time
                            raise
                        batched = False
                if batched:
                    for n in trainable:
                        out[n] += (to_wide(g[n]) ** 2).sum(0)
                else:
                    for xi, yi in zip(x, y, strict=True):
                        gi = one(p, xi, yi)
                        for n in trainable:
                            out[n] += to_wide(gi[n]) ** 2
            count += len(y)
            if progress:
                progress(j + 1, len(todo), "Fisher information")
    return {n: (t / count).to(params[n].dtype) for n, t in out.items()}


def fisher_combine(tensors: Sequence[Tensor], fishers: Sequence[Tensor], weights: Sequence[float],
                   floor: float = FISHER_FLOOR) -> Tensor:
    """sum l_i (F_i + floor) theta_i / sum l_i (F_i + floor), as a correction to the mean."""
    total = sum(float(w) for w in weights)
    weights = [float(w) / total for w in weights]  # scale-free; the mean needs sum 1
    mean = sum(float(w) * t.double() for w, t in zip(weights, tensors, strict=True))
    num = sum(float(w) * (f.double() + floor) * (t.double() - mean)
              for w, f, t in zip(weights, fishers, tensors, strict=True))
    den = sum(float(w) * (f.double() + floor) for w, f in zip(weights, fishers, strict=True))
    return (mean + num / den).to(tensors[0].dtype)




def model_normalised(fisher: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A model's Fisher divided by its L2 norm over all its parameters (FusionBench's
    normalisation); an all-zero Fisher is returned as it is."""
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in fisher.values()))
    if norm == 0.0:
        return dict(fisher)
    return {k: (t.double() / norm).to(t.dtype) for k, t in fisher.items()}


def _statistics(loaded: Loaded, state: Mapping[str, Tensor], split: Split, device,
                seed: int = 0, progress: Progress | None = None, batches: int = 8,
                batch_size: int = 32, fisher_norm: str = "none", **_) -> dict[str, Tensor]:
    fisher = fisher_diag(loaded, state, split, batches, batch_size, device, seed, progress)
    return model_normalised(fisher) if fisher_norm == "model" else fisher


def _combine(job: MergeJob, name: str, tensors: Sequence[Tensor],
             base: Tensor | None) -> Tensor | None:
    if any(name not in st for st in job.stats):
        return None
    fishers = [st[name].to(tensors[0].device) for st in job.stats]
    return fisher_combine(tensors, fishers, job.weights)


FISHER = register(MergeMethod(
    "fisher", "Fisher",
    "each parameter weighted by the diagonal Fisher of each model (Matena & Raffel, 2022)",
    _combine,
    params=(*STATS_PARAMS,
            Param("fisher_norm", "none",
                  "none: each model's Fisher as measured (Matena & Raffel: the per-sample "
                  "mean of squared gradients); model: each divided by its norm over the whole "
                  "model first (FusionBench) (default none)",
                  choices=FISHER_NORMS, label="Fisher: per-model normalisation")),
    statistics=_statistics, extra=("fisher_norm",), order=20))

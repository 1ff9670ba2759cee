"""Model fusion with and without matching: simple, Fisher and RegMean averaging.

- simple: theta = (1 - w) theta_anchor + w theta_source.
- fisher (Matena & Raffel, 2022): per parameter, theta = sum_i l_i F_i theta_i / sum_i l_i F_i
  with F_i the diagonal empirical Fisher (mean over samples of the squared gradient of the
  log-likelihood of the true label) over N batches, l = (1 - w, w).
- regmean (Jin et al., 2023): every linear layer's weight solves the regression
  min_W sum_i l_i ||X_i W^T - X_i W_i^T||^2, i.e. W^T = (sum l_i G_i)^-1 sum l_i G_i W_i^T with
  G_i = X_i^T X_i the Gram matrix of the layer's inputs in model i; off-diagonal entries of
  each G_i are scaled by `alpha` (1 = the plain regression, 0 = diagonal only). Every other
  tensor (biases, norms, embeddings) is averaged simply.

Statistics (Fisher, Gram matrices) are always computed on the models as matched: the source's
Fisher and Gram matrices live in the basis of its own neurons and heads, so statistics taken
before matching are in the wrong basis afterwards (a bug in public code).

Both weighted means are written as a correction to the simple average, so merging a model
with itself returns it exactly, however ill-conditioned its statistics are.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rotviz.analysis.landscape import as_options, layers_of, matched_state
from rotviz.data import Inputs, Split, map_inputs, to_device, token_mask, without_padding
from rotviz.devices import resolve_device, wide_device
from rotviz.errors import RotvizError
from rotviz.evaluation import IGNORE, Evaluator, check_fits
from rotviz.match.options import MatchOptions
from rotviz.match.selection import label_of, parse_selection
from rotviz.models import Loaded, to_wide
from rotviz.sources import call
from rotviz.tasks import sample_losses
from rotviz.types import Progress

Tensor = torch.Tensor
METHODS = ("simple", "fisher", "regmean")
FISHER_FLOOR = 1e-6  # added to every Fisher value: parameters no sample moves average simply


def check_method(method: str) -> str:
    m = str(method).strip().lower()
    if m not in METHODS:
        raise RotvizError(f"unknown merge method '{method}': use one of {', '.join(METHODS)}")
    return m


def check_weight(weight: float) -> float:
    if not 0.0 <= float(weight) <= 1.0:
        raise RotvizError(f"merge weight must be in [0, 1] (0 = anchor, 1 = source), got {weight}")
    return float(weight)


def stats_batches(split: Split, batches: int, batch_size: int, seed: int = 0):
    """`batches` seeded batches of `batch_size` samples (fewer if the split is small)."""
    if split.n == 0:
        raise RotvizError(f"the {split.split} split of '{split.data}' is empty; use another split")
    if batches < 1 or batch_size < 1:
        raise RotvizError(
            f"--batches and --batch-size must be >= 1, got {batches} and {batch_size}"
        )
    order = np.random.default_rng(seed).permutation(split.n)[: batches * batch_size]
    order = torch.as_tensor(order)
    for i in range(0, len(order), batch_size):
        ix = order[i : i + batch_size]
        yield split.inputs_at(ix), split.labels[ix]


# ---- statistics -----------------------------------------------------------------------------


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
    from torch.func import grad, vmap

    check_fits(loaded, split)
    dev = resolve_device(device)
    ev = Evaluator(loaded, split.subset(1), dev)  # names and buffers of the module
    params = ev.params(state)
    trainable = [n for n, _ in loaded.model.named_parameters()]
    frozen = ev.buffers | {k: v for k, v in params.items() if k not in trainable}
    n_params = sum(params[n].numel() for n in trainable)
    chunk = max(1, int(2.5e8 // max(n_params, 1)))  # ~1 GB of per-sample gradients at a time

    task = split.task

    def log_lik(p: dict[str, Tensor], x: Inputs, y: Tensor) -> Tensor:
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


def unpadded(x: dict[str, Tensor], y: Tensor):
    """Each example of a padded text batch, cut to its real tokens (labels too, when they
    are per token)."""
    lengths = x["attention_mask"].sum(1).tolist() if "attention_mask" in x else None
    for i in range(len(y)):
        n = int(lengths[i]) if lengths is not None else None
        xi = {k: v[i, :n] for k, v in x.items()}
        yi = y[i, :n] if y.dim() == 2 and y.dtype == torch.long else y[i]
        yield xi, yi


def linear_layers(module: nn.Module) -> dict[str, tuple[nn.Module, bool]]:
    """Linear layers whose weight RegMean may solve for: name -> (module, weight is (in, out)).

    A weight shared with another parameter (tied embeddings) is left to the simple average.
    """
    owners: dict[int, int] = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        owners[id(p)] = owners.get(id(p), 0) + 1
    out = {}
    for name, mod in module.named_modules():
        conv1d = type(mod).__name__ == "Conv1D" and hasattr(mod, "nf")  # GPT-2: y = x W + b
        if (isinstance(mod, nn.Linear) or conv1d) and owners.get(id(mod.weight), 0) == 1:
            out[name] = (mod, conv1d)
    return out


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


# ---- combining -------------------------------------------------------------------------------


def simple_average(tensors: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    out = sum(float(w) * t.double() for w, t in zip(weights, tensors, strict=True))
    return out.to(tensors[0].dtype)


def fisher_combine(tensors: Sequence[Tensor], fishers: Sequence[Tensor], weights: Sequence[float],
                   floor: float = FISHER_FLOOR) -> Tensor:
    """sum l_i (F_i + floor) theta_i / sum l_i (F_i + floor), as a correction to the mean."""
    mean = sum(float(w) * t.double() for w, t in zip(weights, tensors, strict=True))
    num = sum(float(w) * (f.double() + floor) * (t.double() - mean)
              for w, f, t in zip(weights, fishers, tensors, strict=True))
    den = sum(float(w) * (f.double() + floor) for w, f in zip(weights, fishers, strict=True))
    return (mean + num / den).to(tensors[0].dtype)


def reduce_off_diagonal(gram: Tensor, alpha: float) -> Tensor:
    """alpha G + (1 - alpha) diag(G): RegMean's shrinkage of the Gram matrix."""
    diag = torch.diag_embed(torch.diagonal(gram, dim1=-2, dim2=-1))
    return alpha * gram + (1.0 - alpha) * diag


def regmean_combine(weights_t: Sequence[Tensor], grams: Sequence[Tensor], weights: Sequence[float],
                    alpha: float = 0.9, in_out: bool = False) -> Tensor:
    """RegMean for one linear layer. `weights_t` are (out, in) weights ((in, out) with `in_out`).

    W^T = (sum l_i G_i)^-1 sum l_i G_i W_i^T, computed as the simple mean plus
    (sum l_i G_i)^-1 sum l_i G_i (W_i - mean)^T in float64, so equal inputs give back the mean.
    """
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


# ---- merging -----------------------------------------------------------------------------------


@dataclass
class Merged:
    """A merged model: its accuracy on the evaluation split, and how it was made."""

    method: str
    match: str
    weight: float  # of the source; 0 = anchor, 1 = source
    loss: float
    acc: float
    anchor_loss: float
    anchor_acc: float
    source_loss: float
    source_acc: float
    data: str
    split: str  # evaluation split
    stats_split: str | None  # split the Fisher / Gram statistics came from (None: simple)
    batches: int
    batch_size: int
    alpha: float | None  # RegMean off-diagonal scale
    device: str
    n: int
    seconds: float
    match_seconds: float
    stats_seconds: float
    distance_before: float
    distance_after: float
    anchor: str = ""
    source: str = ""
    layers: list[int] | None = None  # layers matched (None: all)
    # the task's further metrics (rotviz.tasks: macro-F1, entity F1, ...; none for LMs)
    scores: dict[str, float] = field(default_factory=dict)
    anchor_scores: dict[str, float] = field(default_factory=dict)
    source_scores: dict[str, float] = field(default_factory=dict)
    state: dict[str, Tensor] = field(default_factory=dict, repr=False)
    anchor_stats: dict[str, Tensor] | None = field(default=None, repr=False)
    source_stats: dict[str, Tensor] | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        skip = {"state", "anchor_stats", "source_stats"}
        return {k: v for k, v in asdict(self).items() if k not in skip}


def statistics(method: str, loaded: Loaded, state: Mapping[str, Tensor], split: Split,
               batches: int, batch_size: int, device, seed: int = 0,
               progress: Progress | None = None) -> dict[str, Tensor] | None:
    """The statistics a method needs, computed on the parameter set `state` (None for simple)."""
    if method == "fisher":
        return fisher_diag(loaded, state, split, batches, batch_size, device, seed, progress)
    if method == "regmean":
        return gram_matrices(loaded, state, split, batches, batch_size, device, seed, progress)
    return None


def merge_states(loaded: Loaded, method: str, anchor_state: Mapping[str, Tensor],
                 source_state: Mapping[str, Tensor], weight: float = 0.5,
                 anchor_stats: Mapping[str, Tensor] | None = None,
                 source_stats: Mapping[str, Tensor] | None = None,
                 alpha: float = 0.9) -> dict[str, Tensor]:
    """Merge two parameter sets of `loaded`'s architecture; returns a new full state dict."""
    method = check_method(method)
    if method != "simple" and (anchor_stats is None or source_stats is None):
        raise RotvizError(f"{method} merging needs statistics of both models")
    lw = (1.0 - weight, weight)
    layers = linear_layers(loaded.model) if method == "regmean" else {}
    conv1d = {f"{n}.weight" if n else "weight": c for n, (_, c) in layers.items()}
    out: dict[str, Tensor] = {}
    for k, a in anchor_state.items():
        b = source_state[k]
        if not a.is_floating_point():
            out[k] = a.clone()
        elif method == "fisher" and k in anchor_stats:
            fishers = [anchor_stats[k].to(a.device), source_stats[k].to(a.device)]
            out[k] = fisher_combine([a, b], fishers, lw)
        elif method == "regmean" and k in conv1d and k in anchor_stats:
            out[k] = regmean_combine([a, b], [anchor_stats[k], source_stats[k]], lw, alpha,
                                     in_out=conv1d[k])
        else:
            out[k] = simple_average([a, b], lw)
    _retie(loaded, out)
    return out


def _retie(loaded: Loaded, state: dict[str, Tensor]) -> None:
    """Tied aliases (lm_head = wte) get the owner's merged tensor, so they stay one tensor."""
    by_id: dict[int, str] = {}
    for name, p in loaded.model.named_parameters(remove_duplicate=False):
        if id(p) in by_id:
            if name in state and by_id[id(p)] in state:
                state[name] = state[by_id[id(p)]]
        else:
            by_id[id(p)] = name


def merge(
    anchor: Loaded,
    source: Loaded,
    method: str,
    options: MatchOptions | str | None,
    split: Split,
    stats_split: Split | None = None,
    weight: float = 0.5,
    batches: int = 8,
    batch_size: int = 32,
    alpha: float = 0.9,
    device: str | torch.device = "cpu",
    seed: int = 0,
    progress: Progress | None = None,
    source_state: Mapping[str, Tensor] | None = None,
) -> Merged:
    """merge(anchor, source, method, options, split, stats_split=None, weight=0.5, ...) -> Merged

    Match the source onto the anchor with `options` (MatchOptions, SPEC or None), then merge
    with `method` (simple, fisher, regmean); statistics come from `stats_split` (default: the
    train split of the same data), `batches` x `batch_size` samples, computed on the matched
    source. The merged model is evaluated on `split`; `Merged.state` holds its weights.
    """
    method = check_method(method)
    weight = check_weight(weight)
    if not 0.0 <= alpha <= 1.0:
        raise RotvizError(f"RegMean alpha must be in [0, 1], got {alpha}")
    t0 = time.perf_counter()
    options = as_options(options)
    ev = Evaluator(anchor, split, device)
    if source_state is None:
        source_state, info = matched_state(anchor, source, options, ev.device, data=split)
        match_s, d0, d1 = info.seconds, info.distance_before, info.distance_after
    else:
        match_s, d0, d1 = 0.0, 0.0, 0.0
    t1 = time.perf_counter()
    st_split = None
    sa = sb = None
    if method != "simple":
        st_split = stats_split if stats_split is not None else default_stats_split(split)
        sa = statistics(method, anchor, anchor.state, st_split, batches, batch_size, ev.device,
                        seed, _stage(progress, "anchor"))
        sb = statistics(method, anchor, source_state, st_split, batches, batch_size, ev.device,
                        seed, _stage(progress, "source"))
    stats_s = time.perf_counter() - t1
    merged = merge_states(anchor, method, anchor.state, source_state, weight, sa, sb, alpha)
    loss, acc = ev.evaluate(ev.params(merged))
    a_loss, a_acc = ev.evaluate(ev.params(anchor.state))
    s_loss, s_acc = ev.evaluate(ev.params(source_state))
    return Merged(
        method=method, match=label_of(options), weight=weight, loss=loss, acc=acc,
        anchor_loss=a_loss, anchor_acc=a_acc, source_loss=s_loss, source_acc=s_acc,
        data=split.data, split=split.split,
        stats_split=None if st_split is None else st_split.split,
        batches=batches, batch_size=batch_size, alpha=alpha if method == "regmean" else None,
        device=str(ev.device), n=split.n, seconds=time.perf_counter() - t0, match_seconds=match_s,
        stats_seconds=stats_s, distance_before=d0, distance_after=d1, anchor=anchor.ref,
        source=source.ref, layers=layers_of(options), state=merged, anchor_stats=sa,
        source_stats=sb, scores=ev.scores(ev.params(merged)),
        anchor_scores=ev.scores(ev.params(anchor.state)),
        source_scores=ev.scores(ev.params(source_state)),
    )


def default_stats_split(split: Split) -> Split:
    """The train split of the evaluation data (statistics never come from the test split)."""
    return split.sibling("train")


def _stage(progress: Progress | None, what: str) -> Progress | None:
    if progress is None:
        return None
    return lambda d, t, m: progress(d, t, f"{m} of the {what}")


# ---- the paper's Tables 1-2 -------------------------------------------------------------------


@dataclass
class FusionTable:
    """Merged accuracy: one row per method, one column per matching SPEC (Tables 1-2 shape)."""

    methods: list[str]
    specs: list[str]
    acc: dict[str, dict[str, float]]  # method -> spec -> accuracy of the merged model
    loss: dict[str, dict[str, float]]
    anchor_acc: float
    source_acc: float
    anchor_loss: float
    source_loss: float
    distance: dict[str, float]  # spec -> distance of the (matched) source to the anchor
    weight: float
    alpha: float
    batches: int
    batch_size: int
    data: str
    split: str
    stats_split: str
    device: str
    seconds: float
    timing: dict[str, float]  # "match:SPEC", "stats:METHOD", "merge:METHOD" -> seconds
    # method -> spec -> the task's further metrics of the merged model (macro-F1, ...)
    scores: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    anchor_scores: dict[str, float] = field(default_factory=dict)
    source_scores: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_markdown(self) -> str:
        head = "| method | " + " | ".join(f"match {s}" for s in self.specs) + " |"
        rule = "|---|" + "---|" * len(self.specs)
        rows = [f"| {m} | " + " | ".join(f"{self.acc[m][s]:.4f}" for s in self.specs) + " |"
                for m in self.methods]
        return "\n".join([head, rule, *rows])


def fusion_table(
    anchor: Loaded,
    source: Loaded,
    split: Split,
    stats_split: Split | None = None,
    methods: Sequence[str] = METHODS,
    specs: Sequence[str | MatchOptions | None] = ("none", "seed"),
    weight: float = 0.5,
    batches: int = 8,
    batch_size: int = 32,
    alpha: float = 0.9,
    device: str | torch.device = "cpu",
    seed: int = 0,
    progress: Progress | None = None,
) -> FusionTable:
    """fusion_table(anchor, source, split, stats_split=None, methods=, specs=) -> FusionTable

    Every method with every matching SPEC. Each SPEC matches once; each model's statistics are
    computed once per (method, SPEC), on the matched source.
    """
    t0 = time.perf_counter()
    methods = [check_method(m) for m in methods]
    weight = check_weight(weight)
    labels = [label_of(as_options(s)) if isinstance(s, MatchOptions) or s is None
              else parse_selection(s).label for s in specs]
    ev = Evaluator(anchor, split, device)
    st_split = stats_split if stats_split is not None else (
        default_stats_split(split) if any(m != "simple" for m in methods) else split)
    total = len(specs) * (1 + len(methods))
    step = 0
    timing: dict[str, float] = {}
    scored: dict[str, dict[str, dict[str, float]]] = {}
    acc: dict[str, dict[str, float]] = {m: {} for m in methods}
    loss: dict[str, dict[str, float]] = {m: {} for m in methods}
    distance: dict[str, float] = {}
    anchor_stats: dict[str, dict | None] = {}

    def tick(msg: str) -> None:
        nonlocal step
        step += 1
        if progress:
            progress(step, total, msg)

    for spec, label in zip(specs, labels, strict=True):
        t = time.perf_counter()
        state, info = matched_state(anchor, source, as_options(spec), ev.device, data=split)
        timing[f"match:{label}"] = time.perf_counter() - t
        distance[label] = info.distance_after
        tick(f"matched [{label}]")
        for m in methods:
            t = time.perf_counter()
            if m not in anchor_stats:
                anchor_stats[m] = statistics(m, anchor, anchor.state, st_split, batches, batch_size,
                                             ev.device, seed)
            sb = statistics(m, anchor, state, st_split, batches, batch_size, ev.device, seed)
            timing[f"stats:{m}"] = timing.get(f"stats:{m}", 0.0) + time.perf_counter() - t
            t = time.perf_counter()
            merged = merge_states(anchor, m, anchor.state, state, weight, anchor_stats[m], sb,
                                  alpha)
            timing[f"merge:{m}"] = timing.get(f"merge:{m}", 0.0) + time.perf_counter() - t
            loss[m][label], acc[m][label] = ev.evaluate(ev.params(merged))
            scored.setdefault(m, {})[label] = ev.scores(ev.params(merged))
            tick(f"{m} merge [{label}]")
    a_loss, a_acc = ev.evaluate(ev.params(anchor.state))
    s_loss, s_acc = ev.evaluate(ev.params(source.state))
    return FusionTable(
        methods=methods, specs=labels, acc=acc, loss=loss, anchor_acc=a_acc, source_acc=s_acc,
        anchor_loss=a_loss, source_loss=s_loss, distance=distance, weight=weight, alpha=alpha,
        batches=batches, batch_size=batch_size, data=split.data, split=split.split,
        stats_split=st_split.split, device=str(ev.device), seconds=time.perf_counter() - t0,
        timing=timing, scores=scored, anchor_scores=ev.scores(ev.params(anchor.state)),
        source_scores=ev.scores(ev.params(source.state)),
    )

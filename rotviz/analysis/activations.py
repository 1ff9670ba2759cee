"""Per-unit activation statistics of any parameter set of a loaded model on a split: the
shared machinery of variance collapse (rotviz.measures.collapse) and REPAIR
(rotviz.analysis.repair).

For each block, three kinds of units (`KINDS`):
- `residual`: the residual stream after the block (the block module's output);
- `ffn`: the FFN hidden units before the activation (the FFN-in projection's output; in a
  gated FFN the "up" map's);
- `heads`: each head's output, the input of the attention output projection (heads side by
  side, head h holding units h * d_h .. (h + 1) * d_h - 1).

The modules are found from the family's ArchSpec (rotviz.symmetry.view.resolve_layout: block
prefixes and role names), never by family name. Hooks are registered on a structural copy
of the model's module (rotviz.sources.running.module_copy), so the caller's model is never
touched. Every non-padding token of every example counts once; sums and sums of squares are
accumulated in float64 over batches, so the statistics equal those of the whole split in one
batch (to float64 rounding).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from rotviz.analysis.representations import block_output
from rotviz.data.inputs import token_mask, without_padding
from rotviz.data.split import Split
from rotviz.sources.loading import Loaded

Tensor = torch.Tensor
KINDS = ("residual", "ffn", "heads")


@dataclass
class UnitStats:
    """Mean and standard deviation (population, over tokens) of each unit: `mean[kind][i]`
    and `std[kind][i]` are float64 vectors of block i's units; `n` tokens counted."""

    mean: dict[str, list[Tensor]]
    std: dict[str, list[Tensor]]
    n: int

    def summary(self) -> dict[str, list[float]]:
        """The average standard deviation over each block's units, per kind (for JSON)."""
        return {k: [float(s.mean()) for s in v] for k, v in self.std.items()}


def module_names(loaded: Loaded, state: Mapping[str, Tensor] | None = None
                 ) -> dict[str, list[str]]:
    """Per kind, the module of each block whose output (`residual`, `ffn`) or input (`heads`)
    holds the units, as full module names of `loaded`'s model."""
    from rotviz.symmetry.view import resolve_layout

    lay = resolve_layout(loaded.spec, state if state is not None else loaded.state)
    return {"residual": [b.rstrip(".") for b in lay.blocks],
            "ffn": [b + lay.roles["ffn_in"] for b in lay.blocks],
            "heads": [b + lay.roles["o"] for b in lay.blocks]}


class _Sums:
    """Float64 count, sum and sum of squares of one site's units."""

    def __init__(self) -> None:
        self.n = 0
        self.s: Tensor | None = None
        self.q: Tensor | None = None

    def add(self, h: Tensor, mask: Tensor | None) -> None:
        rows = without_padding(h, mask).reshape(-1, h.shape[-1]).double()
        s, q = rows.sum(0), (rows * rows).sum(0)
        self.n += rows.shape[0]
        self.s = s if self.s is None else self.s + s
        self.q = q if self.q is None else self.q + q

    def stats(self) -> tuple[Tensor, Tensor]:
        mean = (self.s / self.n).cpu()
        var = (self.q / self.n).cpu() - mean * mean
        return mean, var.clamp_min(0.0).sqrt()


class _Stop(Exception):
    """Raised by the last hook of a pass: the layers after it are not needed."""


def activation_stats(loaded: Loaded, state: Mapping[str, Tensor], split: Split,
                     device: str | torch.device = "cpu", batch_size: int = 256,
                     kinds: Iterable[str] = KINDS, blocks: Iterable[int] | None = None,
                     evaluator=None, at_size: bool = False) -> UnitStats:
    """activation_stats(loaded, state, split, device=) -> UnitStats

    The per-unit statistics of parameter set `state` (of `loaded`'s architecture) on every
    non-padding token of `split`, for `kinds` of units in `blocks` (default all; each kind's
    lists follow `blocks`' order). A pass stops at the last module it needs, so the
    statistics of early blocks cost a part of a forward pass. `evaluator`
    (rotviz.evaluation.Evaluator on this split) reuses batches already on the device.

    `at_size`: the evaluator's module runs block by block under a runner that gives each
    block its weights as it starts (rotviz.atsize.blocks; `state` names the tensors, its
    values unused): the hooks then go on that module itself, no parameters are passed, and
    every pass runs to its end (the runner releases each block as it finishes)."""
    from rotviz.evaluation import Evaluator
    from rotviz.sources.adapters import call
    from rotviz.sources.running import module_copy

    ev = evaluator or Evaluator(loaded, split, device, batch_size)
    names = module_names(loaded, state)
    kinds = tuple(kinds)
    n_blocks = len(names["residual"])
    wanted = list(range(n_blocks)) if blocks is None else list(blocks)
    # hooks on a copy: the caller's module stays as it was (at size: the runner's own module)
    module = ev.module if at_size else module_copy(ev.module)
    sums = {(k, i): _Sums() for k in kinds for i in wanted}
    current: dict = {"mask": None, "hit": set()}

    def take(key, h: Tensor) -> None:
        sums[key].add(h.detach(), current["mask"])
        current["hit"].add(key)
        if len(current["hit"]) == len(sums) and not at_size:  # the rest of the pass is moot
            raise _Stop

    def out_hook(key):
        return lambda mod, args, out: take(key, block_output(out))

    def in_hook(key):
        return lambda mod, args: take(key, args[0])

    handles = []
    for k, i in sums:
        sub = module.get_submodule(names[k][i])
        handles.append(sub.register_forward_pre_hook(in_hook((k, i))) if k == "heads"
                       else sub.register_forward_hook(out_hook((k, i))))
    params = {} if at_size else ev.params(state)
    try:
        with torch.inference_mode():
            for x, _ in ev.batches:
                current["mask"], current["hit"] = token_mask(x), set()
                try:
                    call(loaded.spec, module, {**ev.buffers, **params}, x)
                except _Stop:
                    pass
    finally:
        for h in handles:
            h.remove()
    mean: dict[str, list[Tensor]] = {k: [] for k in kinds}
    std: dict[str, list[Tensor]] = {k: [] for k in kinds}
    for k, i in sums:
        m, s = sums[(k, i)].stats()
        mean[k].append(m)
        std[k].append(s)
    n = next(iter(sums.values())).n if sums else 0
    return UnitStats(mean, std, n)


def std_ratio(std: Tensor, std_a: Tensor, std_b: Tensor, alpha: float) -> float:
    """The average over units of std / ((1 - alpha) std_a + alpha std_b): variance collapse
    (Jordan et al. 2023) below 1. Units whose interpolated endpoint std is 0 are left out
    (nan when all are)."""
    target = (1.0 - alpha) * std_a + alpha * std_b
    keep = target > 0
    if not bool(keep.any()):
        return float("nan")
    return float((std[keep] / target[keep]).mean())

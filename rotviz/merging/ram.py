"""RAM, Reinforced Agent Merging (arXiv 2601.13572), as mergekit 0.1.5 defines its `ram`:
with the base w0 and N >= 2 fine-tunes w_i, the task vectors d_i = w_i - w0 are compared
entry by entry; an entry of d_i counts when |d_i| > epsilon (`ram_epsilon`, mergekit's
`epsilon`, default 1e-5). Where exactly one model's entry counts, it is kept whole (no
averaging dilutes a skill only one model has); where several count, their mean is taken
over those that count; where none counts, the base is kept:

    theta = w0 + sum_i [c_i] d_i / max(1, sum_j [c_j]),   c_i = |d_i| > epsilon.

mergekit takes no weights here (a model's entry counts or not), so rotviz's --weight does
not change it either. It needs the base; it is elementwise and runs at size. mergekit's
`ramplus_tl` (RAM+, the unique entries rescaled tensor by tensor) is rotviz.merging.ramplus_tl.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rotviz.limits import RAM_EPSILON
from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor

EPSILON = Param("ram_epsilon", 1e-5, "RAM: a task vector entry counts when its magnitude is "
                "above this (mergekit's epsilon; default 1e-5)", RAM_EPSILON,
                label="RAM: epsilon (an entry counts above it)", widget=(0.0, 0.01, 1e-5))


def ram_slice(models: Sequence[Tensor], base: Tensor, epsilon: float = 1e-5) -> Tensor:
    """RAM of one slice, in float64: the entries only one model changes kept whole, those
    several change averaged over the ones that change them."""
    import torch

    deltas = [m - base for m in models]
    counts = [d.abs() > epsilon for d in deltas]
    n = torch.stack(counts).sum(0).clamp(min=1).double()
    zero = torch.zeros((), dtype=base.dtype, device=base.device)
    total = sum(torch.where(c, d, zero) for c, d in zip(counts, deltas, strict=True))
    return base + total / n


def ram_rows(src: RowSource, epsilon: float = 1e-5) -> Iterator[Tensor]:
    """RAM of one tensor, slice by slice in float64 (elementwise: one pass)."""
    for models, base in src.slices():
        yield ram_slice(models, base, epsilon)


def ram(tensors: Sequence[Tensor], base: Tensor, epsilon: float = 1e-5) -> Tensor:
    """RAM of one tensor, in float64, cast to the base's dtype."""
    return whole(lambda src: ram_rows(src, epsilon), tensors, base)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    return ram_rows(src, job.params["ram_epsilon"])


RAM = register(MergeMethod(
    "ram", "RAM",
    "task vector entries only one model changes kept whole, shared ones averaged over the "
    "models that change them (Reinforced Agent Merging, 2026)",
    rows=_rows, params=(EPSILON,), needs_base=True, extra=("ram_epsilon",),
    weighted=False,
    mergekit=Mergekit("ram", base="base", weight=None, shared={"ram_epsilon": "epsilon"}),
    order=160))

"""NearSwap (alchemonaut, QuartetAnemoi-70B), as mergekit 0.1.5 defines it: the anchor's
entries are swapped for the source's where the two are near, entry by entry:

    weight = clamp(t / max(|a - b|, 1e-6), 0, 1),    theta = weight b + (1 - weight) a,

with a the anchor (mergekit's base model), b the source and t (`nearswap_t`, mergekit's
`t`) the distance scale: an entry within t of the anchor's becomes the source's, one
farther moves toward it by t. t = 0 gives the anchor; a t above every |a - b| the source.
mergekit's t has no default (the file always writes it); rotviz's is 1e-4, the reference
model's. It combines two models, takes no base and no weight (--weight does not change it);
it is elementwise and runs at size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from rotviz.limits import NEARSWAP_T
from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor

FLOOR = 1e-6  # mergekit's floor of |a - b| in the ratio

T = Param("nearswap_t", 1e-4, "NearSwap: distance scale t; an entry of the source within t of "
          "the anchor's replaces it, a farther one moves it by t (mergekit's t; default 1e-4)",
          NEARSWAP_T, label="NearSwap: t (distance scale)", widget=(0.0, 0.1, 1e-4))


def nearswap_rows(src: RowSource, t: float) -> Iterator[Tensor]:
    """NearSwap of one tensor of two models (the anchor first), slice by slice in float64."""
    for (a, b), _ in src.slices():
        weight = (t / (a - b).abs().clamp(min=FLOOR)).clamp(0.0, 1.0)
        yield weight * b + (1.0 - weight) * a


def nearswap(a: Tensor, b: Tensor, t: float) -> Tensor:
    """NearSwap of one tensor from the anchor `a` toward `b`, in float64, cast to a's dtype."""
    return whole(lambda src: nearswap_rows(src, t), [a, b], None)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    return nearswap_rows(src, job.params["nearswap_t"])


NEARSWAP = register(MergeMethod(
    "nearswap", "NearSwap",
    "the anchor's entries swapped for the source's where they lie within t of them, moved "
    "by t toward them elsewhere (NearSwap, alchemonaut)",
    rows=_rows, params=(T,), max_models=2, extra=("nearswap_t",),
    weighted=False,
    mergekit=Mergekit("nearswap", base="anchor", weight=None, shared={"nearswap_t": "t"}),
    order=170))

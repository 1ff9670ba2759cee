"""What the methods built on task vectors share (task arithmetic, TIES, DARE): a task vector
is a model minus the base it was fine-tuned from, d_i = theta_i - theta_base, tensor by
tensor. The operations follow mergekit's definitions (its generalized task arithmetic and
sparsification), written here in float64:

- `trim`: keep the `density` share of entries largest in magnitude (at least one entry when
  density > 0; density >= 1 keeps all, density <= 0 none);
- `drop`: keep each entry with probability `density` from a seeded generator (DARE), then
  rescale: by 1 / density (the DARE paper's, which keeps the expectation), to the L1 norm of
  the task vector before dropping (mergekit 0.1.5's `rescale`), or not at all;
- `elect`: the sign of each entry that the weighted task vectors agree on (TIES: `sum`, the
  sign of their sum, or `count`, the sign most of them have; a tie or a zero goes to +), and
  which entries of each vector carry it (a zero entry never does);
- `combine_deltas`: base + scale * sum_i w_i d_i, or the elected entries only, divided by the
  weight of the vectors that carry each entry (the disjoint mean) when `normalize`.

Each entry the mask of a random drop keeps is drawn from a generator seeded by the seed, the
tensor's name and the model's index, so a merge is reproducible from its seed and a tensor's
mask does not depend on the order tensors are merged in (block by block at size, or whole).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rotviz.limits import DENSITY, SCALE
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor

CONSENSUS = ("sum", "count")  # TIES's sign election (mergekit's consensus_method)
RESCALES = ("density", "l1", "none")  # DARE's rescaling of the kept entries
L1_EPS = 1e-7  # mergekit's: a norm below this is not rescaled to

SCALE_PARAM = Param("scale", 1.0, "λ, the scale of the merged task vector: base + λ sum_i w_i "
                    "d_i (mergekit's lambda; default 1, negative: task negation)", SCALE,
                    label="λ: scale of the merged task vector", widget=(-2.0, 4.0, 0.05))


def density_param(default: float, what: str) -> Param:
    return Param("density", default, f"share of each task vector {what}, in [0, 1] "
                 f"(default {default:g})", DENSITY, label="Density: share of each task vector "
                 "kept", widget=(0.0, 1.0, 0.05))


CONSENSUS_PARAM = Param("consensus", "sum", "sign election: sum (the sign of the weighted sum, "
                        "TIES's) or count (the sign most task vectors have) (default sum)",
                        choices=CONSENSUS, label="Sign election")


def task_vectors(tensors: Sequence[Tensor], base: Tensor) -> list[Tensor]:
    """d_i = theta_i - base, in float64."""
    b = base.double()
    return [t.double() - b for t in tensors]


def trim(delta: Tensor, density: float) -> Tensor:
    """The `density` share of entries largest in magnitude (at least one when density > 0),
    the rest zero (TIES's trim; mergekit's magnitude sparsification)."""
    import torch

    if density >= 1.0:
        return delta
    if density <= 0.0 or delta.numel() == 0:
        return torch.zeros_like(delta)
    k = max(1, int(density * delta.numel()))
    flat = delta.reshape(-1)
    keep = torch.topk(flat.abs(), k, sorted=False).indices
    out = torch.zeros_like(flat)
    out[keep] = flat[keep]
    return out.reshape(delta.shape)


def drop_seed(seed: int, name: str, index: int) -> int:
    """The generator seed of model `index`'s tensor `name` under merge seed `seed`."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode()) * 101 + index) % (2**63 - 1)


def keep_mask(shape, density: float, seed: int) -> Tensor:
    """Bernoulli(density) entries (1 kept, 0 dropped), float64, from a CPU generator."""
    import torch

    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) < density).double()


def drop(delta: Tensor, density: float, seed: int, rescale: str = "density") -> Tensor:
    """DARE's random drop: each entry kept with probability `density` (seeded), then rescaled
    by 1 / density (`density`), to the L1 norm before dropping (`l1`) or not (`none`)."""
    import torch

    if density >= 1.0:
        return delta
    if density <= 0.0 or delta.numel() == 0:
        return torch.zeros_like(delta)
    kept = delta * keep_mask(delta.shape, density, seed).to(delta.device)
    if rescale == "density":
        return kept / density
    if rescale == "l1":
        before, after = float(delta.abs().sum()), float(kept.abs().sum())
        if before < L1_EPS or after < L1_EPS:
            return kept
        return kept * (before / after)
    return kept


def elect(weighted: Sequence[Tensor], consensus: str = "sum") -> list[Tensor]:
    """Per vector, the entries whose sign is the elected one (1.0) or not (0.0)."""
    import torch

    stacked = torch.stack(list(weighted))
    signs = stacked.sign()
    votes = stacked.sum(0) if consensus == "sum" else signs.sum(0)
    majority = torch.where(votes >= 0, 1.0, -1.0).to(stacked.dtype)
    return list((signs == majority).to(stacked.dtype).unbind(0))


def combine_deltas(base: Tensor, deltas: Sequence[Tensor], weights: Sequence[float],
                   scale: float = 1.0, consensus: str | None = None,
                   normalize: bool = False) -> Tensor:
    """base + scale * (sum_i w_i d_i [elected entries only]) [/ sum_i w_i (elected)], cast to
    the base's dtype. A divisor of 0 (no vector carries an entry) counts as 1, and so does a
    weight sum below 1e-8 without election, as mergekit does."""
    import torch

    weighted = [float(w) * d for w, d in zip(weights, deltas, strict=True)]
    if consensus is not None:
        masks = elect(weighted, consensus)
        mixed = sum(wd * m for wd, m in zip(weighted, masks, strict=True))
        divisor = sum(float(w) * m for w, m in zip(weights, masks, strict=True))
        divisor = torch.where(divisor == 0, torch.ones_like(divisor), divisor)
    else:
        mixed = sum(weighted)
        total = sum(float(w) for w in weights)
        divisor = total if abs(total) >= 1e-8 else 1.0
    if normalize:
        mixed = mixed / divisor
    return (base.double() + scale * mixed).to(base.dtype)

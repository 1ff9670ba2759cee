"""What the methods built on task vectors share (task arithmetic, TIES, DARE): a task vector
is a model minus the base it was fine-tuned from, d_i = theta_i - theta_base, tensor by
tensor. The operations follow mergekit's definitions (its generalized task arithmetic and
sparsification), written here in float64, a slice of rows at a time (rotviz.merging.rows):

- `Trim`: keep the `density` share of entries largest in magnitude, of the whole tensor (at
  least one entry when density > 0; density >= 1 keeps all, density <= 0 none); entries of
  equal magnitude at the threshold are kept first to last in the tensor's order (the order
  a stable sort gives), so the kept set is the same whichever slices the tensor is read in;
- `Drop`: keep each entry with probability `density` from a seeded generator (DARE), then
  rescale: by 1 / density (the DARE paper's, which keeps the expectation), to the L1 norm of
  the task vector before dropping (mergekit 0.1.5's `rescale`), or not at all;
- `elect`: the sign of each entry that the weighted task vectors agree on (TIES: `sum`, the
  sign of their sum, or `count`, the sign most of them have; a tie or a zero goes to +), and
  which entries of each vector carry it (a zero entry never does);
- `combine_deltas`: base + scale * sum_i w_i d_i, or the elected entries only, divided by the
  weight of the vectors that carry each entry (the disjoint mean) when `normalize`.

Each entry the mask of a random drop keeps is drawn from a generator seeded by the seed, the
tensor's name and the model's index, in the tensor's row order, so a merge is reproducible
from its seed and a tensor's mask depends neither on the order tensors are merged in nor on
the slices it is read in (block by block at size, or whole).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rotviz.limits import DENSITY, SCALE
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    from rotviz.merging.rows import RowSource

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


# ---- trim: the tensor-wide magnitude threshold ---------------------------------------------

RADIX = 20  # bits of the float64 pattern of |d| ranked per histogram pass, at most
COLLECT = 1 << 22  # candidates at most this many are gathered and ranked directly


def picked(values: Tensor, mask: Tensor) -> Tensor:
    """values[mask], flat, in order (both flat): taken at the mask's nonzero indices, the
    same entries in the same order as torch.masked_select, which on the CPU took about three
    times as long for the few entries a selection keeps of a slice's 262144."""
    return values.take(mask.nonzero().squeeze(1))


class _Select:
    """The k-th largest of one model's |d| over the whole tensor, found in passes over its
    slices without holding it: a nonnegative float64 orders as its bit pattern does, so each
    histogram pass fixes the next `RADIX` bits of the answer (the candidates are the entries
    whose high bits match those fixed so far), and once few candidates are left they are
    gathered and ranked. `greater` counts the entries larger than the answer."""

    def __init__(self, k: int, numel: int) -> None:
        self.need = k  # the answer's rank among the candidates (1: the largest)
        self.greater = 0  # entries larger than every candidate
        self.prefix, self.shift = 0, 64  # candidates: bits >> shift == prefix
        self.count = numel  # candidates
        self.value: float | None = None
        self.width = 0  # bits this pass ranks (0: it gathers the candidates)
        self.hist: Tensor | None = None
        self.found: Tensor | None = None  # the candidates gathered, `at` of them so far
        self.at = 0

    def begin(self) -> None:
        self.hist, self.found, self.at = None, None, 0
        # no more bins than candidates: a pass costs its histogram's size per slice
        self.width = min(RADIX, self.shift, max(8, self.count.bit_length() - 4)) \
            if self.count > COLLECT else 0

    def see(self, a: Tensor) -> None:
        """One slice's |d|, flat."""
        import torch

        if self.shift < 64:
            a = picked(a, (a.view(torch.int64) >> self.shift) == self.prefix)
        self.take(a)

    def take(self, a: Tensor) -> None:
        """One slice's candidates, flat: its entries whose bits >> `shift` are `prefix`
        (`see` picks them; several selectors of the same values pick them once)."""
        self.add(self.part(a))

    def part(self, a: Tensor, bins: Tensor | None = None) -> Tensor | tuple[int, Tensor] | None:
        """What one slice's candidates (as `take` has them) add to this pass: the candidates
        themselves when it gathers, else their histogram's counts from its lowest bin. It
        changes nothing but `bins` (the first pass's bins of `a`, bits >> (64 - width),
        where the caller has them: they are counted in place), so slices can be counted on
        other threads (`add` keeps them)."""
        import torch

        if not self.width:
            return a
        keys = a.view(torch.int64)
        if not keys.numel():
            return None
        low = self.shift - self.width
        if bins is None:
            bins = keys >> low if self.shift == 64 else (keys >> low) & ((1 << self.width) - 1)
        # counted from the slice's lowest bin: its magnitudes span few of the 2^width bins,
        # and a histogram of them all per slice would cost more than the slice
        first = int(bins.min())
        return first, torch.bincount(bins.sub_(first))

    def add(self, part: Tensor | tuple[int, Tensor] | None) -> None:
        """A slice's `part`, kept: its candidates copied into one buffer (small tensors left
        between large ones would keep the allocator from giving memory back), or its counts
        added to the histogram. Integer counts and copies: the order of the slices does
        not change the pass's answer."""
        import torch

        if part is None:
            return
        if isinstance(part, tuple):
            first, counts = part
            if self.hist is None:
                self.hist = torch.zeros(1 << self.width, dtype=torch.int64,
                                        device=counts.device)
            self.hist[first:first + counts.numel()] += counts
            return
        if self.found is None:
            self.found = torch.empty(self.count, dtype=part.dtype, device=part.device)
        self.found[self.at:self.at + part.numel()] = part
        self.at += part.numel()

    def end(self) -> None:
        import torch

        if not self.width:
            vals, self.found = self.found, None
            self.pick(vals)
            return
        h, self.hist = self.hist, None
        above = h.flip(0).cumsum(0)  # entries in the top j + 1 buckets
        j = int(torch.searchsorted(above, torch.tensor([self.need], device=above.device)))
        b = h.numel() - 1 - j
        over = int(above[j]) - int(h[b])
        self.need -= over
        self.greater += over
        self.prefix = (self.prefix << self.width) | b
        self.shift -= self.width
        self.count = int(h[b])
        if self.shift == 0:  # every bit fixed: the answer, and all candidates equal it
            self.value = float(torch.tensor([self.prefix], dtype=torch.int64).view(
                torch.float64))

    def pick(self, vals: Tensor) -> None:
        """The answer, ranked among its candidates `vals` (all of them, in any order)."""
        import torch

        v = torch.kthvalue(vals, vals.numel() - self.need + 1).values
        self.greater += int((vals > v).sum())
        self.value = float(v)


class Trim:
    """TIES's trim of each model's task vector in `src`: the `density` share of the whole
    tensor's entries largest in magnitude kept, the rest zero. Built with passes over the
    slices (the threshold of each model, found together); then called once per slice in
    order, `trim(i, d)` for model i's task vector d of that slice (it counts how many
    entries equal to the threshold are still to keep)."""

    def __init__(self, src: RowSource, density: float) -> None:
        self.density = density
        self.value: list[float] = []
        self.left: list[int] = []
        if density >= 1.0 or density <= 0.0 or src.numel == 0:
            return
        k = max(1, int(density * src.numel))
        found = [_Select(k, src.numel) for _ in range(src.n)]
        while True:
            live = [i for i, s in enumerate(found) if s.value is None]
            if not live:
                break
            for i in live:
                found[i].begin()
            for models, base in src.slices():
                for i in live:
                    found[i].see((models[i] - base).abs().reshape(-1))
            for i in live:
                found[i].end()
        self.value = [float(s.value) for s in found]  # type: ignore[arg-type]
        self.left = [k - s.greater for s in found]

    def __call__(self, i: int, d: Tensor) -> Tensor:
        import torch

        if self.density >= 1.0:
            return d
        if not self.value:
            return torch.zeros_like(d)
        a = d.abs()
        v = self.value[i]
        keep = a > v
        if self.left[i]:  # entries equal to the threshold still to keep
            equal = a == v
            n = int(equal.sum())
            if n > self.left[i]:  # the first ones, in the tensor's order
                flat = equal.reshape(-1)
                flat &= flat.cumsum(0) <= self.left[i]
                n = self.left[i]
            self.left[i] -= n
            keep |= equal
        return torch.where(keep, d, torch.zeros((), dtype=d.dtype, device=d.device))


# ---- drop: DARE's seeded random masks ------------------------------------------------------


def drop_seed(seed: int, name: str, index: int) -> int:
    """The generator seed of model `index`'s tensor `name` under merge seed `seed`."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode()) * 101 + index) % (2**63 - 1)


class Drop:
    """DARE's random drop of each model's task vector in `src`: each entry kept with
    probability `density`, drawn from a CPU generator seeded by `seeds[i]` slice after slice
    (so a slice's mask is the rows of the whole tensor's mask), then rescaled by 1 / its keep
    probability (`density`), to the L1 norm before dropping (`l1`: the norms of the whole
    tensor, a first pass) or not (`none`). Called once per slice in order, `drop(i, d)`.
    DELLA's drop (rotviz.merging.della.MagPrune) is this with per-entry keep probabilities:
    it replaces `_keep` and `_apply`.

    The `l1` pass keeps each slice's mask, one bit an entry (an embedding's 262M entries:
    33 MB a model), and the second pass reads them back in order instead of drawing and
    ranking again (DELLA's rank sort was half of its merge); the masks, and so the merge, are
    the same bits."""

    def __init__(self, src: RowSource, density: float, seeds: Sequence[int],
                 rescale: str = "l1") -> None:
        self.density, self.seeds, self.rescale = density, list(seeds), rescale
        self.factor: list[float | None] = [None] * src.n
        self.masks: list[list[tuple[Any, tuple[int, ...]]]] | None = None
        if rescale == "l1" and 0.0 < density < 1.0 and src.numel:
            before, after = [0.0] * src.n, [0.0] * src.n
            self.masks = [[] for _ in range(src.n)]
            self.gens = self._generators()
            for models, base in src.slices():
                for i, m in enumerate(models):
                    d = m - base
                    keep, _ = self._keep(i, d)
                    before[i] += float(d.abs().sum())
                    after[i] += float(self._apply(d, keep).abs().sum())
                    self.masks[i].append(_packed(keep))
            self.factor = [None if b < L1_EPS or a < L1_EPS else b / a
                           for b, a in zip(before, after, strict=True)]
            for m in self.masks:
                m.reverse()  # popped from the end, in slice order
        self.gens = self._generators()

    def _generators(self) -> list:
        import torch

        return [torch.Generator(device="cpu").manual_seed(s) for s in self.seeds]

    def _keep(self, i: int, d: Tensor) -> tuple[Tensor, Tensor | float]:
        """The slice's mask (True: kept), Bernoulli(density), and the keep probability (one
        for all here)."""
        import torch

        draw = torch.rand(d.shape, generator=self.gens[i], dtype=torch.float64)
        return (draw < self.density).to(d.device), self.density

    def _apply(self, d: Tensor, keep: Tensor) -> Tensor:
        """d with its dropped entries zero."""
        return d * keep.double()

    def __call__(self, i: int, d: Tensor) -> Tensor:
        import torch

        if self.density >= 1.0:
            return d
        if self.density <= 0.0 or d.numel() == 0:
            return torch.zeros_like(d)
        if self.masks is not None:  # the l1 pass's mask of this slice
            kept = self._apply(d, _unpacked(self.masks[i].pop(), d.device))
        else:
            keep, p = self._keep(i, d)
            kept = self._apply(d, keep)
            if self.rescale == "density":
                return kept / p
        if self.rescale == "l1" and self.factor[i] is not None:
            return kept * self.factor[i]
        return kept


def _packed(keep: Tensor) -> tuple[Any, tuple[int, ...]]:
    """A mask as one bit an entry (numpy.packbits), with its shape."""
    import numpy as np

    return np.packbits(keep.reshape(-1).cpu().numpy()), tuple(keep.shape)


def _unpacked(packed: tuple[Any, tuple[int, ...]], device: Any) -> Tensor:
    import math

    import numpy as np
    import torch

    bits, shape = packed
    flat = np.unpackbits(bits, count=math.prod(shape)).view(np.bool_)
    return torch.from_numpy(flat).reshape(shape).to(device)


# ---- elect and combine: entry by entry -------------------------------------------------------


def elect(weighted: Sequence[Tensor], consensus: str = "sum") -> list[Tensor]:
    """Per vector, the entries that carry the elected sign (True) or not: a vector carries
    an entry whose sign is the one elected, so a zero entry never does."""
    import torch

    signs = [wd.sign() for wd in weighted]
    votes = sum(weighted) if consensus == "sum" else sum(signs)
    majority = torch.where(votes >= 0, 1.0, -1.0).to(weighted[0].dtype)
    return [s == majority for s in signs]


def combine_deltas(base: Tensor, deltas: Sequence[Tensor], weights: Sequence[float],
                   scale: float = 1.0, consensus: str | None = None,
                   normalize: bool = False) -> Tensor:
    """base + scale * (sum_i w_i d_i [elected entries only]) [/ sum_i w_i (elected)], in
    float64. A divisor of 0 (no vector carries an entry) counts as 1, and so does a weight
    sum below 1e-8 without election, as mergekit does. Sums run in the models' order."""
    import torch

    weighted = [float(w) * d for w, d in zip(weights, deltas, strict=True)]
    if consensus is not None:
        carries = elect(weighted, consensus)
        zero = torch.zeros((), dtype=weighted[0].dtype, device=weighted[0].device)
        mixed = divisor = None
        for w, wd, c in zip(weights, weighted, carries, strict=True):
            part, weight = torch.where(c, wd, zero), torch.where(c, float(w), zero)
            mixed = part if mixed is None else mixed.add_(part)
            divisor = weight if divisor is None else divisor.add_(weight)
        divisor.masked_fill_(divisor == 0, 1.0)
    else:
        mixed = sum(weighted)
        total = sum(float(w) for w in weights)
        divisor = total if abs(total) >= 1e-8 else 1.0
    if normalize:
        mixed = mixed / divisor
    return base.double() + (mixed if scale == 1.0 else scale * mixed)

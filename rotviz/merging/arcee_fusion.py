"""Arcee Fusion (Arcee AI), as mergekit 0.1.5 defines its `arcee_fusion`: of two models, the
anchor a (mergekit's base model) takes the source b's entries where b differs from it
importantly, and keeps its own elsewhere. An entry's importance is

    s = |b - a| * KL(softmax(b) + 1e-8 || softmax(a) + 1e-8),

the KL taken along the tensor's last dimension (one number per row of a matrix, one for a
whole vector), and the entries with s >= median(s) + 1.5 (q3(s) - q1(s)) are taken:

    theta = a + (b - a) [s >= threshold].

The quartiles are order statistics of the tensor's s, the sorted s at floor(q (n - 1)).
mergekit samples a million entries (with replacement, unseeded) of a larger tensor to
estimate them; rotviz takes them exactly, so the two agree on tensors of at most a million
entries and differ where sampling moves mergekit's threshold. An s below 0 (a KL that
rounds below 0) counts as 0. It combines two models and takes no base and no weight
(--weight does not change it); it runs at size, the quartiles found in passes over the
slices of the matrix's rows (a vector is read whole: its KL spans it), the first pass also
gathering the bins that a sample of rows says hold the quartiles (`_Guess`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import rotviz.merging.task_vectors as tv
from rotviz.devices import in_order
from rotviz.merging.registry import Mergekit, MergeMethod, register
from rotviz.merging.rows import whole
from rotviz.merging.task_vectors import _Select, picked

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob
    from rotviz.merging.rows import RowSource

    Tensor = torch.Tensor

Done = TypeVar("Done")

EPS = 1e-8  # mergekit's: added to each softmax before the KL
QUARTILES = (0.25, 0.5, 0.75)
FENCE = 1.5  # the threshold: median + FENCE x the interquartile range

# The first pass also gathers the entries of the bins that a sample of rows says hold the
# quartiles. Where the histogram then puts a quartile in a bin gathered whole (nearly
# always), it is ranked there, and the pass that would gather its bin is not made: on a
# 128256 x 2048 embedding that pass read and cast both tensors again. The sample only
# guesses: a quartile whose bin was not gathered takes the passes it took before, so the
# quartiles, and the merge, are the same bits either way.
SAMPLE = 1 << 20  # entries of the sampled rows, about
SAMPLE_RUNS = 32  # the sample's runs of rows, spread evenly over the tensor
MARGIN = 5.0  # the bins gathered: the sample's quartile +- MARGIN standard errors of its rank
GUESS_SHARE = 16  # entries gathered at most: numel / GUESS_SHARE (and at least COLLECT)


def row_kl(a: Tensor, b: Tensor) -> Tensor:
    """KL(softmax(b) + EPS || softmax(a) + EPS) along the last dimension, one per row (kept as
    a column), of a slice holding whole rows (or of a whole vector), never below +0 (a KL that
    rounds below 0 counts as 0, and +0 keeps every importance off -0.0, ranked by its bits)."""
    import torch

    if a.dim() == 0:
        a, b = a.reshape(1), b.reshape(1)
    p = torch.softmax(b, dim=-1).add_(EPS)
    q = torch.softmax(a, dim=-1).add_(EPS)
    # p log(p / q), in place in q: the same operations on the same numbers as the formula
    # (a product's factors commute), a third less time than with a new tensor per step
    return torch.div(p, q, out=q).log_().mul_(p).sum(-1, keepdim=True).clamp_(min=0.0).add_(0.0)


def importance(a: Tensor, b: Tensor, kl: Tensor | None = None) -> Tensor:
    """s = |b - a| x KL(softmax(b) || softmax(a)) along the last dimension (each + EPS),
    of a slice holding whole rows (or of a whole vector); never below 0. `kl`: the slice's
    `row_kl`, where a pass before took it."""
    if a.dim() == 0:
        a, b = a.reshape(1), b.reshape(1)
    return (b - a).abs_().mul_(row_kl(a, b) if kl is None else kl)


def _pairs(src: RowSource) -> Iterator[tuple[Tensor, Tensor]]:
    """The (a, b) slices whose importance is local: a matrix's rows; a vector read whole."""
    import torch

    if len(src.shape) >= 2:
        for (a, b), _ in src.slices():
            yield a, b
        return
    parts = list(src.slices())
    yield (torch.cat([p[0][0] for p in parts]), torch.cat([p[0][1] for p in parts]))


class _Scored:
    """The slices with their rows' KL: taken in the first pass (the softmaxes and the log,
    most of a pass's work) and kept, one number per row, for every later pass, which then
    only multiplies |b - a| by it (a 128256-row embedding keeps 1 MB). A matrix's are kept
    in one tensor made before the first slice: a small tensor kept per slice sits between
    the slices' freed working copies on glibc's heap, and each next slice then takes new
    memory (kept per slice, a 128256 x 2048 pair's passes grew the process by 2.1 GB)."""

    def __init__(self, src: RowSource) -> None:
        self.src = src
        self.kl: Tensor | None = None  # a matrix's, (*shape[:-1], 1)
        self.whole: tuple[Tensor, Tensor, Tensor] | None = None  # a vector, read whole

    def each(self, task: Callable[[Tensor, Tensor, Tensor], Done]) -> Iterator[Done]:
        """task(a, b, kl) of each slice, in order: the slices read and worked on
        `slice_workers` threads at once (rotviz.devices.in_order), so `task` must
        change nothing but what it makes. In the first pass each slice's KL is taken where
        it is read and kept here by this thread, in row order."""
        import torch

        src = self.src
        if len(src.shape) < 2:
            if self.whole is None:
                (a, b), = _pairs(src)
                self.whole = (a, b, row_kl(a, b))
            yield task(*self.whole)
            return
        kept = self.kl  # None in the first pass, which takes the KL

        def work(bounds: tuple[int, int]) -> tuple[Tensor, Done]:
            lo, hi = bounds
            (a, b), _ = src.read(lo, hi)
            kl = row_kl(a, b) if kept is None else kept[lo:hi]
            return kl, task(a, b, kl)

        for (lo, hi), (kl, done) in zip(src.bounds(), in_order(work, src.bounds()),
                                        strict=True):
            if kept is None:
                if self.kl is None:
                    self.kl = torch.empty((*src.shape[:-1], 1), dtype=kl.dtype,
                                          device=kl.device)
                self.kl[lo:hi] = kl
            yield done


def _sample(src: RowSource) -> list[Tensor] | None:
    """The importances of SAMPLE_RUNS runs of rows spread evenly over a matrix, about SAMPLE
    entries in all (each run's rows read at once); None where sampling cannot save a pass:
    a vector (read whole), a tensor the first pass gathers whole, or too few rows."""
    import math

    rows = src.shape[0] if len(src.shape) >= 2 else 0
    if rows < 2 * SAMPLE_RUNS or src.numel <= tv.COLLECT:
        return None
    per_row = math.prod(src.shape[1:])
    take = max(1, SAMPLE // (SAMPLE_RUNS * per_row))
    if take * SAMPLE_RUNS * 2 > rows:  # half the tensor or more: not a sample
        return None
    runs = []
    for r in range(SAMPLE_RUNS):
        lo = r * rows // SAMPLE_RUNS
        (a, b), _ = src.read(lo, lo + take)
        runs.append(importance(a, b).reshape(-1))
    return runs


class _Guess:
    """The first pass's bins (bits >> `low`) that a sample says hold the quartiles, as a
    table, and the entries of those bins that the pass gathers (in one buffer, given up
    when they outgrow it: the pass then gathers nothing more, and the quartiles take their
    passes as without a guess). A quartile the sample puts at 0 (where many entries are
    unchanged) has its bin's zeros counted instead: the first bin holds the zeros and the
    subnormal numbers, and where it holds only zeros, its quartile is 0."""

    def __init__(self, table: Tensor, low: int, room: int, zeros: bool) -> None:
        self.table: Tensor | None = table
        self.low, self.room, self.zeros = low, room, zeros
        self.found: Tensor | None = None
        self.at = 0
        self.zero = 0  # entries equal to 0, where counted

    @classmethod
    def of(cls, runs: list[Tensor], ks: list[int], numel: int, width: int) -> _Guess | None:
        """The bins about each quartile of the sampled importances `runs` (the k-th
        largest of `numel` for k in `ks`): from the sample's entries MARGIN standard errors
        of rank below it to as many above, the error the larger of the spread of the runs'
        shares below it (rows differ) and a simple random sample's. A quartile whose bins
        would hold more than numel / GUESS_SHARE entries is left to its passes; None where
        no quartile is guessed."""
        import math

        import torch

        low = 64 - width
        flat = torch.cat(runs).sort().values
        m = flat.numel()
        bins = flat.view(torch.int64) >> low  # ascending: a nonnegative float64 orders as its bits
        table = torch.zeros(1 << width, dtype=torch.bool)
        room = max(tv.COLLECT, numel // GUESS_SHARE)
        zeros = False
        for k in ks:
            p = (numel - k) / max(1, numel - 1)  # the quartile's place, from the smallest
            v = flat[round(p * (m - 1))]
            below = torch.stack([(r <= v).double().mean() for r in runs])
            err = max(float(below.std()) / math.sqrt(len(runs)), math.sqrt(p * (1 - p) / m),
                      1 / m)
            lo = int(bins[max(0, math.floor((p - MARGIN * err) * (m - 1)))])
            hi = int(bins[min(m - 1, math.ceil((p + MARGIN * err) * (m - 1)))])
            if hi == 0:
                zeros = True
                continue
            more = table.clone()
            more[lo:hi + 1] = True
            if float(more[bins].double().mean()) * numel * 1.5 <= room:
                table = more
        expected = float(table[bins].double().mean()) * numel
        if not zeros and not expected:
            return None
        return cls(table, low, min(room, int(expected * 1.5) + 1024), zeros)

    def part(self, s: Tensor, bins: Tensor) -> tuple[Tensor, int] | None:
        """One slice's entries in the guessed bins and its zeros' count, given its s, flat,
        and their bins (read, not changed)."""
        import torch

        table = self.table
        if table is None:
            return None
        zero = int(torch.count_nonzero(s == 0)) if self.zeros else 0
        return picked(s, table.index_select(0, bins)), zero

    def add(self, part: tuple[Tensor, int] | None) -> None:
        import torch

        if part is None or self.table is None:
            return
        got, zero = part
        self.zero += zero
        if self.at + got.numel() > self.room:  # the sample was wrong: give up the guess
            self.table, self.found = None, None
            return
        if self.found is None:
            self.found = torch.empty(self.room, dtype=got.dtype, device=got.device)
        self.found[self.at:self.at + got.numel()] = got
        self.at += got.numel()

    def finish(self, f: _Select) -> None:
        """After the first pass: the quartile `f`, where the histogram put it in a bin
        gathered whole, ranked among its entries; or 0, where it put it in the first bin
        and all of that bin's entries are zeros."""
        import torch

        if self.table is None or f.value is not None or f.shift != self.low:
            return
        if self.zeros and f.prefix == 0 and self.zero == f.count:
            f.value = 0.0  # every candidate is 0: none is larger
            return
        if not bool(self.table[f.prefix]):
            return
        got = self.found[:self.at] if self.found is not None else torch.empty(
            0, dtype=torch.float64)
        vals = picked(got, (got.view(torch.int64) >> self.low) == f.prefix)
        if vals.numel() != f.count:
            raise RuntimeError(f"Arcee Fusion gathered {vals.numel()} of a bin's "
                               f"{f.count} entries")
        f.pick(vals)


class _Quartiles:
    """The order statistics of one tensor's importances, each the k-th largest of `ks`,
    found together: each pass computes a slice's s once and gives it to every selector
    still looking, and selectors whose candidates are the same entries (all of them in the
    first pass; later, answers in one bin) share one histogram or one gathered buffer,
    each slice's bits shifted once per distinct shift."""

    def __init__(self, ks: list[int], numel: int) -> None:
        self.ks, self.numel = ks, numel
        self.found = [_Select(k, numel) for k in ks]
        self.groups: list[list[_Select]] = []
        self.guess: _Guess | None = None  # the first pass's, where a sample made one

    def done(self) -> bool:
        return all(f.value is not None for f in self.found)

    def begin(self) -> None:
        groups: dict[tuple[int, int], list[_Select]] = {}
        for f in self.found:
            if f.value is None:
                groups.setdefault((f.shift, f.prefix), []).append(f)
        self.groups = list(groups.values())
        for g in self.groups:
            g[0].begin()

    def guess_from(self, runs: list[Tensor] | None) -> None:
        """Before the first pass (after `begin`): the bins its histogram counts that the
        sampled importances `runs` say hold the quartiles, to gather as well."""
        lead = self.groups[0][0]
        if runs is not None and len(self.groups) == 1 and lead.shift == 64 and lead.width:
            self.guess = _Guess.of(runs, self.ks, self.numel, lead.width)

    def parts(self, s: Tensor) -> list[tuple[_Select | _Guess, Any]]:
        """What one slice's s, flat, adds to each group's lead (`_Select.part`), changing
        nothing (slices are counted on several threads; `add` keeps each in order). Groups
        that gather their candidates pick them together, one selection of the entries in
        any of their bins split among them (a selection costs more than a comparison, and
        few entries are picked)."""
        import torch

        keys = s.view(torch.int64)
        high: dict[int, Tensor] = {}  # bits >> shift, per shift
        gathering: dict[int, list[_Select]] = {}
        out: list[tuple[_Select | _Guess, Any]] = []
        for g in self.groups:
            lead = g[0]
            if lead.shift == 64:
                if self.guess is not None and lead.width:
                    bins = keys >> self.guess.low
                    out.append((self.guess, self.guess.part(s, bins)))  # before `part` counts
                    out.append((lead, lead.part(s, bins)))  # them in place
                else:
                    out.append((lead, lead.part(s)))
                continue
            if lead.shift not in high:
                high[lead.shift] = keys >> lead.shift
            if lead.width:
                out.append((lead, lead.part(picked(s, high[lead.shift] == lead.prefix))))
            else:
                gathering.setdefault(lead.shift, []).append(lead)
        for shift, leads in gathering.items():
            h = high[shift]
            if len(leads) == 1:
                out.append((leads[0], leads[0].part(picked(s, h == leads[0].prefix))))
                continue
            chosen = h == leads[0].prefix
            for lead in leads[1:]:
                chosen |= h == lead.prefix
            cs = picked(s, chosen)
            hs = cs.view(torch.int64) >> shift
            out.extend((lead, lead.part(picked(cs, hs == lead.prefix))) for lead in leads)
        return out

    @staticmethod
    def add(parts: list[tuple[_Select | _Guess, Any]]) -> None:
        for lead, part in parts:
            lead.add(part)

    def end(self) -> None:
        for g in self.groups:
            lead = g[0]
            for f in g[1:]:  # the lead's counts are theirs: read, never written, by `end`
                f.width, f.hist, f.found, f.at = lead.width, lead.hist, lead.found, lead.at
            for f in g:
                f.end()
        if self.guess is not None:
            for f in self.found:
                self.guess.finish(f)
            self.guess = None
        self.groups = []


def threshold(src: RowSource, scored: _Scored | None = None) -> float:
    """median(s) + FENCE (q3 - q1), the quartiles the sorted s at floor(q (n - 1)), found
    in passes over the slices (each the k-th largest: k = n - floor(q (n - 1)))."""
    scored = _Scored(src) if scored is None else scored
    n = src.numel
    quartiles = _Quartiles([n - int(q * (n - 1)) for q in QUARTILES], n)
    runs = _sample(src)
    while not quartiles.done():
        quartiles.begin()
        quartiles.guess_from(runs)
        runs = None  # the first pass's only
        for parts in scored.each(lambda a, b, kl: quartiles.parts(
                importance(a, b, kl).reshape(-1))):
            quartiles.add(parts)
        quartiles.end()
    q1, median, q3 = (float(f.value) for f in quartiles.found)  # type: ignore[arg-type]
    return median + FENCE * (q3 - q1)


def _fused(a: Tensor, b: Tensor, kl: Tensor, t: float) -> Tensor:
    """a + (b - a) [s >= t], as that formula gives it bit for bit (a mask of 1.0 and 0.0
    in float64, so -0.0 entries keep the sign the formula gives them), in place in two new
    tensors: the mask times a float64 tensor, not a boolean one, which torch casts entry by
    entry (3x slower)."""
    d = b - a
    return d.mul_(d.abs().mul_(kl).ge_(t)).add_(a)


def arcee_fusion_rows(src: RowSource) -> Iterator[Tensor]:
    """Arcee Fusion of one tensor of two models (the anchor first), slice by slice in
    float64: the threshold first (passes, the rows' KL taken once), then the important
    entries taken."""
    if src.numel == 0:
        return
    scored = _Scored(src)
    t = threshold(src, scored)
    fused = scored.each(lambda a, b, kl: _fused(a, b, kl, t))
    if len(src.shape) >= 2:
        yield from fused
        return
    merged, = fused  # a vector, read whole: given back in the slices it was read in
    for lo, hi in src.bounds():
        yield merged[lo:hi]


def arcee_fusion(a: Tensor, b: Tensor) -> Tensor:
    """Arcee Fusion of one tensor from the anchor `a` and the source `b`, in float64, cast
    to a's dtype."""
    return whole(arcee_fusion_rows, [a, b], None)


def _rows(job: MergeJob, name: str, src: RowSource) -> Iterator[Tensor]:
    return arcee_fusion_rows(src)


ARCEE_FUSION = register(MergeMethod(
    "arcee_fusion", "Arcee Fusion",
    "the anchor takes the source's entries whose change, times the KL of the rows' softmax, "
    "is an outlier (above median + 1.5 IQR) (Arcee AI)",
    rows=_rows, max_models=2,
    weighted=False, mergekit=Mergekit("arcee_fusion", base="anchor", weight=None), order=180))

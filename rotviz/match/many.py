"""Many models at once: N >= 3 models of one architecture aligned into one basis (the many
record, rotviz.measures.many, then merges them).

Two ways to pick the basis (docs/symmetries.md, "Many models"):
- `anchor`: every other model matched onto the first (the anchor), as pairwise matching does;
- `barycentre`: start from that alignment's mean, then repeat: match every model (as it was
  given, so each aligned model is its original moved by one group element) onto the current
  mean, average the aligned models into the next mean, until the mean moves by less than `tol`
  of its norm (||new - old|| / ||old||) or `rounds` rounds have run. The mean is a parameter
  set evaluated on the anchor's module, never a trained model.

Matching a model onto the mean is weight matching, which needs no data and no working model;
activation and learned matching run the anchor, so they serve `anchor` alignment only.

Every alignment is checked as pairwise matching is: each moved model's logits on probe inputs
equal its original's (rotviz.match.pipeline's function check); the largest change is reported.
The barycentre's mean is a callable (`merge(anchor, states, weights) -> state`), by default
the plain weighted mean (`mean_states`), so that registered merge methods can be plugged in.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch

from rotviz.data.split import Split
from rotviz.errors import RotvizError
from rotviz.match.distances import distances
from rotviz.match.endpoints import as_options
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import check_failure, match_models, view_of
from rotviz.match.selection import label_of
from rotviz.sources.loading import Loaded
from rotviz.sources.pairs import check_compatible
from rotviz.types import Progress

Tensor = torch.Tensor
Merge = Callable[[Loaded, Sequence[Mapping[str, Tensor]], Sequence[float]], dict[str, Tensor]]

TARGETS = ("anchor", "barycentre")
MIN_MODELS = 3
DEFAULT_ROUNDS = 10
DEFAULT_TOL = 1e-4


@dataclass
class Alignment:
    """N models in one basis: their states, how they got there, and their distances."""

    refs: list[str]
    match: str  # canonical matching SPEC
    to: str  # anchor or barycentre
    rounds: int  # barycentre rounds run (0 for anchor)
    ended: str  # "anchor" (one pass), "converged" (moved < tol) or "round limit"
    tol: float
    spread: list[float]  # mean pairwise distance: before, after the anchor pass, each round
    moved: list[float]  # barycentre: the mean's relative change in each round
    max_output_diff: float  # the largest logit change of any moved model (function check)
    output_diffs: list[float]  # per model
    before: list[list[float]]  # pairwise distances of the models as given
    after: list[list[float]]  # ... and as aligned
    seconds: float
    states: list[dict[str, Tensor]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "states"}


def mean_states(anchor: Loaded, states: Sequence[Mapping[str, Tensor]],
                weights: Sequence[float]) -> dict[str, Tensor]:
    """The weighted mean of parameter sets (weights summing to 1), tensor by tensor in
    float64, in the anchor's dtypes; tensors that are not floating (position ids, ...) are the
    anchor's. New tensors: the inputs are not modified."""
    out: dict[str, Tensor] = {}
    for k, ref in anchor.state.items():
        if not ref.is_floating_point():
            out[k] = ref.clone()
            continue
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for s, w in zip(states, weights, strict=True):
            acc += float(w) * s[k].detach().to("cpu", torch.float64)
        out[k] = acc.to(ref.dtype)
    return out


def check_models(models: Sequence[Loaded], least: int = MIN_MODELS) -> None:
    """At least `least` models, all of the anchor's architecture; one line otherwise."""
    if len(models) < least:
        raise RotvizError(f"aligning many models takes at least {least} models, got "
                          f"{len(models)}; give {least} or more (for two, use rotviz match)")
    for m in models[1:]:
        try:
            check_compatible(models[0], m)
        except RotvizError as e:
            raise RotvizError(f"'{m.ref}' is not of '{models[0].ref}''s architecture ({e}); "
                              "give models of one architecture") from None


def check_spec(options: MatchOptions | None, to: str) -> None:
    """`to` is known; a matching exists; barycentre alignment takes data-free matching only."""
    if to not in TARGETS:
        raise RotvizError(f"unknown alignment target '{to}': use anchor or barycentre")
    if options is None:
        raise RotvizError("aligning many models needs a matching: give a SPEC such as seed or "
                          "weight, not none")
    if to == "barycentre" and options.needs_data:
        raise RotvizError(f"matching [{label_of(options)}] runs a model on data, and the "
                          "barycentre is a mean of weights, not a trained model; use a "
                          "data-free SPEC (seed, weight) or --to anchor")


def pairwise(states: Sequence[Mapping[str, Tensor]], anchor: Loaded) -> list[list[float]]:
    """The symmetric matrix of parameter distances (rotviz.match.distances: the distance the
    app shows for a pair), each state read as a model of the anchor's architecture."""
    views = [view_of(dataclasses.replace(anchor, state=dict(s))) for s in states]
    n = len(views)
    d = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            d[i][j] = d[j][i] = distances(views[i], views[j]).total
    return d


def mean_pairwise(d: Sequence[Sequence[float]]) -> float:
    n = len(d)
    pairs = [d[i][j] for i in range(n) for j in range(i + 1, n)]
    return sum(pairs) / len(pairs)


def _norm(state: Mapping[str, Tensor]) -> float:
    return sum(float(t.double().pow(2).sum()) for t in state.values()
               if t.is_floating_point()) ** 0.5


def _gap(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> float:
    return sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in a
               if a[k].is_floating_point()) ** 0.5


def align_many(
    models: Sequence[Loaded],
    options: MatchOptions | str | None = "seed",
    to: str = "barycentre",
    rounds: int = DEFAULT_ROUNDS,
    tol: float = DEFAULT_TOL,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    data: str | Split | None = None,
    merge: Merge = mean_states,
) -> Alignment:
    """align_many([m1, m2, m3, ...], "seed", to="barycentre", rounds=10) -> Alignment

    Align N >= 3 models of one architecture into one basis: onto the first (`to="anchor"`),
    or onto their iteratively refined barycentre (`to="barycentre"`, at most `rounds` rounds,
    stopping when the mean moves less than `tol` of its norm). `merge` makes the mean
    (default: the equal-weight mean of the states). Each alignment's function check must
    pass (one line otherwise). `data` serves activation and learned matching (anchor only)."""
    t0 = time.perf_counter()
    options = as_options(options)
    check_spec(options, to)
    check_models(models)
    if rounds < 1:
        raise RotvizError(f"--rounds {rounds}: give at least 1")
    anchor, n = models[0], len(models)
    total = (n - 1) + (rounds * n if to == "barycentre" else 0)
    step = 0

    def tick(msg: str) -> None:
        nonlocal step
        step += 1
        if progress is not None:
            progress(step, total, msg)

    diffs = [0.0] * n

    def onto(target: Loaded, i: int) -> dict[str, Tensor]:
        m = match_models(target, models[i], options, device, data=data)
        failure = check_failure(m.report, f"'{models[i].ref}' aligned")
        if failure is not None:
            raise RotvizError(f"matching [{label_of(options)}]: {failure}; please report "
                              "this as a bug")
        diffs[i] = float(m.report.max_output_diff)
        tick(f"{models[i].ref} onto {target.ref}")
        return m.state

    originals = [dict(m.state) for m in models]
    before = pairwise(originals, anchor)
    states = [dict(anchor.state)] + [onto(anchor, i) for i in range(1, n)]
    spread = [mean_pairwise(before), mean_pairwise(pairwise(states, anchor))]
    moved: list[float] = []
    ended, done = "anchor", 0
    if to == "barycentre":
        weights = [1.0 / n] * n
        mean = merge(anchor, states, weights)
        ended = "round limit"
        for r in range(rounds):
            target = dataclasses.replace(anchor, ref=f"barycentre (round {r + 1})", state=mean)
            round_diffs = [0.0] * n
            states = []
            for i in range(n):
                states.append(onto(target, i))
                round_diffs[i] = diffs[i]
            new = merge(anchor, states, weights)
            moved.append(_gap(new, mean) / max(_norm(mean), 1e-30))
            spread.append(mean_pairwise(pairwise(states, anchor)))
            mean, done = new, r + 1
            if moved[-1] < tol:
                ended = "converged"
                break
    after = pairwise(states, anchor)
    return Alignment(
        refs=[m.ref for m in models], match=label_of(options), to=to, rounds=done, ended=ended,
        tol=tol, spread=spread, moved=moved, max_output_diff=max(diffs), output_diffs=diffs,
        before=before, after=after, seconds=time.perf_counter() - t0, states=states)

"""What to match: the options of a matching run, and the layer subsets they name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, make_dataclass, replace

from rotviz.errors import RotvizError
from rotviz.limits import (
    DEFAULT_ROUNDS,
    DEFAULT_STALL,
    DEFAULT_STEPS,
    DEFAULT_TOL,
    ROUNDS,
    STALL,
    STEPS,
    TIME_LIMIT,
    TOL,
    check_layer_ranges,
    layer_ranges,
)
from rotviz.params import Param
from rotviz.symmetry.registry import BY_NAME, SYMMETRIES


@dataclass(frozen=True)
class LearnOptions:
    """Learned matching (GLMC paper): maps tuned on training data so that the interpolated
    model at lambda ~ U(lam) has a low loss; the last maps kept (or, with keep="best", those
    of the best validation barrier, early-stopped). Every choice is seeded. Why these
    defaults: docs/solvers.md and section `learned` of bench/RESULTS.md."""

    steps: int = DEFAULT_STEPS
    lr: float = 0.03  # the peak, after `warmup`; higher broke seeds and the function check
    batch_size: int = 128
    # steps of linear warm-up before the cosine decay: Adam's first steps move every entry by
    # about lr whatever its gradient; ramping up keeps the invertible maps well conditioned
    warmup: int = 10
    # lambda ~ U(lam): the GLMC paper trains at U(0.4, 0.6), which never trains the flanks;
    # U(0.2, 0.8) spends steps on flanks that end up below their chord anyway
    lam: tuple[float, float] = (0.3, 0.7)
    # steps between validation barriers: with keep="last" they only fill the report's history
    # (the last maps are checked against the start whatever this is)
    eval_every: int = 150
    val_points: int = 5  # alphas on the validation path, endpoints included
    keep: str = "last"  # "last" (the final maps unless worse than the start) or "best"
    patience: int = 8  # with keep="best": checks without improvement before stopping
    seed: int = 0
    residual: bool = True  # learn the residual map (where the architecture has a rotation)
    heads: bool = True  # learn per-head Q-K and V-O maps
    invertible: bool = True  # Q-K and V-O maps invertible (their whole group), not rotations

    def __post_init__(self) -> None:
        STEPS.check(self.steps)
        if self.warmup < 0:
            raise RotvizError(f"warmup={self.warmup}: give 0 or more steps")
        if self.keep not in KEEP:
            raise RotvizError(f"keep={self.keep!r}: use one of {', '.join(KEEP)}")
        lo, hi = self.lam
        if not 0.0 <= lo <= hi <= 1.0:
            raise RotvizError(f"lam={self.lam}: give 0 <= low <= high <= 1")


KEEP = ("last", "best")  # which learned maps LearnOptions.keep keeps


class _Options:
    """The behaviour of MatchOptions; its fields are made below from the symmetry registry."""

    def __post_init__(self) -> None:
        for s in SYMMETRIES:
            for r in s.requires:
                if getattr(self, s.name) and not getattr(self, r):
                    raise RotvizError(f"{s.label} ({s.name}) needs {BY_NAME[r].label} ({r}): "
                                      f"turn {r} on or {s.name} off")
        ROUNDS.check(self.rounds)
        TOL.check(self.tol)  # also refuses NaN and inf
        STALL.check(self.stall)
        if self.time_limit is not None:
            TIME_LIMIT.check(self.time_limit)

    @property
    def needs_data(self) -> bool:
        return any(getattr(self, s.name) for s in SYMMETRIES if s.needs_data)

    @property
    def label(self) -> str:
        return ",".join(s.name for s in SYMMETRIES if getattr(self, s.name)) or "none"


MatchOptions = make_dataclass(
    "MatchOptions",
    [(s.name, bool, field(default=s.default)) for s in SYMMETRIES] + [
        ("layers", tuple[int, ...] | None, field(default=None)),  # None = every layer
        # with residual: the group (auto = the architecture's, or a subgroup), at most this
        # many alternation rounds per phase, stop when a round gains less than `tol` of the
        # start, and hold the FFN maps for 1, 2, 4, ... rounds after an FFN solve moves no
        # unit (faster on large models, another local optimum; rotviz.match.alternating);
        # plain_rounds: the alternation as it was before joint steps on rotation streams
        # (plain rounds only: per-layer maps, then a Procrustes step; rotviz.match.joint);
        # stall: also stop when a round gains less than this share of the total gain so far
        # (0: only `tol` and `rounds`, the old rule); time_limit: seconds, the alternation
        # stops at the end of the round that crosses it (None: no limit)
        ("residual_group", str, field(default="auto")),
        ("rounds", int, field(default=DEFAULT_ROUNDS)),
        ("tol", float, field(default=DEFAULT_TOL)),
        ("stall", float, field(default=DEFAULT_STALL)),
        ("time_limit", float | None, field(default=None)),
        ("ffn_backoff", bool, field(default=False)),
        ("plain_rounds", bool, field(default=False)),
        ("learn", LearnOptions, field(default_factory=LearnOptions)),  # with learned
    ],
    bases=(_Options,), frozen=True, kw_only=True,
)
MatchOptions.__module__ = __name__  # for repr, pickling and documentation
MatchOptions.__doc__ = ("What to match: one flag per symmetry of rotviz.symmetry.registry "
                        "(keyword-only), the layer subset, and how the residual alternation and "
                        "learned matching run.")


# The options of a matching that every command taking `--match` also takes (the command line's
# options and the library's keywords are made from these records: rotviz.cli.measure,
# rotviz.runner.Pair). The app's sidebar sets the same time budget for every matching.
TIME_LIMIT_PARAM = Param(
    "time_limit", None,
    "with weight matching (--match weight, or residual): stop the alternation at the end of "
    "the round that crosses this many seconds and keep the lowest-distance state it reached "
    f"(0: after the first round; default: no limit; {TIME_LIMIT.text})",
    TIME_LIMIT, label="Matching time budget (s)", metavar="SECONDS")
MATCH_PARAMS = (TIME_LIMIT_PARAM,)


def limited(options: MatchOptions | None, time_limit: float | None,
            flag: str = "--time-limit") -> MatchOptions | None:
    """`options` with the alternation's time limit (None: as they are), refused in one line
    where no alternation runs: a limit nothing would honour is an error, not a quiet no-op."""
    if time_limit is None:
        return options
    time_limit = float(TIME_LIMIT_PARAM.check(time_limit))
    if options is None or not options.residual:
        raise RotvizError(f"{flag} limits weight matching's alternation, and this matching "
                          "has none: match with residual (--match weight), or drop "
                          f"{flag}")
    return replace(options, time_limit=time_limit)


def with_time_limit(options: MatchOptions | None,
                    time_limit: float | None) -> MatchOptions | None:
    """`options` with the alternation's time limit where they alternate (residual), as they
    are otherwise: in a command of several matchings (a ladder's rungs, --match seed and
    --match weight) the limit reaches the ones it can; `limited_specs` refuses a limit that
    reaches none."""
    if time_limit is None or options is None or not options.residual:
        return options
    return replace(options, time_limit=float(TIME_LIMIT_PARAM.check(time_limit)))


def limited_specs(options: Sequence[MatchOptions | None], time_limit: float | None,
                  flag: str = "--time-limit") -> None:
    """Refuse, in one line and before any model loads, a time limit that is out of bounds or
    that none of a command's matchings `options` would honour."""
    if time_limit is None:
        return
    TIME_LIMIT_PARAM.check(time_limit)
    if not any(o is not None and o.residual for o in options):
        raise RotvizError(f"{flag} limits weight matching's alternation, and none of these "
                          "matchings has one: match with residual (--match weight), or drop "
                          f"{flag}")


def parse_layers(spec: str | Sequence[int] | None, n_layers: int) -> tuple[int, ...] | None:
    """'0,2-5' -> (0, 2, 3, 4, 5); checked against the model's layer count before any range
    is expanded, so a huge range costs nothing and its message quotes the input."""
    if spec is None or (isinstance(spec, str) and spec.strip() == "all"):
        return None
    if isinstance(spec, str):
        return check_layer_ranges(layer_ranges(spec), n_layers, spec)
    out = [int(x) for x in spec]
    bad = [i for i in out if not 0 <= i < n_layers]
    if bad:
        raise RotvizError(
            f"--layers {bad[:5]} out of range: the model has {n_layers} layers (0-{n_layers - 1})"
        )
    return tuple(sorted(set(out)))

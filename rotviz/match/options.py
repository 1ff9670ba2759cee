"""What to match: the options of a matching run, and the layer subsets they name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rotviz.errors import RotvizError
from rotviz.limits import (
    DEFAULT_ROUNDS,
    DEFAULT_STEPS,
    DEFAULT_TOL,
    ROUNDS,
    STEPS,
    TOL,
    check_layer_ranges,
    layer_ranges,
)

Progress = Callable[[int, int, str], None]

@dataclass(frozen=True)
class LearnOptions:
    """Learned matching (GLMC paper): orthogonal maps tuned on training data so that the
    interpolated model at lambda ~ U(lam) has a low loss, early-stopped on a validation
    barrier. Every choice is seeded."""

    steps: int = DEFAULT_STEPS
    lr: float = 0.01
    batch_size: int = 128
    # lambda ~ U(lam): the GLMC paper trains at U(0.4, 0.6); on the default pair that left
    # barriers of 0.10-0.19 at alpha ~ 0.7 for some seeds (the flanks are never trained),
    # U(0.2, 0.8) left 0.05-0.07 for every seed tried (bench/learned.py)
    lam: tuple[float, float] = (0.2, 0.8)
    eval_every: int = 20  # steps between validation barriers
    val_points: int = 5  # alphas on the validation path, endpoints included
    patience: int = 8  # validation checks without improvement before stopping
    seed: int = 0
    residual: bool = True  # learn the residual map (where the architecture has a rotation)
    heads: bool = True  # learn per-head Q-K and V-O rotations

    def __post_init__(self) -> None:
        STEPS.check(self.steps)

@dataclass(frozen=True)
class MatchOptions:
    ffn: bool = True
    attn: bool = True
    rescale: bool = True
    layers: tuple[int, ...] | None = None  # None = every layer
    heads: bool = False  # permute heads before rotating them (needs attn)
    # residual stream map, alternated with the per-layer maps (beyond the seed paper)
    residual: bool = False
    residual_group: str = "auto"  # auto (the architecture's), or a subgroup: permutation, ...
    rounds: int = DEFAULT_ROUNDS  # at most this many alternations of per-layer and residual maps
    tol: float = DEFAULT_TOL  # stop when a round gains less than this fraction of the start
    # hold the FFN maps for 1, 2, 4, ... rounds after an FFN solve moves no unit (faster on
    # large models, another local optimum; rotviz.match.alternating)
    ffn_backoff: bool = False
    act: bool = False  # FFN and residual maps from activations on data (needs data)
    learned: bool = False  # tune the maps on data after weight matching (needs data)
    learn: LearnOptions = field(default_factory=LearnOptions)

    def __post_init__(self) -> None:
        if self.heads and not self.attn:
            raise RotvizError(
                "head permutation (heads) needs attention matching (attn): "
                "turn attn on or heads off"
            )
        ROUNDS.check(self.rounds)
        TOL.check(self.tol)  # also refuses NaN and inf

    @property
    def needs_data(self) -> bool:
        return self.act or self.learned

    @property
    def label(self) -> str:
        flags = (("ffn", self.ffn), ("attn", self.attn), ("rescale", self.rescale),
                 ("heads", self.heads), ("residual", self.residual), ("act", self.act),
                 ("learned", self.learned))
        parts = [p for p, on in flags if on]
        return ",".join(parts) or "none"

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

"""Bounds of every numeric option, in one place: the CLI parses with them, the library checks
with them and the app draws its widgets with them, so a value refused in one is refused in all.

A bound names the option as the command line spells it, so its message tells the user what to
change; values are checked without building anything their size (a `--layers` range is never
expanded before it is known to fit the model).
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

from rotviz.errors import RotvizError


@dataclass(frozen=True)
class Bound:
    """A closed interval [lo, hi] of integers or finite floats, for the option `flag`."""

    flag: str
    lo: float
    hi: float
    integer: bool = True

    @property
    def text(self) -> str:
        kind = "an integer" if self.integer else "a number"
        return f"{kind} from {self.lo:g} to {self.hi:g}"

    def check(self, value: object) -> int | float:
        """`value` if it lies in the bound (bools and non-finite numbers never do)."""
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        ok = ok and math.isfinite(value)
        if ok and self.integer and not isinstance(value, numbers.Integral):
            ok = float(value).is_integer()
        if not ok or not self.lo <= value <= self.hi:
            raise RotvizError(f"{self.flag} must be {self.text}, got {_show(value)}")
        return int(value) if self.integer else float(value)

    def parse(self, text: str) -> int | float:
        """A command-line string, parsed and checked (garbage, NaN, inf and huge refused)."""
        s = str(text).strip()
        try:
            value: int | float = int(s) if self.integer else float(s)
        except ValueError:
            raise RotvizError(f"{self.flag} must be {self.text}, got {_show(text)}") from None
        return self.check(value)


def _show(value: object) -> str:
    s = repr(value) if not isinstance(value, str) else f"'{value}'"
    return s if len(s) <= 40 else s[:37] + "...'"


# alphas on an interpolation path, endpoints included: at least one between them, since a
# barrier (the largest excess over the endpoints' line) from the endpoints alone is 0
POINTS = Bound("--points", 3, 1001)
GRID = Bound("--grid", 3, 201)  # loss-plane points per axis (grid**2 evaluations)
MARGIN = Bound("--margin", 0.0, 10.0, integer=False)  # plane margin, fraction of the span
SPAN = Bound("--span", 1e-6, 1000.0, integer=False)  # slice half-width, in direction units
DIMS = Bound("--dims", 1, 2)  # a slice is a line (1) or a plane (2)
STEPS = Bound("--steps", 1, 100_000)  # learned matching steps
ROUNDS = Bound("--rounds", 1, 10_000)  # alternation rounds per phase
SEQ_LEN = Bound("--seq-len", 2, 1_048_576)  # tokens per text window or labelled example
TOL = Bound("--tol", 0.0, 1.0, integer=False)  # alternation stop: gain / starting objective
STALL = Bound("--stall", 0.0, 1.0, integer=False)  # alternation stop: gain / total gain so far
# seconds an alternation may run (it stops at the end of the round that crosses it): a week
TIME_LIMIT = Bound("--time-limit", 0.0, 604_800.0, integer=False)
REPEATS = Bound("--repeats", 1, 100)  # disjoint data subsets of a barrier
BATCH_SIZE = Bound("--batch-size", 1, 65_536)
BATCHES = Bound("--batches", 1, 100_000)  # merge statistics batches
WEIGHT = Bound("--weight", 0.0, 1.0, integer=False)  # weight of the source in a merge
SWEEP_POINTS = Bound("--points", 2, 41)  # values of a merge parameter swept (one merge each)
# the range of a swept number (each value is checked again against the parameter's own bound)
SWEEP_START = Bound("--start", -10.0, 10.0, integer=False)
SWEEP_STOP = Bound("--stop", -10.0, 10.0, integer=False)
ALPHA = Bound("--alpha", 0.0, 1.0, integer=False)  # RegMean off-diagonal scale
DENSITY = Bound("--density", 0.0, 1.0, integer=False)  # share of a task vector kept (TIES, DARE)
EPSILON = Bound("--epsilon", 0.0, 0.5, integer=False)  # DELLA: spread of keep rates
SCALE = Bound("--scale", -10.0, 10.0, integer=False)  # lambda: scale of the merged task vector
SELECT_TOPK = Bound("--select-topk", 0.0, 1.0, integer=False)  # SCE: share of entries kept
NEARSWAP_T = Bound("--nearswap-t", 0.0, 100.0, integer=False)  # NearSwap: distance scale
RAM_EPSILON = Bound("--ram-epsilon", 0.0, 1.0, integer=False)  # RAM: |d| counted as nonzero
CCA_REG = Bound("--cca-reg", 0.0, 10.0, integer=False)  # CCA Merge: ridge, relative to scale
RAMPLUS_R = Bound("--ramplus-r", 0.0, 10.0, integer=False)  # RAM+: unique entries' gain
RAMPLUS_ALPHA = Bound("--ramplus-alpha", 0.0, 10.0, integer=False)  # RAM+: overlap ratio cap
SEED = Bound("--seed", 0, 2**32 - 1)  # numpy's seed range
PORT = Bound("--port", 1, 65_535)
EXAMPLES = Bound("--examples", 0, 16)  # fixed test inputs whose answers a path records
FRAME_PIXELS = Bound("frame size", 64, 4096)  # an animation frame's width or height (pixels)
FPS = Bound("frames per second", 1, 60)  # an animation's GIF or MP4 frame rate
HESSIAN_TOP = Bound("--top", 1, 50)  # Hessian eigenvalues reported, largest first
HESSIAN_PROBES = Bound("--trace", 0, 100_000)  # Hutchinson probes (0: no trace)
HESSIAN_DENSITY = Bound("--density", 0, 100)  # spectral-density probes (0: no density)
HESSIAN_ITERATIONS = Bound("--iterations", 2, 1_000)  # Lanczos steps at most
HESSIAN_EXAMPLES = Bound("--examples", 1, 100_000)  # examples of the split the loss is on
# geodesic sharpness (Hide & Seek): the perturbation scale rho (metric units: a relative
# size per weight), average-case directions and worst-case ascent steps
GEODESIC_RHO = Bound("--geodesic-rho", 1e-6, 10.0, integer=False)
GEODESIC_SAMPLES = Bound("--geodesic-samples", 1, 1_000)
GEODESIC_STEPS = Bound("--geodesic-steps", 0, 1_000)
SHARPNESS_POINTS = Bound("--points", 2, 101)  # alphas on the path where the Hessian is taken
FLAT_TANGENTS = Bound("--per-layer", 1, 100_000)  # symmetry tangents checked per block and kind
FLAT_STEP = Bound("--step", 1e-6, 3.0, integer=False)  # orbit step s of exp(s E) (flat)
# near zero: |lambda| <= tol * lambda_max (flat's nullity count); float64 resolves ~1e-15
NULLITY_TOL = Bound("--nullity-tol", 1e-15, 0.5, integer=False)
NULLITY_EXACT = Bound("--nullity-exact", 0, 20_000)  # parameters a block is counted exactly to
NULLITY_PROBES = Bound("--nullity-probes", 1, 100)  # SLQ probes per larger block
NULLITY_STEPS = Bound("--nullity-steps", 2, 1_000)  # Lanczos steps per SLQ probe
LR = Bound("--lr", 1e-6, 1.0, integer=False)  # learning rate of a trained bend (curved paths)

# Defaults of the bounded options that have one place to live (MatchOptions, LearnOptions,
# the CLI's help and the app's fields all read them here).
DEFAULT_ROUNDS = 50
DEFAULT_TOL = 1e-6
# a round that gains less than this share of the total gain so far ends the alternation
# (docs/solvers.md, "When the alternation stops": 1% ended the default pair 2.6% above the
# converged distance, since its rounds gain 0.1-1% each for tens of rounds; 0.1% ends it 0.05%
# above, in half the time)
DEFAULT_STALL = 0.001
DEFAULT_STEPS = 80  # learned matching from activation matching (docs/solvers.md)

MAX_LAYERS_TEXT = 200  # characters of a --layers value
_PART = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def layer_ranges(text: str, flag: str = "--layers") -> tuple[tuple[int, int], ...]:
    """'0,2-5' -> ((0, 0), (2, 5)): the syntax of a layer subset, checked without expanding."""
    shown = _show(text)
    if len(text) > MAX_LAYERS_TEXT:
        raise RotvizError(f"{flag} {shown} is longer than {MAX_LAYERS_TEXT} characters: "
                          "give indices or ranges like 0,2-5")
    if not text.strip():
        raise RotvizError(f"malformed {flag} '': give indices or ranges like 0,2-5, "
                          "or leave it out")
    out = []
    for part in text.split(","):
        m = _PART.match(part)
        lo = int(m.group(1)) if m else 0
        hi = int(m.group(2)) if m and m.group(2) is not None else lo
        if m is None or hi < lo:
            raise RotvizError(f"malformed {flag} {shown}: use comma-separated indices or "
                              "ascending ranges like 0,2-5")
        out.append((lo, hi))
    return tuple(out)


def check_layer_ranges(ranges: tuple[tuple[int, int], ...], n_layers: int, text: str,
                       flag: str = "--layers") -> tuple[int, ...]:
    """The sorted layer indices, once every range is known to lie inside the model."""
    if any(hi >= n_layers for _, hi in ranges):
        raise RotvizError(f"{flag} {_show(text)} is out of range: the model has {n_layers} "
                          f"layers (0-{n_layers - 1})")
    return tuple(sorted({i for lo, hi in ranges for i in range(lo, hi + 1)}))


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def memory_size(text: str, flag: str = "--max-memory") -> int:
    """'16GB', '512MiB', '0' -> bytes (decimal units GB, binary GiB; a bare number is bytes)."""
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise RotvizError(f"{flag} must be a size such as 16GB, 512MiB or 0, got {_show(text)}")
    value = float(m.group(1)) * _UNITS[unit]
    if value > 2**60:
        raise RotvizError(f"{flag} must be a size such as 16GB, 512MiB or 0, got {_show(text)}")
    return int(value)
KARCHER_MAX_ITER = Bound("--karcher-max-iter", 0, 10_000)  # Karcher mean's steps at most
KARCHER_TOL = Bound("--karcher-tol", 0.0, 1.0, integer=False)  # Karcher mean's stop (radians)
# ZipIt!: blocks zipped (-1: every block and the head; 0: none, the two models side by side),
# the factor a merged feature's similarities take per merge, and the share of within-model merges
ZIP_LAYERS = Bound("--zip-layers", -1, 100_000)
ZIP_ALPHA = Bound("--zip-alpha", 0.0, 1.0, integer=False)
ZIP_BETA = Bound("--zip-beta", 0.0, 1.0, integer=False)

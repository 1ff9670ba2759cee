"""Every merge method rotviz knows, as one record each (like rotviz.symmetry.registry).

A method is a `MergeMethod`: its name, label and help, its declared parameters (bounded by
rotviz.limits), the statistics it needs of each model (none for the simple average) and how
it combines one tensor. The CLI's `merge --method` choices and options, the app's method
picker and widgets, the exports and `rotviz.merge` all read `METHODS`, so a new method is
one module that calls `register`.

Statistics are always taken on the models as matched (the source's in its matched basis):
statistics taken before matching are in the wrong basis afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rotviz.errors import RotvizError
from rotviz.params import Param
from rotviz.records import Records

if TYPE_CHECKING:
    import torch

    from rotviz.models import Loaded

    Tensor = torch.Tensor


@dataclass(frozen=True)
class MergeJob:
    """What a method's `combine` sees besides the two tensors: the architecture, the weights
    (1 - w, w) of anchor and source, each model's statistics, its parameter values and what
    `prepare` made of the architecture."""

    loaded: Loaded
    weights: tuple[float, float]
    anchor_stats: Mapping[str, Tensor] | None
    source_stats: Mapping[str, Tensor] | None
    params: Mapping[str, Any]
    prepared: Any = None


Statistics = Callable[..., "Mapping[str, Tensor]"]
# statistics(loaded, state, split, device, seed=, progress=, **params) -> name -> tensor


@dataclass(frozen=True)
class MergeMethod:
    """One merge method and everything the rest of rotviz says about it."""

    name: str  # --method value, app choice and JSON "method"
    label: str  # plain words for legends and pickers
    help: str  # one line: what it does, with its citation
    combine: Callable[[MergeJob, str, Tensor, Tensor], Tensor | None]  # None: simple average
    params: tuple[Param, ...] = ()
    statistics: Statistics | None = None  # what it needs of each model, on the stats split
    prepare: Callable[[Loaded], Any] | None = None  # once per merge, from the architecture
    at_size: bool = False  # combines tensor by tensor without statistics: can run streamed
    extra: tuple[str, ...] = field(default=())  # parameter names reported under "params"

    @property
    def needs_statistics(self) -> bool:
        return self.statistics is not None


METHODS: Records[MergeMethod] = Records("merge method", ("simple", "fisher", "regmean"))


def register(method: MergeMethod) -> MergeMethod:
    """Add a method (its name must be new); returns it, so a module can keep it."""
    return METHODS.register(method)


def methods() -> tuple[MergeMethod, ...]:
    """Every registered method, in the order registered (built-ins first: rotviz.merging
    registers them when it is imported)."""
    return METHODS.all()


def names() -> tuple[str, ...]:
    return tuple(m.name for m in methods())


def method(name: str) -> MergeMethod:
    """The method called `name` (case and spaces ignored), or a one-line error."""
    found = METHODS.get(str(name).strip().lower())
    if found is not None:
        return found
    raise RotvizError(f"unknown merge method '{name}': use one of {', '.join(names())}")


def all_params() -> tuple[Param, ...]:
    """Every parameter any method declares, once each (first declaration wins)."""
    seen: dict[str, Param] = {}
    for m in methods():
        for p in m.params:
            seen.setdefault(p.name, p)
    return tuple(seen.values())


def users(param: str) -> tuple[str, ...]:
    """The methods that declare parameter `param`."""
    return tuple(m.name for m in methods() if any(p.name == param for p in m.params))


def check_weight(weight: float) -> float:
    if not 0.0 <= float(weight) <= 1.0:
        raise RotvizError(f"merge weight must be in [0, 1] (0 = anchor, 1 = source), got {weight}")
    return float(weight)

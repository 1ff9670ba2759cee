"""Every merge method rotviz knows, as one record each (like rotviz.symmetry.registry).

A method is a `MergeMethod`: its name, label and help, its declared parameters (bounded by
rotviz.limits), the statistics it needs of each model (none for the simple average), whether
it needs a base model (the common ancestor task vectors are taken from), and how it combines
one tensor of N >= 2 models (the anchor first) with their weights and the base's tensor:
whole (`combine`), or a slice of rows at a time (`rows`, rotviz.merging.rows: the methods
that run at size, which never hold a float64 copy of a whole tensor). The
CLI's `merge --method` choices and options, the app's method picker and widgets, the exports
and `rotviz.merge` all read `METHODS`, so a new method is one module that calls `register`.

Statistics are always taken on the models as matched (the source's in its matched basis):
statistics taken before matching are in the wrong basis afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rotviz.errors import RotvizError
from rotviz.params import Param
from rotviz.records import Records

if TYPE_CHECKING:
    import torch

    from rotviz.merging.rows import RowSource
    from rotviz.sources.loading import Loaded

    Tensor = torch.Tensor


@dataclass(frozen=True)
class MergeJob:
    """What a method's `combine` sees besides the tensors: the architecture, the weights of
    the N models (anchor first; (1 - w, w) for a pair), each model's statistics (None for a
    method without), its parameter values and what `prepare` made of the architecture."""

    loaded: Loaded
    weights: tuple[float, ...]
    stats: tuple[Mapping[str, Tensor], ...] | None
    params: Mapping[str, Any]
    prepared: Any = None

    @property
    def anchor_stats(self) -> Mapping[str, Tensor] | None:
        return None if self.stats is None else self.stats[0]

    @property
    def source_stats(self) -> Mapping[str, Tensor] | None:
        return None if self.stats is None else self.stats[1]


Statistics = Callable[..., "Mapping[str, Tensor]"]
# statistics(loaded, state, split, device, seed=, progress=, **params) -> name -> tensor

# combine(job, name, tensors, base) -> the merged tensor, or None for the simple average:
# `tensors` holds one tensor per model (the anchor first), `base` the base model's (None
# without a base). Every tensor is floating; none may be modified.
Combine = Callable[["MergeJob", str, "Sequence[Tensor]", "Tensor | None"], "Tensor | None"]

# rows(job, name, source) -> the merged tensor's slices of rows, in order, in float64:
# `source` (rotviz.merging.rows.RowSource) reads a slice of rows of every model's tensor and
# the base's; what the method needs of the whole tensor (a threshold, norms) it gathers in
# passes over the slices before it yields the first. Elementwise methods declare this, and
# then run at size (rotviz.atsize.points) and merge whole tensors through it too.
RowCombine = Callable[["MergeJob", str, "RowSource"], "Iterator[Tensor]"]


@dataclass(frozen=True)
class Built:
    """A model a method builds from whole blocks of the models (`MergeMethod.assemble`)
    rather than tensor by tensor: its state dict (the inputs' own tensors, never to be
    modified), its config where the architecture differs from the anchor's (another depth,
    other per-layer settings; None: the anchor's), and where each of its blocks came from,
    (model, block) with 0 the anchor and 1 the source."""

    state: dict[str, Tensor]
    config: dict[str, Any] | None
    blocks: tuple[tuple[int, int], ...]


# assemble(job, states) -> the model built from the models' whole blocks (the anchor first);
# a method declaring it (passthrough) may change the depth: only a caller that evaluates and
# writes a model of its own config (rotviz.analysis.merges.merge_on) takes such a model
Assemble = Callable[["MergeJob", "Sequence[Mapping[str, Tensor]]"], Built]


@dataclass(frozen=True)
class Mergekit:
    """How one rotviz method is said to mergekit (0.1.5; rotviz.merging.mergekit).

    `method`: mergekit's name. `base`: which model is mergekit's `base_model` ("anchor",
    "base": the --base model, "given": the --base model where one is given, or None).
    `weight`: where rotviz's weight w goes ("models":
    weights 1 - w and w per model; "t": SLERP's t = w; None: not written, mergekit taking the
    plain mean, so only w = 0.5 says the same). `shared`: rotviz parameter -> mergekit
    parameter written once under `parameters`; `per_model`: the same, written under each
    merged model (not the base). `slices`, `ends`: see below. `values`: rotviz
    parameter -> {rotviz value: mergekit value}, a value missing there being refused; a
    mergekit value of None writes nothing (mergekit's own default is the same). `fixed`:
    mergekit parameters always written, so the file says what it relies on rather than a
    default."""

    method: str
    base: str | None = None
    weight: str | None = "models"
    shared: Mapping[str, str] = field(default_factory=dict)
    per_model: Mapping[str, str] = field(default_factory=dict)
    values: Mapping[str, Mapping[Any, Any]] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    # layer stacking (passthrough): the rotviz parameter holding the slices, written as
    # mergekit's `slices:` in place of `models:`, and the one saying where the embeddings and
    # head come from ("" for a method that merges tensor by tensor)
    slices: str = ""
    ends: str = ""


@dataclass(frozen=True)
class MergeMethod:
    """One merge method and everything the rest of rotviz says about it."""

    name: str  # --method value, app choice and JSON "method"
    label: str  # plain words for legends and pickers
    help: str  # one line: what it does, with its citation
    combine: Combine | None = None  # one whole tensor (a method without `rows`)
    params: tuple[Param, ...] = ()
    statistics: Statistics | None = None  # what it needs of each model, on the stats split
    prepare: Callable[[Loaded], Any] | None = None  # once per merge, from the architecture
    rows: RowCombine | None = None  # a slice of rows at a time: it then runs at size
    extra: tuple[str, ...] = field(default=())  # parameter names reported under "params"
    needs_base: bool = False  # True: needs a base model; False: a base given is refused
    # True: merges about a base model where one is given, and the models themselves without
    # (mergekit's optional base: nuslerp, multislerp); needs_base must then be False
    base_optional: bool = False
    max_models: int | None = None  # the most models it combines (None: any N >= 2)
    # False: the models' weights do not enter the merge (it weighs entries by rules of its
    # own: sce, ram, nearswap, arcee_fusion), so --weight changes nothing and a sweep of it
    # would draw a flat line: `sweepable` leaves it out
    weighted: bool = True
    # how mergekit says the same merge (rotviz.merging.mergekit writes its YAML); None: no
    # mergekit equivalent (fisher, regmean), --mergekit-config refuses the method
    mergekit: Mergekit | None = None
    order: int = 1000  # place in menus and help (built-ins 10-990; plug-ins after)
    # builds the model from whole blocks instead of combining tensors (passthrough's layer
    # stacking); such a method has neither `combine` nor `rows`
    assemble: Assemble | None = None
    # checks its parameter values together before any model is read (one-line RotvizError)
    check: Callable[[Mapping[str, Any]], None] | None = None
    # a method that merges whole models, not tensor by tensor (ZipIt!: its zips span every
    # layer): whole(loaded, states, stats, weights, params) -> the merged state dict
    whole: Callable[..., Any] | None = None
    # a method whose merge may be no single parameter set of the architecture (ZipIt!'s
    # partial zip): evaluate(loaded, states, stats, weights, params, evaluator) -> (loss,
    # accuracy) of that merge, or None where it is one parameter set (then evaluated as such)
    evaluate: Callable[..., Any] | None = None

    @property
    def needs_statistics(self) -> bool:
        return self.statistics is not None

    @property
    def at_size(self) -> bool:
        """Merges a slice of rows at a time without statistics: it can run streamed."""
        return self.rows is not None and self.statistics is None

    def merge(self, job: MergeJob, name: str, tensors: Sequence[Tensor],
              base: Tensor | None) -> Tensor | None:
        """One merged tensor in the base's dtype (else the first tensor's), or None where
        `combine` declines (the simple average is then taken): by `rows` where the method
        has them, read from the tensors a slice at a time."""
        if self.assemble is not None:
            raise RotvizError(f"--method {self.name} builds a model from whole blocks, not "
                              "tensor by tensor; merge whole models with it")
        if self.rows is not None:
            from rotviz.merging.rows import whole

            rows = self.rows
            return whole(lambda src: rows(job, name, src), tensors, base)
        assert self.combine is not None
        return self.combine(job, name, tensors, base)


METHODS: Records[MergeMethod] = Records("merge method")


def register(method: MergeMethod) -> MergeMethod:
    """Add a method (its name must be new, and it must say how it combines: `combine`,
    `rows` or `assemble`); returns it, so a module can keep it."""
    if method.combine is None and method.rows is None and method.assemble is None:
        raise ValueError(f"merge method {method.name} gives neither combine, rows nor "
                         "assemble")
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


def sweepable(m: MergeMethod) -> tuple[str, ...]:
    """The numbers of method `m` a sweep can turn (rotviz.measures.merge_sweep.sweep_on): the
    weight where it enters the merge (`weighted`), then its own real-valued parameters with a
    bound (integers such as batch counts are not swept). Empty for a method with neither
    (arcee_fusion): nothing of it can be swept."""
    own = [p.name for p in m.params
           if p.bound is not None and not p.bound.integer and p.name != "weight"]
    return ("weight", *own) if m.weighted else tuple(own)


def check_weight(weight: float) -> float:
    if not 0.0 <= float(weight) <= 1.0:
        raise RotvizError(f"merge weight must be in [0, 1] (0 = anchor, 1 = source), got {weight}")
    return float(weight)


def check_base(m: MergeMethod, has_base: bool) -> None:
    """A method that needs a base is refused without one, and one that takes none is refused
    with one (one line each)."""
    if m.needs_base and not has_base:
        raise RotvizError(f"--method {m.name} needs --base MODEL: the model the merged ones "
                          "were fine-tuned from (task vectors are taken from it); add --base")
    if has_base and not (m.needs_base or m.base_optional):
        based = " or ".join(x.name for x in methods() if x.needs_base or x.base_optional)
        raise RotvizError(f"--method {m.name} takes no --base (it combines the models "
                          f"themselves); drop --base, or use --method {based}")


def check_models(m: MergeMethod, n: int) -> None:
    """At least two models, and no more than the method combines (one line otherwise)."""
    if n < 2:
        raise RotvizError(f"merging needs at least two models, got {n}")
    if m.max_models is not None and n > m.max_models:
        raise RotvizError(f"--method {m.name} combines {m.max_models} models, got {n}: give "
                          "two, or use another method")


def merges_at_size() -> str:
    """The merge methods that run at size (their record's `rows`), in words, for a page or a
    refusal: found in the registry, so a new method is named without a list to update."""
    found = [m.label for m in methods() if m.at_size]
    return ", ".join(found[:-1]) + f" or {found[-1]}" if len(found) > 1 else "".join(found)


def table_methods(has_base: bool) -> list[str]:
    """The methods a fusion table (and the Merge page) runs by default: every registered one,
    less those that need a base when none is given and those that build whole models of
    their own (passthrough stacks blocks; ZipIt! zips features): they run when named."""
    return [m.name for m in methods() if (has_base or not m.needs_base)
            and m.assemble is None and m.whole is None]

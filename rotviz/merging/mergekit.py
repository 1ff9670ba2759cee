"""The mergekit configuration of a rotviz merge: a YAML file that `mergekit-yaml` (mergekit
0.1.5) reads to merge the anchor and the source as rotviz matched it, at scale.

rotviz aligns the source onto the anchor (a symmetry of the network: the function is kept),
then merges. mergekit merges checkpoints as they are, so it is given the matched source
written as a model folder; the YAML names the anchor's folder and that folder by absolute
path. `MERGEKIT` below is the table from each rotviz method to mergekit's method and
parameters; a method that is not in it (fisher, regmean: they need statistics of the models,
which mergekit has no counterpart for) is refused in one line.

The weights: rotviz merges (1 - w) anchor + w source. mergekit's `linear` takes a weight per
model and, by default (`normalize: true`), divides by their sum; the weights written sum to
1, so normalising changes nothing, and the file says `normalize: true` explicitly. SLERP's
`t` is the source's weight, with the anchor as mergekit's base model (t = 0 gives the
anchor). The methods about a base model (task arithmetic, TIES, DARE, Model Stock) take it
as mergekit's `base_model`, unmatched, as rotviz does. Model Stock takes no weights in
mergekit (a plain mean), so only rotviz's --weight 0.5 says the same and another is refused.

This module imports nothing from mergekit: the file is plain YAML (PyYAML, which rotviz's
dependencies transformers and datasets require).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rotviz.errors import RotvizError

MERGEKIT_VERSION = "0.1.5"  # the version whose definitions the table follows
REFUSED = object()  # a rotviz value with no mergekit counterpart (in `Entry.values`)


@dataclass(frozen=True)
class Entry:
    """How one rotviz method is said to mergekit.

    `base`: which model is mergekit's `base_model` ("anchor", "base": the --base model, or
    None). `weight`: where rotviz's weight w goes ("models": weights 1 - w and w per model;
    "t": SLERP's t = w; None: not written, mergekit taking the plain mean, so only w = 0.5
    says the same). `shared`: rotviz parameter -> mergekit parameter
    written once under `parameters`; `per_model`: the same, written under each merged model
    (not the base). `values`: rotviz parameter -> {rotviz value: mergekit value}, a value
    missing there being refused; a mergekit value of None writes nothing (mergekit's own
    default is the same). `fixed`: mergekit parameters always written, so the file says what
    it relies on rather than a default."""

    method: str
    base: str | None = None
    weight: str | None = "models"
    shared: Mapping[str, str] = field(default_factory=dict)
    per_model: Mapping[str, str] = field(default_factory=dict)
    values: Mapping[str, Mapping[Any, Any]] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)


_DARE = {"shared": {"scale": "lambda"}, "per_model": {"density": "density"}}
# DARE's rescaling: mergekit rescales the kept entries to the task vector's L1 norm (true) or
# not at all; the paper's 1 / density has no mergekit switch
_RESCALE = {"rescale": {"l1": True, "none": False}}

MERGEKIT: dict[str, Entry] = {
    "simple": Entry("linear", fixed={"normalize": True}),
    "slerp": Entry("slerp", base="anchor", weight="t"),
    "task_arithmetic": Entry("task_arithmetic", base="base", shared={"scale": "lambda"},
                             fixed={"normalize": False}),
    # mergekit's TIES elects signs by the weighted sum (its only consensus); "count" has none
    # TIES divides by the weights of the agreeing vectors (normalize on), DARE does not
    "ties": Entry("ties", base="base", shared={"scale": "lambda"},
                  per_model={"density": "density"}, values={"consensus": {"sum": None}},
                  fixed={"normalize": True}),
    "dare_linear": Entry("dare_linear", base="base", shared=_DARE["shared"],
                         per_model=_DARE["per_model"], values=_RESCALE,
                         fixed={"normalize": False}),
    "dare_ties": Entry("dare_ties", base="base", shared=_DARE["shared"],
                       per_model=_DARE["per_model"],
                       values={**_RESCALE, "consensus": {"sum": None}},
                       fixed={"normalize": False}),
    "model_stock": Entry("model_stock", base="base", weight=None,
                         fixed={"filter_wise": False}),
}


def with_mergekit(registered: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The rotviz methods that have a mergekit equivalent (those of `registered`, if given)."""
    return tuple(n for n in MERGEKIT if registered is None or n in registered)


def entry(method: str, registered: tuple[str, ...] | None = None) -> Entry:
    """The table's entry of `method`, or a one-line refusal naming those that have one."""
    found = MERGEKIT.get(method)
    if found is None:
        raise RotvizError(f"--method {method} has no mergekit equivalent; --mergekit-config "
                          f"takes {', '.join(with_mergekit(registered))}")
    return found


def _value(e: Entry, name: str, value: Any) -> Any:
    table = e.values.get(name)
    if table is None:
        return value
    if value not in table:
        takes = ", ".join(str(v) for v in table)
        raise RotvizError(f"--{name.replace('_', '-')} {value} has no mergekit equivalent for "
                          f"{e.method}; use {takes} with --mergekit-config")
    return table[value]


def check(method: str, values: Mapping[str, Any], registered: tuple[str, ...] | None = None,
          base: bool = False, weight: float = 0.5) -> Entry:
    """Refuse, before any work, a method or parameter value mergekit cannot express, or a
    method about a base model without one; returns the method's entry."""
    e = entry(method, registered)
    if e.base == "base" and not base:
        raise RotvizError(f"mergekit's {e.method} merges about a base model: give --base")
    if e.weight is None and float(weight) != 0.5:
        raise RotvizError(f"mergekit's {e.method} takes the plain mean of the models (no "
                          f"weights), which is rotviz's at --weight 0.5 only; use --weight 0.5 "
                          "with --mergekit-config")
    for name, v in values.items():
        _value(e, name, v)
    return e


def _number(x: Any) -> Any:
    """A plain Python number (a float's shortest repr), so the YAML reads as written."""
    return float(x) if isinstance(x, float) else x


def mergekit_config(method: str, values: Mapping[str, Any], weight: float, anchor: Path,
                    source: Path, dtype: str = "float32", base: Path | None = None,
                    note: str = "") -> str:
    """The YAML text of a mergekit configuration that merges the model folders `anchor` and
    `source` (the matched source) as rotviz's `method` does with weight `weight` of the
    source and its parameter `values`; `base` is the base model's folder where the method
    needs one. `dtype` is the checkpoint's floating dtype (written as mergekit's out_dtype;
    it computes in float32). `note` is a comment line on what wrote it."""
    import yaml

    e = check(method, values, base=base is not None, weight=weight)
    w = float(weight)
    shared: dict[str, Any] = dict(e.fixed)
    per_model: dict[str, Any] = {}
    for name, v in values.items():
        v = _value(e, name, v)
        if name in e.shared and v is not None:
            shared[e.shared[name]] = _number(v)
        elif name in e.per_model and v is not None:
            per_model[e.per_model[name]] = _number(v)
        elif name in e.values and v is not None:
            shared[name] = v
    if e.weight == "t":
        shared["t"] = w
    models = []
    for folder, share in ((anchor, 1.0 - w), (source, w)):
        params = dict(per_model)
        if e.weight == "models":
            params = {"weight": share, **params}
        models.append({"model": str(folder), **({"parameters": params} if params else {})})
    body: dict[str, Any] = {"merge_method": e.method}
    base_folder = {"anchor": anchor, "base": base}.get(e.base or "")
    if base_folder is not None:
        body["base_model"] = str(base_folder)
    body["models"] = models
    if shared:
        body["parameters"] = shared
    body["dtype"] = "float32"
    body["out_dtype"] = dtype
    head = (f"# mergekit {MERGEKIT_VERSION} configuration written by rotviz{note}\n"
            "# Run: mergekit-yaml THIS_FILE OUTPUT_FOLDER (models by absolute path)\n")
    return head + yaml.safe_dump(body, sort_keys=False, default_flow_style=False)


def matched_folder(config: Path) -> Path:
    """The folder written beside a configuration file for the matched source mergekit reads:
    `merge.yaml` -> `merge-matched` (the file's name less its suffix, plus -matched)."""
    return config.with_name(f"{config.stem}-matched")

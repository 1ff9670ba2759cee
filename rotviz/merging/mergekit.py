"""The mergekit configuration of a rotviz merge: a YAML file that `mergekit-yaml` (mergekit
0.1.5) reads to merge the anchor and the source as rotviz matched it, at scale.

rotviz aligns the source onto the anchor (a symmetry of the network: the function is kept),
then merges. mergekit merges checkpoints as they are, so it is given the matched source
written as a model folder; the YAML names the anchor's folder and that folder by absolute
path. Each method's record says how mergekit says it (`MergeMethod.mergekit`, a
`Mergekit`: its name and parameters); a method without one (fisher, regmean: they need
statistics of the models, which mergekit has no counterpart for) is refused in one line.

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
from pathlib import Path
from typing import Any

from rotviz.errors import RotvizError
from rotviz.merging.registry import Mergekit

MERGEKIT_VERSION = "0.1.5"  # the version whose definitions the table follows


def table() -> dict[str, Mergekit]:
    """Each registered method's mergekit equivalent, by rotviz name (its record's
    `mergekit`; the methods without one are left out)."""
    from rotviz.merging import methods

    return {m.name: m.mergekit for m in methods() if m.mergekit is not None}


def with_mergekit(registered: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The rotviz methods that have a mergekit equivalent (those of `registered`, if given)."""
    return tuple(n for n in table() if registered is None or n in registered)


def entry(method: str, registered: tuple[str, ...] | None = None) -> Mergekit:
    """The record's mergekit entry of `method`, or a one-line refusal naming the methods that
    have one."""
    found = table().get(method)
    if found is None:
        raise RotvizError(f"--method {method} has no mergekit equivalent; --mergekit-config "
                          f"takes {', '.join(with_mergekit(registered))}")
    return found


def _value(e: Mergekit, name: str, value: Any) -> Any:
    table = e.values.get(name)
    if table is None:
        return value
    if value not in table:
        takes = ", ".join(str(v) for v in table)
        raise RotvizError(f"--{name.replace('_', '-')} {value} has no mergekit equivalent for "
                          f"{e.method}; use {takes} with --mergekit-config")
    return table[value]


def check(method: str, values: Mapping[str, Any], registered: tuple[str, ...] | None = None,
          base: bool = False, weight: float = 0.5) -> Mergekit:
    """Refuse, before any work, a method or parameter value mergekit cannot express, or a
    method about a base model without one; returns the method's entry."""
    e = entry(method, registered)
    if e.base == "base" and not base:
        raise RotvizError(f"mergekit's {e.method} merges about a base model: give --base")
    if e.weight is None and float(weight) != 0.5:
        raise RotvizError(f"mergekit's {e.method} takes no weights (the plain mean of the "
                          f"models, or weights of its own), which is rotviz's at --weight 0.5 "
                          "only; use --weight 0.5 with --mergekit-config")
    for name, v in values.items():
        _value(e, name, v)
    if e.slices:
        _slices(e, values)
    return e


def _slices(e: Mergekit, values: Mapping[str, Any]):
    """The slices a layer-stacking method writes, refused where mergekit would build another
    model: no slices given (mergekit names every range), or the anchor's embeddings and head
    kept under slices that do not start and end with the anchor's blocks (mergekit takes
    the embeddings from the first slice's model and the final norm and head from the
    last's)."""
    from rotviz.merging.slices import parse

    text = str(values.get(e.slices) or "").strip()
    if not text:
        raise RotvizError(f"mergekit's {e.method} names every layer range: give --slices with "
                          "--mergekit-config, e.g. --slices a:0-2,b:1-2")
    slices = parse(text)
    if values.get(e.ends, "anchor") == "anchor" and (slices[0].model or slices[-1].model):
        raise RotvizError("mergekit takes the embeddings from the first slice's model and the "
                          "final norm and head from the last's: use --passthrough-ends slices, "
                          "or slices that start and end with the anchor's (a:...)")
    return slices


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
    head = (f"# mergekit {MERGEKIT_VERSION} configuration written by rotviz{note}\n"
            "# Run: mergekit-yaml THIS_FILE OUTPUT_FOLDER (models by absolute path)\n")
    if e.slices:  # layer stacking: the ranges, each of one model, in place of `models:`
        folders = (anchor, source)
        stacked = [{"sources": [{"model": str(folders[s.model]),
                                 "layer_range": [s.start, s.stop]}]}
                   for s in _slices(e, values)]
        body = {"merge_method": e.method, "slices": stacked, "dtype": "float32",
                "out_dtype": dtype}
        return head + yaml.safe_dump(body, sort_keys=False, default_flow_style=False)
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
    base_folder = {"anchor": anchor, "base": base, "given": base}.get(e.base or "")
    if base_folder is not None:
        body["base_model"] = str(base_folder)
    body["models"] = models
    if shared:
        body["parameters"] = shared
    body["dtype"] = "float32"
    body["out_dtype"] = dtype
    return head + yaml.safe_dump(body, sort_keys=False, default_flow_style=False)


def matched_folder(config: Path) -> Path:
    """The folder written beside a configuration file for the matched source mergekit reads:
    `merge.yaml` -> `merge-matched` (the file's name less its suffix, plus -matched)."""
    return config.with_name(f"{config.stem}-matched")

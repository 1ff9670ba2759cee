"""Measurements as registered records (rotviz.measures.registry), and `measure`, the library
call every one of them shares:

    from rotviz import load_model, match_endpoints, measure
    ends = match_endpoints(load_model("zoo:vit-digits-s3"), load_model("zoo:vit-digits-s6"), "seed")
    curve = measure("barrier", ends, split, points=11)

Every module of this package that calls `register` is found and registered when the package
is imported (`rotviz --help` lists them, by each record's `order`): a new measurement is one
module dropped into rotviz/measures/, and no list names it. Training and spawn take series of
checkpoints, not endpoints: `measure("training", TwoSeries.read([A, B], ["none", "seed"]),
split)` (rotviz.analysis.training); many takes N models: `measure("many", [M1, M2, M3],
split, match=["seed"])` (rotviz.analysis.many); the symmetry ladder takes the pair, one
matching per rung: `measure("ladder", [A, B], split)` (rotviz.analysis.ladder).
"""

from __future__ import annotations

from typing import Any

from rotviz.measures.registry import (
    Context,
    Measurement,
    Section,
    measurement,
    measurements,
    refuse_heads,
    register,
    sections,
)
from rotviz.params import Param


def _discover() -> None:
    """Import every module of this package: each one that defines a record registers it
    (a new measurement is one module dropped here; no list names them). Modules whose name
    starts with an underscore are skipped."""
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_discover()


__all__ = ["Context", "Measurement", "Param", "Section", "measure", "measurement",
           "measurements", "refuse_heads", "register", "sections"]


def measure(name: str, ends: Any, split: Any = None, device: Any = "cpu",
            progress: Any = None, **params: Any) -> Any:
    """measure(name, endpoints, split, device="cpu", **params) -> the record's result

    Run the registered measurement `name` on endpoints (held in memory, or streamed: then
    its at-size implementation, or a one-line refusal), its parameters checked against
    their bounds; those not given keep their defaults. A record that takes other inputs
    (training, spawn: `Measurement.inputs`) takes their value, or their references as a
    list with `match=[SPEC, ...]` (default none and seed)."""
    from rotviz.devices import resolve_device
    from rotviz.errors import RotvizError

    m = measurement(name)
    if m.inputs is not None and isinstance(ends, (list, tuple)):  # references, not yet read
        from rotviz.confine import ANYWHERE

        ends = m.inputs.read(tuple(map(str, ends)), params.pop("match", None), ANYWHERE)
    values = m.values(params)
    if m.inputs is not None and m.inputs.check is not None:
        m.inputs.check(ends, values, {k for k, v in params.items() if v is not None})
    if m.data and split is None:
        raise RotvizError(f"{name} evaluates the models: give it a split (rotviz.evaluation."
                          "split_for)")
    report = getattr(ends, "report", None)
    if getattr(report, "widths", None) and not m.narrower:  # a narrower source, embedded
        able = ", ".join(r.name for r in measurements() if r.narrower)
        raise RotvizError(f"the source's FFN is narrower than the anchor's, and {name} also "
                          f"reads the source as it is, in its own width; use {able}")
    refuse_heads(m, ends)
    ctx = Context(split if m.data else None, resolve_device(device), progress=progress)
    if getattr(ends, "at_size", False):
        why = m.why_not_at_size()
        if why:
            raise RotvizError(f"the pair is read block by block, and {why}")
        if m.at_size_check is not None:
            m.at_size_check(values)
        return m.at_size(ends, ctx, values)
    return m.run(ends, ctx, values)

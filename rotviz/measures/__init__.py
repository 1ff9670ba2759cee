"""Measurements as registered records (rotviz.measures.registry); `rotviz.measure` (the one
runner, rotviz.runner) runs any of them:

    from rotviz import load_model, match_endpoints, measure
    ends = match_endpoints(load_model("zoo:vit-digits-s3"), load_model("zoo:vit-digits-s6"), "seed")
    curve = measure("barrier", ends, split, points=11)

Every module of this package that calls `register` is found and registered when the package
is imported (`rotviz --help` lists them, by each record's `order`): a new measurement is one
module dropped into rotviz/measures/, and no list names it. Training and spawn take series of
checkpoints, not endpoints: `measure("training", TwoSeries.read([A, B], ["none", "seed"]),
split)` (rotviz.measures.training); many takes N models: `measure("many", [M1, M2, M3],
split, match=["seed"])` (rotviz.measures.many); the symmetry ladder takes the pair, one
matching per rung: `measure("ladder", [A, B], split)` (rotviz.measures.ladder).
"""

from __future__ import annotations

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
from rotviz.records import discover

discover(__name__, __path__)  # every module here that registers a record


__all__ = ["Context", "Measurement", "Param", "Section", "measurement", "measurements",
           "refuse_heads", "register", "sections"]


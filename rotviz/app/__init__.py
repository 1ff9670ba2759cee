"""The app-facing library: what the Streamlit pages (pages/) call, and nothing of Streamlit.

Layers, top to bottom:
- pages/ (app.py, pages/*.py, pages/common.py): widgets, caches, locks, progress boxes,
  Stop. The only code that imports streamlit.
- rotviz.app (this package), with rotviz.appconfig, rotviz.explore and rotviz.plots: the
  app's computations as plain data in, plain data out (`compute`), and the few facts the
  pages need from the engine, under names of their own.
- the engine (matching, alternating, residual, landscape, fusion, models, ...).

Importing rotviz.app costs no torch, transformers or scipy import: each function imports
what it needs when called. Names a page needs from the engine are offered here as functions
(`ended_by_cap`, `group_text`, `pick_device`, ...), or as lazy constants (FUNCTION_TOLERANCE).
"""

from __future__ import annotations

from typing import Any

from rotviz.app.compute import (
    BARRIER_POINTS,
    COMPUTE,
    COMPUTE_MODULES,
    DEFAULT_LEARN_STEPS,
    Cancelled,
    Progress,
    Resources,
    barrier_defaults,
    card,
    check_pair,
    circuits,
    curve,
    curve_cfg,
    ended_by_cap,
    fusion,
    group_text,
    layers_of,
    learn,
    load_eval,
    load_full,
    load_test_split,
    match,
    matched,
    matched_key,
    n_layers,
    n_params,
    pair,
    plane,
    residual_why,
    run,
    spec_cfg,
    warm_up,
)
from rotviz.devices import device_choices, pick_device
from rotviz.errors import RotvizError
from rotviz.limits import MAX_LAYERS_TEXT
from rotviz.symmetry.registry import BY_NAME, SYMMETRIES

__all__ = [
    "BARRIER_POINTS", "BY_NAME", "COMPUTE", "COMPUTE_MODULES", "DEFAULT_LEARN_STEPS",
    "FUNCTION_TOLERANCE", "MAX_LAYERS_TEXT", "SYMMETRIES", "Cancelled", "Progress", "Resources",
    "RotvizError", "barrier_defaults", "card", "check_pair", "circuits", "curve", "curve_cfg",
    "device_choices", "ended_by_cap", "fusion", "group_text", "layers_of", "learn", "load_eval",
    "load_full", "load_test_split", "match", "matched", "matched_key", "n_layers", "n_params",
    "pair", "pick_device", "plane", "residual_why", "run", "spec_cfg", "warm_up",
]


def __getattr__(name: str) -> Any:
    """FUNCTION_TOLERANCE (the float32 function check's, rotviz.match.pipeline) on first use, so
    importing this package imports no torch."""
    if name == "FUNCTION_TOLERANCE":
        from rotviz.match.pipeline import FUNCTION_TOLERANCE

        return FUNCTION_TOLERANCE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

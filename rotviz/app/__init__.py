"""The app-facing library: what the Streamlit pages (rotviz/ui/) call, and nothing of
Streamlit.

Layers, top to bottom:
- rotviz.ui: app.py (the launcher), main.py, pages/ and the helpers the pages share (sidebar,
  runtime (caches, locks, start-up), run (gating, checks, warm-up), show (progress boxes,
  Stop, badges, exports) and section (a record's section, drawn from what it declares)).
  The only code that imports streamlit.
- rotviz.app (this package) and rotviz.plots: the app's computations as plain data in,
  plain data out (`compute`, re-exported here; a measurement runs through the one runner,
  rotviz.runner, as on the command line), and its modules named for what they hold:
  `resources` (models, splits and matched sources, the configurations), `budget` (a pair
  over the memory budget),
  `roots` (where models and data may come from), `cache` (the result cache and the
  configuration hashes), `export` (JSON, CSV, figures, zips), `devices` (the device picker
  and badge), `specs` (the matching SPECs offered), `summaries` (model cards, match
  summaries and their tables), `demos` (the Learn page) and `figures` (the pages' figures
  beyond a record's own, in the page's Style). Every registered measurement
  (rotviz.measures) is a computation of `run`, by its name.
- the engine (matching, alternating, residual, landscape, fusion, models, ...). A page that
  needs an engine name imports it from its home, inside the function that uses it.

Importing rotviz.app costs no torch, transformers or scipy import: each function imports
what it needs when called, so a page paints before the engine loads.
"""

from __future__ import annotations

from rotviz.app.budget import at_size, check_pair_at_size, gb, params_in, residual_why
from rotviz.app.compute import (
    BARRIER_POINTS,
    COMPUTE,
    WHOLE,
    barrier_defaults,
    card,
    check_pair,
    inputs_cfg,
    kinds,
    learn,
    match,
    measure,
    measure_cfg,
    measure_pair,
    needs_data,
    run,
    scored_pair,
)
from rotviz.app.resources import (
    COMPUTE_MODULES,
    DEFAULT_LEARN_STEPS,
    Cancelled,
    PairConfig,
    Resources,
    endpoints,
    layers_of,
    load_eval,
    load_full,
    load_test_split,
    matched,
    n_layers,
    pair,
    spec_cfg,
    warm_up,
)
from rotviz.merging.registry import merges_at_size
from rotviz.types import Progress

__all__ = [
    "BARRIER_POINTS", "COMPUTE", "COMPUTE_MODULES", "DEFAULT_LEARN_STEPS", "WHOLE", "Cancelled",
    "PairConfig", "Progress", "Resources", "at_size", "barrier_defaults", "card", "check_pair",
    "check_pair_at_size", "endpoints", "gb", "inputs_cfg", "kinds", "layers_of",
    "learn", "load_eval", "load_full", "load_test_split", "match", "matched", "measure",
    "measure_cfg", "measure_pair", "merges_at_size", "n_layers", "needs_data", "pair", "params_in",
    "residual_why", "run", "scored_pair", "spec_cfg", "warm_up",
]

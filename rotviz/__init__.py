"""rotviz: see, teach and use the parameter-space symmetries of transformers.

The public API, imported on first use (so `import rotviz` and the command line stay light):
`load_model` and `evaluate`; `match_endpoints` (match once: the anchor, the source and the
matched source with what matching did) and `measure` (any registered measurement on those
endpoints, run by the one runner, rotviz.runner); `match_models`, `MatchOptions`,
and the one-call conveniences `interpolate`, `loss_plane` and `merge`; `merge_many` (N >= 2
parameter sets merged by a registered method, about an optional base); for checkpoints larger
than memory, at size (rotviz.atsize): `open_streamed`, `match_streamed`, `streamed_endpoints`
and the evaluations at size `sized_curve`, `sized_plane` and `sized_merge`.
Everything else lives in the layers below: `arch` (architectures as data),
`groups` (solvers), `symmetry` (views, actions, the symmetry registry), models and data,
`match`, `merging` (merge-method records), `analysis`, `atsize`, `measures` (measurement
records), then `zoo`, `app` and `cli`.
"""

from __future__ import annotations

import importlib

from rotviz.version import __version__

_API = {
    "load_model": "rotviz.sources.loading",
    "match_models": "rotviz.match.pipeline",
    "match_endpoints": "rotviz.match.endpoints",
    "measure": "rotviz.runner",
    "MatchOptions": "rotviz.match.options",
    "interpolate": "rotviz.measures.barrier",
    "loss_plane": "rotviz.measures.plane",
    "merge": "rotviz.measures.merge",
    "merge_many": "rotviz.merging.combine",
    "evaluate": "rotviz.evaluation",
    "open_streamed": "rotviz.atsize.blocks",
    "match_streamed": "rotviz.match.at_size",
    "streamed_endpoints": "rotviz.atsize.endpoints",
    "sized_curve": "rotviz.atsize.points",
    "sized_plane": "rotviz.atsize.points",
    "sized_merge": "rotviz.atsize.points",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'rotviz' has no attribute '{name}'")

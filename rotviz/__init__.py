"""rotviz: see, teach and use the parameter-space symmetries of transformers.

The public API, imported on first use (so `import rotviz` and the command line stay light):
`load_model` and `evaluate`; `match_endpoints` (match once: the anchor, the source and the
matched source with what matching did) and `measure` (any registered measurement on those
endpoints, run by the one runner, rotviz.runner); `match_models`, `MatchOptions`,
and the one-call conveniences `interpolate`, `loss_plane` and `merge`; `merge_many` (N >= 2
parameter sets merged by a registered method, about an optional base); for checkpoints larger
than memory, `open_streamed`, `match_streamed`, `streamed_endpoints` and the sized evaluations
`sized_curve`, `sized_plane` and `sized_merge`.
Everything else lives in the layers below: `arch` (architectures as data),
`groups` (solvers), `symmetry` (views, actions, the symmetry registry), models and data,
`match`, `merging` (merge-method records), `analysis`, `stream`, `measures` (measurement
records), then `zoo`, `app` and `cli`.
"""

from __future__ import annotations

import importlib

from rotviz.version import __version__

_API = {
    "load_model": "rotviz.models",
    "match_models": "rotviz.match.pipeline",
    "match_endpoints": "rotviz.match.endpoints",
    "measure": "rotviz.runner",
    "MatchOptions": "rotviz.match.options",
    "interpolate": "rotviz.analysis.landscape",
    "loss_plane": "rotviz.analysis.landscape",
    "merge": "rotviz.analysis.fusion",
    "merge_many": "rotviz.merging.combine",
    "evaluate": "rotviz.evaluation",
    "open_streamed": "rotviz.stream.blocks",
    "match_streamed": "rotviz.stream.match",
    "streamed_endpoints": "rotviz.stream.endpoints",
    "sized_curve": "rotviz.stream.sized",
    "sized_plane": "rotviz.stream.sized",
    "sized_merge": "rotviz.stream.sized",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'rotviz' has no attribute '{name}'")

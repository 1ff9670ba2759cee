"""rotviz: see, teach and use the parameter-space symmetries of transformers.

The public API, imported on first use (so `import rotviz` and the command line stay light):
`load_model`, `match_models`, `MatchOptions`, `interpolate`, `loss_plane`, `merge` and
`evaluate`; for checkpoints larger than memory, `open_streamed`, `match_streamed` and the
sized evaluations `sized_curve`, `sized_plane` and `sized_merge`.
Everything else lives in the layers below: `arch` (architectures as data),
`groups` (solvers), `symmetry` (views, actions, the symmetry registry), models and data,
`match`, `analysis`, then `zoo`, `app` and `cli`.
"""

from __future__ import annotations

import importlib

from rotviz.version import __version__

_API = {
    "load_model": "rotviz.models",
    "match_models": "rotviz.match.pipeline",
    "MatchOptions": "rotviz.match.options",
    "interpolate": "rotviz.analysis.landscape",
    "loss_plane": "rotviz.analysis.landscape",
    "merge": "rotviz.analysis.fusion",
    "evaluate": "rotviz.evaluation",
    "open_streamed": "rotviz.stream.blocks",
    "match_streamed": "rotviz.stream.match",
    "sized_curve": "rotviz.stream.sized",
    "sized_plane": "rotviz.stream.sized",
    "sized_merge": "rotviz.stream.sized",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'rotviz' has no attribute '{name}'")

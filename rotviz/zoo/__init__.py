"""The model zoo: small trained models shipped in `assets/zoo/`, each rebuildable from its recipe.

`rotviz.zoo` is its registry (rotviz.zoo.registry, a leaf that `rotviz.models` resolves
`zoo:NAME` with): entries, pairs, folders and cards. Building is `rotviz.zoo.build` (training
with `rotviz.zoo.train` on `rotviz.zoo.recipes`), imported only by what builds.
"""

from rotviz.zoo.registry import (
    ENTRIES,
    PAIRS,
    Entry,
    default_pair,
    entries,
    entry,
    is_built,
    pair,
    path_of,
    read_card,
    zoo_dir,
)

__all__ = ["ENTRIES", "PAIRS", "Entry", "default_pair", "entries", "entry", "is_built", "pair",
           "path_of", "read_card", "zoo_dir"]

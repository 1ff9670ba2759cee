"""One module per architecture family, found by `rotviz.arch` (pkgutil): each defines `SPEC`
(its `ArchSpec`), `random_config` (a tiny random test model's config.json, see
rotviz.random_models) and `ORDER` (where it is listed)."""

"""Merge methods as registered records: every module of this package that calls `register` is
found and registered when the package is imported (menus and help list them by `order`); a
new method is one module dropped into rotviz/merging/, and no list names it.

    from rotviz.merging import MergeMethod, register
"""

from rotviz.merging.registry import (
    MergeJob,
    MergeMethod,
    all_params,
    check_base,
    check_models,
    check_weight,
    merges_at_size,
    method,
    methods,
    names,
    register,
    users,
)
from rotviz.records import discover

discover(__name__, __path__)  # every module here that registers a record


__all__ = ["MergeJob", "MergeMethod", "all_params", "check_base", "check_models", "check_weight",
           "merges_at_size", "method", "methods", "names", "register", "users"]

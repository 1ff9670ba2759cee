"""Merge methods as registered records: the built-ins (simple, fisher, regmean) register
when this package is imported; a new method is one module that calls `register`.

    from rotviz.merging import MergeMethod, register
"""

from rotviz.merging import fisher, regmean, simple  # noqa: F401  (registers the built-ins)
from rotviz.merging.registry import (
    MergeJob,
    MergeMethod,
    all_params,
    check_weight,
    method,
    methods,
    names,
    register,
    users,
)

__all__ = ["MergeJob", "MergeMethod", "all_params", "check_weight", "method", "methods", "names",
           "register", "users"]

"""Merge methods as registered records: the built-ins (simple, fisher, regmean,
task_arithmetic, ties, dare_linear, dare_ties, slerp, model_stock) register when this package
is imported; a new method is one module that calls `register`.

    from rotviz.merging import MergeMethod, register
"""

from rotviz.merging import (  # noqa: F401  (registers the built-ins; METHODS orders them)
    dare,
    fisher,
    model_stock,
    regmean,
    simple,
    slerp,
    task_arithmetic,
    ties,
)
from rotviz.merging.registry import (
    MergeJob,
    MergeMethod,
    all_params,
    check_base,
    check_models,
    check_weight,
    method,
    methods,
    names,
    register,
    users,
)

__all__ = ["MergeJob", "MergeMethod", "all_params", "check_base", "check_models", "check_weight",
           "method", "methods", "names", "register", "users"]

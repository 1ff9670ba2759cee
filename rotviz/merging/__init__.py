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


def _discover() -> None:
    """Import every module of this package: each one that defines a record registers it
    (a new merge method is one module dropped here; no list names them). Modules whose name
    starts with an underscore are skipped."""
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_discover()


__all__ = ["MergeJob", "MergeMethod", "all_params", "check_base", "check_models", "check_weight",
           "merges_at_size", "method", "methods", "names", "register", "users"]

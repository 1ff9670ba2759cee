"""mergekit 0.1.5's own spherical merge functions called on plain tensors (the references of
tests/merging/test_nuslerp.py, test_multislerp.py and test_karcher.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group(tensors: Sequence[torch.Tensor], base: torch.Tensor | None = None):
    """mergekit's TensorGroup of the models (ids 0..N-1) and the base (last) if given."""
    from mergekit.merge_methods.base import TensorGroup

    ts = [*tensors, *([] if base is None else [base])]
    return TensorGroup.from_tensors(ts, base_index=None if base is None else len(tensors))


def per_model(values: Sequence[float]):
    from mergekit.merge_methods.base import PerInputValues

    return PerInputValues(list(enumerate(values)))


def mk_nuslerp(v0, v1, weights, base=None, row_wise=False, flatten=True) -> torch.Tensor:
    from mergekit.merge_methods.nuslerp import nuslerp_merge_method

    return nuslerp_merge_method.merge_group(group([v0, v1], base), weight=per_model(weights),
                                            nuslerp_row_wise=row_wise, nuslerp_flatten=flatten)


def mk_multislerp(tensors, weights, base=None) -> torch.Tensor:
    from mergekit.merge_methods.multislerp import multislerp

    return multislerp.merge_group(group([t.clone() for t in tensors],
                                        None if base is None else base.clone()),
                                  weight=per_model(weights))


def mk_karcher(tensors, weights=None, max_iter=10, tol=1e-5) -> torch.Tensor:
    from mergekit.merge_methods.karcher import karcher_merge_method, karcher_merge_tensors

    if weights is None:
        return karcher_merge_method.merge_group(group(tensors), max_iter=max_iter, tol=tol)
    return karcher_merge_tensors(list(tensors), list(weights), max_iter=max_iter, tol=tol)

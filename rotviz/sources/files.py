"""Checkpoint files, whatever their source: safetensors, or pickled state dicts read with
`weights_only=True`; clean one-line errors for corrupt or foreign files."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from rotviz.confine import ANYWHERE, Confined
from rotviz.errors import RotvizError

Tensor = torch.Tensor


BIN = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"


def read_weights(path: Path, confined: Confined = ANYWHERE) -> dict[str, Tensor]:
    """Weights from safetensors (preferred; read and checked by rotviz.sources.checkpoint) or a
    pickled .bin (or the shards its index names), loaded with weights_only=True. Every file
    is opened through `confined`: regular files only, and inside the roots in the app."""
    from rotviz.sources.checkpoint import INDEX, SINGLE, Checkpoint

    path = Path(path)
    if os.path.lexists(path / SINGLE) or os.path.lexists(path / INDEX):
        checkpoint = Checkpoint(path, confined)
        return checkpoint.read(checkpoint.keys(), None)
    state: dict[str, Tensor] = {}
    weight_map = None
    if os.path.lexists(path / BIN_INDEX):
        from rotviz.sources.checkpoint import read_index

        weight_map = read_index(path, path / BIN_INDEX, confined)
        names = sorted(set(weight_map.values()))
    elif os.path.lexists(path / BIN):
        names = [BIN]
    else:
        raise RotvizError(
            f"no weights in '{path}': expected model.safetensors or pytorch_model.bin"
        )
    for name in names:
        f = path / name
        with confined.open(f, "weights file") as fh:
            try:
                obj = torch.load(fh, map_location="cpu", weights_only=True)
            except Exception as e:  # torch raises many types for corrupt pickles
                raise RotvizError(
                    f"cannot read weights file '{f}' ({e.__class__.__name__}); "
                    "it is corrupt or not a plain state dict"
                ) from None
        if not isinstance(obj, Mapping):
            raise RotvizError(f"'{f}' holds no state dict; re-save the model with save_pretrained")
        odd = [str(k) for k, v in obj.items() if not isinstance(v, torch.Tensor)]
        if odd:
            raise RotvizError(
                f"'{f}' holds non-tensor entries {odd[:3]}; it is not a plain state dict"
            )
        if weight_map is not None:
            twice = next((k for k in obj if k in state), None)
            elsewhere = next((k for k in obj if weight_map.get(k) != name), None)
            if twice is not None or elsewhere is not None:
                k = twice if twice is not None else elsewhere
                said = f"puts in {weight_map[k]}" if k in weight_map else "does not list"
                raise RotvizError(f"the shards in '{path}' do not match {BIN_INDEX} ({name} "
                                  f"holds {k}, which the index {said}); re-save the model "
                                  "or copy it again")
        state.update(obj)
    absent = [k for k in (weight_map or {}) if k not in state]
    if absent:
        raise RotvizError(f"the shards in '{path}' do not match {BIN_INDEX} (it puts "
                          f"{absent[0]} in {weight_map[absent[0]]}, which does not hold it); "
                          "re-save the model or copy it again")
    return state


def floating_dtypes(state: Mapping[str, Tensor]) -> dict[str, torch.dtype]:
    """The dtype of each floating tensor."""
    return {k: v.dtype for k, v in state.items() if v.is_floating_point()}


def fit_error(path: Path, missing: Sequence[str], unexpected: Sequence[str],
              mismatched: Sequence[str]) -> None:
    """One line naming what does not fit, if anything: tensors missing from the checkpoint,
    tensors the module lacks, tensors of the wrong shape."""
    parts = []
    if missing:
        parts.append(f"missing {list(missing)[:3]}")
    if unexpected:
        parts.append(f"unexpected {list(unexpected)[:3]}")
    if mismatched:
        parts.append(f"wrong shape {list(mismatched)[:3]}")
    if parts:
        raise RotvizError(
            f"weights in '{path}' do not fit its config ({'; '.join(parts)}); re-save the model"
        )

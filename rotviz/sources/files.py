"""Checkpoint files, whatever their source: safetensors, or pickled state dicts read with
`weights_only=True`; clean one-line errors for corrupt or foreign files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from rotviz.errors import RotvizError

Tensor = torch.Tensor


def read_weights(path: Path) -> dict[str, Tensor]:
    """Weights from safetensors (preferred) or a pickled .bin, loaded with weights_only=True."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    state: dict[str, Tensor] = {}
    if files:
        for f in files:
            try:
                state.update(load_file(str(f)))
            except (SafetensorError, OSError, ValueError) as e:
                raise RotvizError(
                    f"cannot read weights file '{f}' ({e}); the file is corrupt or truncated"
                ) from None
        return state
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise RotvizError(
            f"no weights in '{path}': expected model.safetensors or pytorch_model.bin"
        )
    for f in bins:
        try:
            obj = torch.load(str(f), map_location="cpu", weights_only=True)
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
        state.update(obj)
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

"""A batch's inputs: one tensor (the spec's input key), or named inputs (padded text), and
what every consumer does with them (move, join, count rows, find the real tokens)."""

from __future__ import annotations

import torch

# A batch's inputs: one tensor (the spec's input key), or named inputs (padded text)
Inputs = torch.Tensor | dict[str, torch.Tensor]


def map_inputs(x: Inputs, fn) -> Inputs:
    """`fn` applied to a batch's input tensor, or to each of its named inputs."""
    return fn(x) if isinstance(x, torch.Tensor) else {k: fn(v) for k, v in x.items()}


def to_device(x: Inputs, device: torch.device | str,
              dtype: torch.dtype | None = None) -> Inputs:
    """A batch's inputs on `device`; with `dtype`, floating inputs (images) in it too, as the
    module that reads them holds its weights (timm casts nothing itself: a model held in
    float64 takes float64 images)."""
    if dtype is None:
        return map_inputs(x, lambda t: t.to(device))
    return map_inputs(x, lambda t: t.to(device, dtype) if t.is_floating_point()
                      else t.to(device))


def without_padding(h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The rows of activations `h` (batch, positions, features) at real tokens, as
    (tokens, features); `h` as it is when there is no mask or it is not per position (a
    classifier head's pooled input). Statistics of activations never count padding."""
    if mask is None or h.dim() != 3 or tuple(h.shape[:2]) != tuple(mask.shape):
        return h
    return h[mask.bool()]


def cat_inputs(parts: list[Inputs]) -> Inputs:
    """Batches of one split (padded alike) as one batch."""
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def n_rows(x: Inputs) -> int:
    return int((x if isinstance(x, torch.Tensor) else x["input_ids"]).shape[0])


def token_mask(x: Inputs) -> torch.Tensor | None:
    """Which positions hold real tokens (None: every position does)."""
    return None if isinstance(x, torch.Tensor) else x.get("attention_mask")


# ---- the character vocabulary -----------------------------------------------------------------

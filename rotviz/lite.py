"""Loading a model for evaluation only (a fast path is added for the zoo's families)."""

from __future__ import annotations

import torch

from rotviz.models import Loaded, load_model


def load_for_eval(ref: str, device: torch.device) -> Loaded:
    loaded = load_model(ref)
    loaded.model.to(device)
    return loaded

"""The Merge page's table: merged accuracy for every merge method and every matched source.

The app matches through its own cache (shared with the other pages, with progress and
cancelling), so the merge step receives sources matched beforehand rather than matching
options.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from rotviz.models import Loaded


def fusion_with_states(anchor: Loaded, source: Loaded, split,
                       states: Mapping[str, Mapping[str, torch.Tensor] | None],
                       methods, weight: float = 0.5, batches: int = 8, batch_size: int = 32,
                       alpha: float = 0.9, device="cpu", seed: int = 0) -> dict:
    """`rotviz.analysis.fusion.fusion_table` for sources matched beforehand: one column per entry of
    `states` (label -> the matched source's state dict, None for the source as it is).

    The app matches through its own cache (shared with the other pages, with progress and
    cancelling), then hands each matched source to fusion_table as a source that needs no
    matching, so merging, statistics and evaluation are the library's own. Same keys as
    `FusionTable.to_dict()`; `seconds` and `timing` leave matching out."""
    from rotviz.analysis.fusion import fusion_table

    out: dict | None = None
    for label, state in states.items():
        moved = source if state is None else dataclasses.replace(source, state=dict(state))
        t = fusion_table(anchor, moved, split, None, methods, ("none",), weight, batches,
                         batch_size, alpha, device, seed).to_dict()
        if out is None:
            out = {**t, "specs": [], "acc": {m: {} for m in t["methods"]},
                   "loss": {m: {} for m in t["methods"]}, "scores": {m: {} for m in t["methods"]},
                   "distance": {}, "timing": {}, "seconds": 0.0}
        out["specs"].append(label)
        for m in t["methods"]:
            out["acc"][m][label] = t["acc"][m]["none"]
            out["loss"][m][label] = t["loss"][m]["none"]
            out["scores"][m][label] = t["scores"][m]["none"]
        out["distance"][label] = t["distance"]["none"]
        for k, v in t["timing"].items():
            if not k.startswith("match:"):
                out["timing"][k] = out["timing"].get(k, 0.0) + v
        out["seconds"] += t["seconds"]
        if state is None:  # the end models' numbers from the source as it is
            out.update(source_acc=t["source_acc"], source_loss=t["source_loss"],
                       source_scores=t["source_scores"])
    if out is None:
        raise ValueError("fusion_with_states needs at least one source state")
    return out

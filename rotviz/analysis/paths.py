"""Points of the straight path between two parameter sets: the one interpolation every
curve, plane, layer-wise barrier, sharpness profile and learned matching evaluates.

theta(alpha) = (1 - alpha) a + alpha b, formed as torch.lerp forms it (from the nearer end),
on floating tensors only: integer buffers (position ids, masks) are a's. The ends are exact,
alpha = 0 and 1 give the endpoints' own tensors, not a rounded mixture, so a pair whose ends
are one model has a barrier of exactly 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

Tensor = torch.Tensor


def path_point(a: Mapping[str, Tensor], b: Mapping[str, Tensor], alpha: float
               ) -> dict[str, Tensor]:
    """(1 - alpha) a + alpha b on a's floating tensors (b cast to a's dtype); a's others
    kept. Never writes into a or b."""
    if alpha == 0.0:
        return dict(a)
    if alpha == 1.0:
        return {k: b[k] if a[k].is_floating_point() else a[k] for k in a}
    return {k: torch.lerp(a[k], b[k].to(a[k].dtype), alpha) if a[k].is_floating_point()
            else a[k] for k in a}

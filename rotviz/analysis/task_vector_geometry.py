"""The geometry of task vectors tau_i = theta_i - theta_base (rotviz taskvectors), from their
Gram matrices per layer.

Every number the record reports is a function of the inner products <tau_i^g, tau_j^g> of
the task vectors restricted to each layer g (a block, or "outside": embeddings, final norm,
head), summed in float64: so the per-layer and the flattened views are computed from the
same sums and agree exactly. With n_i^g = |tau_i^g| and N_i = |tau_i| = sqrt(sum_g
(n_i^g)^2):

    flattened cos_ij = sum_g <tau_i^g, tau_j^g> / (N_i N_j)
                     = sum_g w_ij^g cos_ij^g,    w_ij^g = n_i^g n_j^g / (N_i N_j)

so the flattened cosine is the per-layer cosines weighted by the product of the layers'
shares of the norms. The weights sum to P_ij = cos(n_i, n_j), the cosine of the two norm
profiles (<= 1; 1 when both vectors spread their norm over the layers in one proportion):
the flattened cosine is P_ij times the norm-weighted mean of the per-layer cosines. A layer
where either vector is zero has no cosine (None) and weight 0.
"""

from __future__ import annotations

import fnmatch
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rotviz.errors import RotvizError

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor

Gram = list[list[float]]  # k x k inner products of the task vectors (one layer's, or all)


def skipped(names: Sequence[str], patterns: Sequence[str]) -> list[str]:
    """`names` less those matching any shell pattern of `patterns` (fnmatch: `head.*`)."""
    return [n for n in names if not any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def patterns_of(text: str) -> list[str]:
    """A comma list of name patterns (--skip), blanks dropped."""
    return [p.strip() for p in str(text or "").split(",") if p.strip()]


def layer_grams(base: Mapping[str, Tensor], states: Sequence[Mapping[str, Tensor]],
                names: Sequence[str], group: Mapping[str, str],
                layers: Sequence[str]) -> dict[str, Gram]:
    """Each layer's Gram matrix of the task vectors: sum over its tensors of
    <theta_i - theta_base, theta_j - theta_base>, in float64, one tensor at a time (never the
    whole vectors at once)."""
    k = len(states)
    out = {g: [[0.0] * k for _ in range(k)] for g in layers}
    for name in names:
        b = base[name].detach().double()
        taus = [(s[name].detach().double() - b).flatten() for s in states]
        gram = out[group[name]]
        for i in range(k):
            for j in range(i, k):
                v = float(taus[i] @ taus[j])
                gram[i][j] += v
                if j != i:
                    gram[j][i] += v
    return out


def _cos(g: Gram, i: int, j: int) -> float | None:
    """g_ij / sqrt(g_ii g_jj), clipped to [-1, 1]; None where either norm is zero."""
    den = math.sqrt(g[i][i]) * math.sqrt(g[j][j])
    return None if den == 0.0 else max(-1.0, min(1.0, g[i][j] / den))


def whole(grams: Mapping[str, Gram]) -> Gram:
    """The Gram matrix of the flattened task vectors: the layers' summed."""
    first = next(iter(grams.values()))
    k = len(first)
    return [[sum(g[i][j] for g in grams.values()) for j in range(k)] for i in range(k)]


def refuse_zero(grams: Mapping[str, Gram], refs: Sequence[str], base: str) -> None:
    """A zero task vector (a fine-tune equal to the base, over the tensors compared) has no
    direction: its cosine is undefined, so it is refused in one line."""
    total = whole(grams)
    for i, ref in enumerate(refs):
        if total[i][i] == 0.0:
            raise RotvizError(f"'{ref}' equals the base '{base}' over the tensors compared: its "
                              "task vector is zero and its cosine undefined; give a model "
                              "fine-tuned from the base (or a narrower --skip)")


def geometry(grams: Mapping[str, Gram]) -> dict:
    """Norms (whole and per layer), the flattened cosine matrix, and per pair i < j its
    per-layer cosines, their spread (min, median, max over the layers where both vectors are
    nonzero), the norm weights w^g, their sum P (the cosine of the norm profiles) and the
    norm-weighted mean of the per-layer cosines (module docstring)."""
    layers = list(grams)
    total = whole(grams)
    k = len(total)
    norms = [math.sqrt(total[i][i]) for i in range(k)]
    layer_norms = [[math.sqrt(grams[g][i][i]) for g in layers] for i in range(k)]
    cosine = [[_cos(total, i, j) for j in range(k)] for i in range(k)]
    pairs = []
    for i in range(k):
        for j in range(i + 1, k):
            per = [_cos(grams[g], i, j) for g in layers]
            w = [layer_norms[i][n] * layer_norms[j][n] / (norms[i] * norms[j])
                 for n in range(len(layers))]
            have = [c for c in per if c is not None]
            weight = sum(w)
            mean = (sum(wg * c for wg, c in zip(w, per, strict=True) if c is not None) / weight
                    if weight > 0 else None)
            pairs.append({
                "i": i, "j": j, "flattened": cosine[i][j], "per_layer": per, "weights": w,
                "profile_cosine": weight, "weighted_mean": mean,
                "min": min(have) if have else None,
                "median": statistics.median(have) if have else None,
                "max": max(have) if have else None})
    return {"layers": layers, "norm": norms, "layer_norms": layer_norms, "cosine": cosine,
            "pairs": pairs}

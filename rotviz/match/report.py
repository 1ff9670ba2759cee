"""What matching found and did: per-layer head reports, the run's report and its result."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rotviz.match.distances import Distances
from rotviz.match.options import MatchOptions
from rotviz.symmetry.actions import LayerTransform
from rotviz.symmetry.registry import SYMMETRIES
from rotviz.symmetry.view import ModelView

Tensor = torch.Tensor


@dataclass
class HeadReport:
    """Per layer, per head: what matching saw and did.

    "Per head" means per KV group under grouped-query attention (H_kv entries; H_kv = H
    otherwise). Under rotary embeddings the Q-K rotation turns each frequency pair by its own
    angle: its eigen-angles (qk_angles) are those angles, each twice, and its det is +1;
    qk_scale is then |det A|^(1/d_h), the geometric mean of the per-pair scales qk_pair_scale.
    """

    layer: int
    qk_singular: list[list[float]] = field(default_factory=list)  # (H_kv, d_h)
    vo_singular: list[list[float]] = field(default_factory=list)
    qk_angles: list[list[float]] = field(default_factory=list)  # degrees, (H_kv, d_h)
    vo_angles: list[list[float]] = field(default_factory=list)
    qk_det: list[float] = field(default_factory=list)
    vo_det: list[float] = field(default_factory=list)
    qk_scale: list[float] = field(default_factory=list)
    vo_scale: list[float] = field(default_factory=list)
    ffn_moved: int = 0  # FFN units that changed position
    head_perm: list[int] = field(default_factory=list)  # new head k = source head head_perm[k]
    qk_pair_scale: list[list[float]] = field(default_factory=list)  # rotary: (H_kv, d_h / 2)
    # gated FFN with rescaling: quantiles (0, 25, 50, 75, 100 %) of the per-unit up/down
    # scales (the scales themselves are in MatchResult.transforms[layer].ffn_scale)
    ffn_scale_quantiles: list[float] = field(default_factory=list)
    # partial rotary with rescaling: the scale of the dims rotary embeddings leave alone,
    # one per head (H_kv); reported only where a model has such dims
    qk_free_scale: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = dict(vars(self))
        if not out["qk_free_scale"]:
            del out["qk_free_scale"]
        return out


@dataclass
class MatchReport:
    options: MatchOptions
    before: Distances
    after: Distances
    layers: list[HeadReport]
    seconds: float = 0.0
    max_output_diff: float | None = None  # filled by the function check (float32)
    # A half checkpoint's second check, run in its own dtype (rotviz.match.pipeline): the dtype's
    # name, the largest logit change and the tolerance it met, in logits.
    stored_dtype: str | None = None
    stored_output_diff: float | None = None
    stored_tolerance: float | None = None
    residual: dict | None = None  # the residual map: group, rounds, objective, angles
    act: dict | None = None  # activation matching: data, examples, correlations
    learned: dict | None = None  # learned matching: steps, history, validation barriers
    # a narrower source embedded into the anchor's FFN width first (rotviz.match.widths):
    # units per layer of each model and the anchor slot of every source unit
    widths: dict | None = None
    # two models of one body under different heads (rotviz.sources.pairs.HeadsDiffer.to_dict): both
    # head classes, the tensors matched, the source's own (moved, unmatched) and the anchor's
    # own (left alone)
    different_heads: dict | None = None

    def to_dict(self) -> dict:
        o = self.options
        return {
            "options": {**{s.name: getattr(o, s.name) for s in SYMMETRIES},
                        "residual_group": o.residual_group, "rounds": o.rounds, "tol": o.tol,
                        "stall": o.stall, "time_limit": o.time_limit,
                        "ffn_backoff": o.ffn_backoff, "plain_rounds": o.plain_rounds,
                        "layers": list(o.layers) if o.layers is not None else None},
            "distance_before": self.before.to_dict(),
            "distance_after": self.after.to_dict(),
            "heads": [h.to_dict() for h in self.layers],
            "residual": self.residual,
            "act": self.act,
            "learned": self.learned,
            "widths": self.widths,
            # only for one body under two heads: a pair of one head reports as it always has
            **({"different_heads": self.different_heads} if self.different_heads else {}),
            "max_output_diff": self.max_output_diff,
            "stored_dtype": self.stored_dtype,
            "stored_output_diff": self.stored_output_diff,
            "stored_tolerance": self.stored_tolerance,
            "seconds": self.seconds,
        }


@dataclass
class MatchResult:
    """The matched view and the group element that produced it. With a residual map the
    element acts on canonical forms (rotviz.symmetry.residual): `view` = restore(apply(canonical
    source, transforms, residual), the anchor's gauge)."""

    view: ModelView
    transforms: dict[int, LayerTransform]
    report: MatchReport
    residual: Tensor | None = None  # (d, d), x -> x Q on the stream

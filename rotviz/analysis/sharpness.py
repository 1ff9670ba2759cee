"""Sharpness along the straight path: the top Hessian eigenvalue (and, optionally, the
Hutchinson trace) of the split's mean loss at points theta(alpha) = (1 - alpha) A + alpha B'
between the anchor A and the matched source B', and, for comparison, on the unmatched path
A -> B.

Why: a loss barrier says the midpoint is high; the curvature says how the basin's shape
changes on the way. On the unmatched path the points in the middle are far from any
minimum and the curvature there is usually larger (and may turn negative); matching moves
B into A's basin, so the matched path's curvature should stay close to the endpoints'.

Every point is measured by `rotviz.analysis.hessian.hessian` at that parameter set with the
same seed, the same Lanczos steps and the same examples, so the numbers at alpha = 0 and 1
are exactly what `rotviz hessian` reports at A and at B'. B and B' compute one function:
when the matching is made of permutations and rotations only (no rescale) their Hessians are
conjugate by an orthogonal map and the two paths' values at alpha = 1 agree; a rescale
changes the spectrum while keeping the function (Dinh et al., 2017), so they need not.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from rotviz.analysis.hessian import hessian
from rotviz.analysis.paths import path_point
from rotviz.data.split import Split
from rotviz.match.endpoints import HeldEndpoints
from rotviz.types import Progress

Tensor = torch.Tensor


def rescales(match: str) -> bool:
    """Whether a matching string holds a rescale ('seed' is ffn, attn and rescale): then B'
    is B's function with another spectrum (Dinh et al., 2017)."""
    from rotviz.match.selection import parse_selection

    try:
        return bool(getattr(parse_selection(match), "rescale", False))
    except Exception:  # a label no selection parses (learned maps): say nothing
        return False


@dataclass
class PathSharpness:
    """The curvature along one or two paths; `to_dict()` is the JSON.

    `matched[i]` / `unmatched[i]` are the top eigenvalue at alphas[i] (largest first is the
    first entry of `matched_top[i]`); traces are None without probes; `unmatched*` are None
    unless compared."""

    model: str
    source: str
    match: str
    split: str  # the split's name (test, train); the data reference is `data`
    n: int
    n_params: int
    alphas: list[float]
    top: int
    probes: int
    iterations: int
    seed: int
    matched: list[float]
    matched_top: list[list[float]]
    matched_loss: list[float]
    matched_trace: list[float] | None = None
    matched_trace_se: list[float | None] | None = None  # None at a point: one probe
    unmatched: list[float] | None = None
    unmatched_top: list[list[float]] | None = None
    unmatched_loss: list[float] | None = None
    unmatched_trace: list[float] | None = None
    unmatched_trace_se: list[float | None] | None = None  # None at a point: one probe
    hvps: int = 0
    seconds: float = 0.0
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)
    # the largest Lanczos residual over every point of both paths, and whether every point
    # converged (rotviz.analysis.hessian's `residual` and `converged`)
    residual: float = 0.0
    converged: bool = True
    data: str = ""  # the data reference the split was read from (digits, text:FILE)

    def to_dict(self) -> dict:
        return asdict(self)


def _along(ends: HeldEndpoints, b: Mapping[str, Tensor], split: Split, alphas: list[float],
           device, top: int, probes: int, seed: int, batch_size: int, steps: int,
           dtype, progress: Progress | None, done: int, total: int, label: str) -> dict:
    a = ends.anchor.state
    out: dict = {"top": [], "loss": [], "trace": [], "se": [], "hvps": 0, "device": "cpu",
                 "n_params": 0, "residual": 0.0, "converged": True}
    for i, alpha in enumerate(alphas):
        if progress is not None:
            progress(done + i, total, f"{label} path, alpha {alpha:.3g}")
        r = hessian(ends.anchor, path_point(a, b, alpha), split, device, top, probes,
                    "none", seed, batch_size, steps, 0, dtype)
        out["top"].append(r.eigenvalues)
        out["loss"].append(r.loss)
        out["trace"].append(r.trace)
        out["se"].append(r.trace_se)
        out["hvps"] += r.hvps
        out["residual"] = max(out["residual"], r.residual)
        out["converged"] = out["converged"] and r.converged
        out["device"], out["n_params"] = r.device, r.n_params
    return out


def sharpness_on(ends: HeldEndpoints, split: Split, points: int = 5, device="cpu",
                 top: int = 1, probes: int = 0, compare: bool = True, seed: int = 0,
                 batch_size: int = 512, steps: int = 50, dtype: torch.dtype | None = None,
                 progress: Progress | None = None) -> PathSharpness:
    """The top-`top` Hessian eigenvalues (and the trace with `probes` Hutchinson probes) at
    `points` evenly spaced alphas of the matched path A -> B', and with `compare` of the
    unmatched path A -> B, each point exactly as `hessian(anchor, point, split, ...)` with
    the same seed. Neither the endpoints' tensors nor the loaded models are changed."""
    t0 = time.perf_counter()
    alphas = np.linspace(0.0, 1.0, points).tolist()
    total = points * (2 if compare else 1)
    args = (split, alphas, device, top, probes, seed, batch_size, steps, dtype, progress)
    m = _along(ends, ends.matched, *args, 0, total, "matched")
    u = _along(ends, ends.source.state, *args, points, total, "unmatched") if compare \
        else None
    if progress is not None:
        progress(total, total, "done")
    notes = []
    if compare and rescales(ends.match):
        notes.append("the matching rescales: B and B' are one function but their spectra "
                     "differ (Dinh et al., 2017), so the paths need not agree at alpha = 1")
    return PathSharpness(
        model=ends.anchor_ref, source=ends.source_ref, match=ends.match, split=split.split,
        n=split.n, n_params=m["n_params"], alphas=alphas, top=top, probes=probes,
        data=split.data, iterations=steps, seed=seed, matched=[t[0] for t in m["top"]],
        matched_top=m["top"],
        matched_loss=m["loss"], matched_trace=m["trace"] if probes else None,
        matched_trace_se=m["se"] if probes else None,
        unmatched=None if u is None else [t[0] for t in u["top"]],
        unmatched_top=None if u is None else u["top"],
        unmatched_loss=None if u is None else u["loss"],
        unmatched_trace=u["trace"] if u is not None and probes else None,
        unmatched_trace_se=u["se"] if u is not None and probes else None,
        hvps=m["hvps"] + (u["hvps"] if u else 0), seconds=time.perf_counter() - t0,
        device=m["device"], notes=notes,
        residual=max(m["residual"], u["residual"] if u else 0.0),
        converged=m["converged"] and (u["converged"] if u else True))

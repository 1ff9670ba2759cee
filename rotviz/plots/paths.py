"""What figures of paths share: where a curve rises highest above the line between its
ends, a title that is true of every curve drawn, and the names of the plane's points (the
barrier, bend, plane and slice figures and the path's animation draw them alike)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def barrier_point(alphas: Sequence[float], values: Sequence[float]) -> tuple[float, float, float]:
    """Where the curve rises highest above the straight line between its end points.

    Returns (alpha, value on the curve, value on the line); the barrier is their difference
    (the GLMC paper's definition, docs/conventions.md).
    """
    a = np.asarray(alphas, dtype=float)
    v = np.asarray(values, dtype=float)
    line = v[0] + (v[-1] - v[0]) * (a - a[0]) / max(a[-1] - a[0], 1e-12)
    i = int(np.argmax(v - line))
    return float(a[i]), float(v[i]), float(line[i])


def path_title(what: str, matches: Sequence[str]) -> str:
    """A title that is true of every curve drawn: the path ends at the matched source only
    when every curve matched, at the source as trained when none did."""
    done = [m not in ("none", "") for m in matches]
    if all(done):
        return f"{what} along the straight path from anchor to matched source"
    if not any(done):
        return f"{what} along the straight path from anchor to source (no matching)"
    return f"{what} along the straight path from anchor to source, with and without matching"


PLANE_MARKERS = {
    "A": "anchor (A)",
    "B": "source as trained (B)",
    "B'": "source after matching (B')",
    "AB": "average of A and B",
    "AB'": "average of A and B'",
}

"""Loss curves and planes of a matched pair at size: both checkpoints held as stored, each
point built block by block (rotviz.atsize.points), the same numbers as
rotviz.measures.barrier's in-memory `interpolate` and `loss_plane`.

`interpolate` holds the anchor, the source and each point of the path in float32: 3x a
model's float32 bytes, 84 GB for a 7B pair. Here both checkpoints are held as they are stored
(bf16: 2 x 14 GB for 7B) on the device, and each point of the path is never made whole.
Planes hold three checkpoints (anchor, source, matched source) and build each grid point the
same way. The source is taken as given: match it first (rotviz.match.at_size writes a matched
checkpoint; the CLI's --max-memory does both).
"""


from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from rotviz.analysis.paths import Curve, check_path, path_points
from rotviz.analysis.planes import (
    Plane,
    plane_axes,
    plane_coeffs,
    plane_frame,
    plane_grid,
    plane_points,
)
from rotviz.atsize.points import Held
from rotviz.data.split import Split
from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.limits import GRID, MARGIN
from rotviz.match.endpoints import MatchInfo
from rotviz.types import Progress

Tensor = torch.Tensor


@dataclass
class SizedCurve(Curve):
    """A `Curve` whose points were built block by block; `held_bytes`: both checkpoints as
    stored, on the device."""

    held_bytes: int = 0


def sized_curve(anchor: str | os.PathLike, source: str | os.PathLike, split: Split,
                points: int = 21, device: str | torch.device = "cpu", batch_size: int = 512,
                progress: Progress | None = None, repeats: int = 1, seed: int = 0,
                group: Group = SINGLE, match_info: MatchInfo | None = None,
                layers: list[int] | None = None) -> SizedCurve | None:
    """The straight path from `anchor` to `source` (checkpoint folders) at `points` alphas on
    `split` (read through the anchor: rotviz.data.reading.split_for(sized_loaded(...))), as
    `rotviz.measures.barrier.interpolate` gives it for a source already matched
    (`match_info` says how; `layers` which layers). Under torchrun (`group`) the points are
    shared and rank 0 returns the curve (None elsewhere)."""
    check_path(points, repeats, split)
    t0 = time.perf_counter()
    held = Held([anchor, source], split, device, batch_size)
    alphas = np.linspace(0.0, 1.0, points).tolist()
    fields = path_points(lambda a: held.evaluate((1.0 - a, a)), alphas, split.n, split.task,
                         repeats, seed, progress, group)
    if fields is None:
        return None
    info = match_info or MatchInfo("none", 0.0, 0.0, None, 0.0)
    a, s = held.models
    return SizedCurve(
        **fields, match=info.match, data=split.data, split=split.split, device=str(held.device),
        seconds=time.perf_counter() - t0, n=split.n, layers=layers, anchor=a.ref, source=s.ref,
        distance_before=info.distance_before, distance_after=info.distance_after,
        max_output_diff=info.max_output_diff, match_seconds=info.seconds,
        held_bytes=held.held_bytes)


def sized_plane(anchor: str | os.PathLike, source: str | os.PathLike,
                matched: str | os.PathLike, split: Split, grid: int = 21,
                margin: float = 0.25, device: str | torch.device = "cpu",
                batch_size: int = 512, progress: Progress | None = None,
                group: Group = SINGLE, match_info: MatchInfo | None = None,
                layers: list[int] | None = None) -> Plane | None:
    """`rotviz.measures.plane.loss_plane` through A (`anchor`), B (`source`) and B'
    (`matched`, the source matched already: `match_info` says how), three checkpoint folders
    held as stored, each grid point (1 - a - b) A + a B + b B' built block by block. B' must
    lie off the A-B line (a plane without matching has no second direction here). Under
    torchrun (`group`) the grid is shared and rank 0 returns the plane (None elsewhere)."""
    GRID.check(grid)
    MARGIN.check(margin)
    t0 = time.perf_counter()
    held = Held([anchor, source, matched], split, device, batch_size)
    aliases = {alias for alias, _ in held.models[0].tied}
    bb = bc = cc = 0.0
    for n in held.keys:
        a, b, c = (t[n] for t in held.tensors)
        if not a.is_floating_point() or n in aliases:
            continue
        d_b = (b.float() - a.float()).double()
        d_c = (c.float() - a.float()).double()
        bb += float((d_b * d_b).sum())
        bc += float((d_b * d_c).sum())
        cc += float((d_c * d_c).sum())
    n1, c, n2 = plane_frame(bb, bc, cc)
    if n2 <= 1e-6 * n1:
        raise RotvizError("the matched source lies on the anchor-source line, so the plane has "
                          "no second direction; at size rotviz draws no random one: match "
                          "with --match (e.g. seed) or raise --max-memory")
    pts = plane_points(n1, c, n2)
    xs, ys = plane_axes(pts, n1, margin, grid, False)

    def at(x: float, y: float) -> tuple[float, float]:
        a, b = plane_coeffs(x, y, n1, c, n2)
        return held.loss_acc((1.0 - a - b, a, b))[:2]

    corners = {"A": (1.0, 0.0, 0.0), "B": (0.0, 1.0, 0.0), "B'": (0.0, 0.0, 1.0),
               "AB'": (0.5, 0.0, 0.5)}

    def named(name: str) -> tuple[float, float]:
        if name in corners:
            return held.loss_acc(corners[name])[:2]
        return at(*pts[name])

    found = plane_grid(at, named, pts, xs, ys, progress, group)
    if found is None:
        return None
    loss, acc, point_loss, point_acc = found
    info = match_info or MatchInfo("none", 0.0, 0.0, None, 0.0)
    return Plane(
        xs=xs.tolist(), ys=ys.tolist(), loss=loss.tolist(), acc=acc.tolist(),
        points={k: [float(v[0]), float(v[1])] for k, v in pts.items()},
        point_loss=point_loss, point_acc=point_acc, match=info.match, data=split.data,
        split=split.split, device=str(held.device), seconds=time.perf_counter() - t0,
        grid=grid, n=split.n, layers=layers, anchor=held.models[0].ref,
        source=held.models[1].ref, distance_ab=n1, distance_ab_matched=math.hypot(*pts["B'"]),
        degenerate=False)

"""The loss plane through the anchor A, the source B and the matched source B' (the seed
paper's Figure 2; docs/landscape.md): the record, its computation in memory (`plane_on`,
`loss_plane`; the frame and grid are rotviz.analysis.planes') and its figure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rotviz.limits import BATCH_SIZE, GRID, MARGIN, SEED
from rotviz.measures.barrier import match_label
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import numpy as np
    import plotly.graph_objects as go
    import torch

    from rotviz.analysis.planes import Plane
    from rotviz.data.split import Split
    from rotviz.dist import Group
    from rotviz.match.endpoints import HeldEndpoints
    from rotviz.match.options import MatchOptions
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

PARAMS = (
    Param("grid", 21, f"grid points per axis (default 21, {GRID.text})", GRID,
          label="Plane grid (points per side)", widget=(5, 31, 1), essential=True),
    Param("margin", 0.25, "margin around the points, as a fraction of their span (default "
          f"0.25, {MARGIN.text})", MARGIN, label="Margin (fraction of the span)"),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
    Param("seed", 0, "seed of the random second direction when B' lies on the A-B line "
          "(default 0)", SEED, label="Seed"),
)


def _run(ends, ctx: Context, v: dict):
    from rotviz.dist import SINGLE

    return plane_on(ends, ctx.split, v["grid"], v["margin"], ctx.device, ctx.progress,
                    v["batch_size"], v["seed"], group=ctx.group or SINGLE)


def _at_size(ends, ctx: Context, v: dict):
    from rotviz.atsize.landscape import sized_plane
    from rotviz.dist import SINGLE

    pl = sized_plane(ends.anchor_path, ends.source_path, ends.matched_path, ctx.split,
                     v["grid"], v["margin"], ctx.device, v["batch_size"], ctx.progress,
                     ctx.group or SINGLE, ends.info, ends.layers)
    if pl is not None:
        pl.source = ends.source_ref
    return pl


def _summary(pl, how: str) -> str:
    pts = ", ".join(f"{k} {pl.point_loss[k]:.3f}" for k in pl.points)
    return (f"plane [{match_label(pl.match, pl.layers)}] {pl.grid}x{pl.grid} on {pl.device}"
            f"{how}: losses {pts}; |AB| {pl.distance_ab:.3f}, |AB'| "
            f"{pl.distance_ab_matched:.3f}; {pl.seconds:.1f} s")


def plane_on(
    ends: HeldEndpoints,
    split: Split,
    grid: int = 21,
    margin: float = 0.25,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    batch_size: int = 512,
    seed: int = 0,
    group: Group | None = None,
) -> Plane | None:
    """plane_on(endpoints, split, grid=21, margin=0.25, device=) -> Plane

    The seed paper's Figure 2 made real: a grid x grid evaluation of the plane through A
    (anchor), B (source) and B' (matched source), covering the three points with `margin`
    (a fraction of the span) on each side, plus the exact values at A, B, B' and the
    midpoints AB and AB'. When B' lies on the A-B line (no matching), the second direction
    is a random one drawn with `seed`. Under torchrun (`group`) the grid points are shared
    among the processes; rank 0 adds the named points and returns the plane (None elsewhere).
    """
    import math
    import time

    import torch

    from rotviz.analysis.paths import path_point
    from rotviz.analysis.planes import (
        Plane,
        flat_inner,
        plane_axes,
        plane_coeffs,
        plane_frame,
        plane_grid,
        plane_points,
    )
    from rotviz.dist import SINGLE
    from rotviz.evaluation import Evaluator
    from rotviz.limits import GRID, MARGIN

    GRID.check(grid)
    MARGIN.check(margin)
    t0 = time.perf_counter()
    anchor, source = ends.anchor, ends.source
    ev = Evaluator(anchor, split, device, batch_size)
    pa, pb, pc = ev.params(anchor.state), ev.params(source.state), ev.params(ends.matched)
    d_b = {k: pb[k] - pa[k] for k in pa}
    d_c = {k: pc[k] - pa[k] for k in pa}
    bb = flat_inner(d_b, d_b)
    n1, c, n2 = plane_frame(bb, flat_inner(d_b, d_c), flat_inner(d_c, d_c))
    pts = plane_points(n1, c, n2)
    degenerate = n2 <= 1e-6 * n1
    if degenerate:  # B' on the A-B line (e.g. no matching): y is a seeded random direction
        gen = torch.Generator().manual_seed(seed)
        d_c = {k: torch.randn(v.shape, generator=gen).to(v) for k, v in d_b.items()}
        pts["B'"], pts["AB'"] = (c, 0.0), (c / 2, 0.0)
        n1, c, n2 = plane_frame(bb, flat_inner(d_b, d_c), flat_inner(d_c, d_c))
    xs, ys = plane_axes(pts, n1, margin, grid, degenerate)

    def node(xy: tuple[float, float]) -> dict[str, torch.Tensor]:
        a, b = plane_coeffs(*xy, n1, c, n2)
        return {k: pa[k] + a * d_b[k] + b * d_c[k] for k in pa}

    def at(x: float, y: float) -> tuple[float, float]:
        return ev.evaluate(node((x, y)))

    def named(name: str) -> tuple[float, float]:
        if name in ("A", "B"):  # exact endpoints, no arithmetic on the weights
            return ev.evaluate(pa if name == "A" else pb)
        if name == "B'":
            return ev.evaluate(pc)
        if name == "AB'":
            return ev.evaluate(path_point(pa, pc, 0.5))
        return at(*pts[name])

    found = plane_grid(at, named, pts, xs, ys, progress, group or SINGLE,
                       lambda nodes, done: ev.evaluate_each(node, nodes, done))
    if found is None:  # another rank than 0: its points are with rank 0
        return None
    loss, acc, point_loss, point_acc = found
    return Plane(
        xs=xs.tolist(), ys=ys.tolist(), loss=loss.tolist(), acc=acc.tolist(),
        points={k: [float(v[0]), float(v[1])] for k, v in pts.items()},
        point_loss=point_loss, point_acc=point_acc, match=ends.match, data=split.data,
        split=split.split, device=str(ev.device),
        seconds=time.perf_counter() - t0 + ends.info.seconds, grid=grid, n=split.n,
        layers=ends.layers, anchor=anchor.ref, source=source.ref, distance_ab=n1,
        distance_ab_matched=math.hypot(*pts["B'"]), degenerate=degenerate,
    )


def loss_plane(
    anchor: Loaded,
    source: Loaded,
    split: Split,
    options: MatchOptions | str | None = "seed",
    grid: int = 21,
    margin: float = 0.25,
    device: str | torch.device = "cpu",
    progress: Progress | None = None,
    batch_size: int = 512,
    seed: int = 0,
    group: Group | None = None,
) -> Plane | None:
    """loss_plane(anchor, source, split, options="seed", grid=21, device=, progress=) -> Plane

    Match the source onto the anchor with `options` (MatchOptions, a SPEC string or None),
    then `plane_on` the endpoints."""
    from rotviz.limits import GRID, MARGIN
    from rotviz.match.endpoints import match_endpoints

    GRID.check(grid)
    MARGIN.check(margin)
    ends = match_endpoints(anchor, source, options, device, data=split)
    return plane_on(ends, split, grid, margin, device, progress, batch_size, seed, group)


def plane_figure(
    x: Sequence[float],
    y: Sequence[float],
    z: np.ndarray | Sequence[Sequence[float]],
    points: Mapping[str, tuple[float, float]],
    font_size: int = 14,
    title: str = "Test loss on the plane through A, B and B'",
    x_label: str = "distance along A → B (Euclidean, parameter units)",
    y_label: str = "distance towards B', orthogonal to A → B (Euclidean, parameter units)",
    colour_range: Sequence[float] | None = None,
) -> go.Figure:
    """Contour of the loss over a 2D slice of parameter space, with the models marked.

    `z[j][i]` is the loss at (x[i], y[j]) (`rotviz.analysis.planes.Plane`: xs, ys, loss, points);
    `points` maps the names in PLANE_MARKERS to plane coordinates. The colours span the
    loss's own range, clipped at its 95th percentile, unless `colour_range` gives one shared
    with the planes it is compared with.
    """
    import numpy as np
    import plotly.graph_objects as go

    from rotviz.plots import style
    from rotviz.plots.paths import PLANE_MARKERS

    z = np.asarray(z, dtype=float)
    # Log-spaced contours would hide the valley floor; clip the colour range at a high
    # percentile so one huge corner does not wash the picture out.
    hi = float(np.nanpercentile(z, 95)) if np.isfinite(z).any() else 1.0
    lo = float(np.nanmin(z))
    if colour_range is not None:
        lo, hi = map(float, colour_range)
    fig = go.Figure(go.Contour(
        x=list(map(float, x)), y=list(map(float, y)), z=z.tolist(), colorscale=style.SEQUENTIAL,
        zmin=lo, zmax=hi, name="test loss",
        colorbar={"title": {"text": "test loss (nats)", "side": "right"}},
        contours={"coloring": "heatmap", "showlabels": True},
        hovertemplate="(%{x:.2f}, %{y:.2f}): loss %{z:.3f}<extra></extra>",
    ))
    for i, (name, (px, py)) in enumerate(points.items()):
        fig.add_scatter(
            x=[float(px)], y=[float(py)], mode="markers+text", text=[name],
            textposition="top center",
            name=PLANE_MARKERS.get(name, name),
            marker={"symbol": style.marker(i), "size": 13, "color": style.color(i),
                    "line": {"color": "white", "width": 1.5}},
            textfont={"color": "white", "size": font_size + 1},
            hovertemplate=f"{PLANE_MARKERS.get(name, name)}<extra></extra>",
        )
    fig = style.finish(fig, title, x_label, y_label, "model", font_size, height=560)
    fig.update_layout(legend={"orientation": "h", "y": -0.2, "x": 0})
    fig.update_yaxes(scaleanchor="x", scaleratio=1)
    return fig


def _plot(d: dict, look: Style):
    return plane_figure(d["xs"], d["ys"], d["loss"], d["points"], font_size=look.font_size,
                        colour_range=look.colour_range)


def _rows(d: dict) -> list[dict]:
    return [{"x": x, "y": y, "loss": d["loss"][iy][ix], "acc": d["acc"][iy][ix]}
            for iy, y in enumerate(d["ys"]) for ix, x in enumerate(d["xs"])]


def _figures(d: dict, look: Style) -> dict:
    """The plane from above (contours) and as a surface to turn (height: the loss)."""
    from rotviz.plots.surface import loss_surface

    return {"loss_plane": _plot(d, look),
            "loss_plane_3d": loss_surface(d, log=look.log, font_size=look.font_size)}


SECTION = Section(
    "barrier", 20, "The loss plane",
    "A 2D slice of parameter space through the anchor **A**, the source **B** and the "
    "matched source **B'**. B and B' compute the same function (same loss), but B' lies "
    "closer to A, and the midpoint AB' sits lower than AB. Axes are true Euclidean "
    "distances. In 3D, height is the test loss; A, B, B' and the midpoints sit at their own "
    "exact losses.",
    defaults={"grid": 13}, hidden=("seed",), figures=_figures,
    tabs=("Contour (from above)", "3D surface (drag to turn)"),
    doing=lambda v: f"{v['grid']} x {v['grid']} grid")

PLANE = register(Measurement(
    "plane", "Loss plane", "2D loss grid through anchor, source and matched source",
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows, at_size=_at_size, needs_match=True,
    progress=True,
    at_size_help="matched at size and the plane evaluated with the three "
                 "checkpoints held as stored, each grid point built block by block",
    section=SECTION, order=20))

"""The loss plane through the anchor A, the source B and the matched source B' (the seed
paper's Figure 2; docs/landscape.md)."""

from __future__ import annotations

from rotviz.limits import BATCH_SIZE, GRID, MARGIN, SEED
from rotviz.measures.barrier import match_label
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

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
    from rotviz.analysis.landscape import plane_on
    from rotviz.dist import SINGLE

    return plane_on(ends, ctx.split, v["grid"], v["margin"], ctx.device, ctx.progress,
                    v["batch_size"], v["seed"], group=ctx.group or SINGLE)


def _at_size(ends, ctx: Context, v: dict):
    from rotviz.dist import SINGLE
    from rotviz.stream.sized import sized_plane

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


def _plot(d: dict, style: Style):
    from rotviz.plots.barrier import loss_plane

    return loss_plane(d["xs"], d["ys"], d["loss"], d["points"], style.font_size)


def _rows(d: dict) -> list[dict]:
    return [{"x": x, "y": y, "loss": d["loss"][iy][ix], "acc": d["acc"][iy][ix]}
            for iy, y in enumerate(d["ys"]) for ix, x in enumerate(d["xs"])]


def _figures(d: dict, style: Style) -> dict:
    """The plane from above (contours) and as a surface to turn (height: the loss)."""
    from rotviz.plots.slices import loss_surface

    return {"loss_plane": _plot(d, style),
            "loss_plane_3d": loss_surface(d, log=style.log, font_size=style.font_size)}


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
    at_size_help="matched streamed and the plane evaluated with the three "
                 "checkpoints held as stored, each grid point built block by block",
    section=SECTION, order=20))

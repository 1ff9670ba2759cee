"""Layer-wise barriers (Adilova et al., ICLR 2024): the barrier when only one block (or one
module kind) moves from the anchor to the matched source while the rest stays at the anchor,
and cumulatively, groups 0..i together; beside the same toward the source unmatched
(docs/landscape.md)."""

from __future__ import annotations

from rotviz.limits import BATCH_SIZE, POINTS
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

PARAMS = (
    Param("points", 11, f"number of alphas in [0, 1] on each group's path (default 11, "
          f"{POINTS.text})", POINTS, label="Points on each path", widget=(3, 41, 2),
          essential=True),
    Param("by", "block", "the groups interpolated one at a time: block (each block, then "
          "'rest': embeddings, final norm, head) or kind (q, k, v, o, ffn, norms, "
          "embeddings, head) (default block)", choices=("block", "kind"), label="Groups",
          essential=True),
    Param("compare", "yes", "yes: also the same groups toward the source unmatched (twice the "
          "time); no: the matched source only (default yes)", choices=("yes", "no"),
          label="Also without matching"),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.layerwise import layerwise_on

    return layerwise_on(ends, ctx.split, v["points"], v["by"], v["compare"] == "yes",
                        ctx.device, ctx.progress, v["batch_size"])


def _at_size(ends, ctx: Context, v: dict):
    from rotviz.dist import SINGLE
    from rotviz.stream.layerwise import sized_layerwise

    return sized_layerwise(ends, ctx.split, v["points"], v["by"], v["compare"] == "yes",
                           ctx.device, ctx.progress, v["batch_size"], ctx.group or SINGLE)


def _summary(r, how: str) -> str:
    top = max(range(len(r.groups)), key=lambda i: r.barrier[i])
    unm = "" if r.full_barrier_unmatched is None else \
        f" (unmatched {r.barrier_unmatched[top]:.4f}, full path {r.full_barrier_unmatched:.4f})"
    return (f"layer-wise barriers by {r.by} [{r.match}] on {r.device}{how}: largest "
            f"{r.by} {r.groups[top]} {r.barrier[top]:.4f}{unm}; full path {r.full_barrier:.4f}; "
            f"{len(r.groups)} groups x {len(r.alphas)} points on {r.n} {r.split} samples in "
            f"{r.seconds:.2f} s")


def _plot(d: dict, style: Style):
    from rotviz.plots.layerwise import layerwise_bars

    return layerwise_bars(d)


def _rows(d: dict) -> list[dict]:
    rows = []
    for i, g in enumerate(d["groups"]):
        row = {"by": d["by"], "group": g, "barrier": d["barrier"][i], "rise": d["rise"][i],
               "cumulative": d["cumulative"][i], "cum_barrier": d["cum_barrier"][i]}
        if d.get("barrier_unmatched") is not None:
            row.update(barrier_unmatched=d["barrier_unmatched"][i],
                       rise_unmatched=d["rise_unmatched"][i],
                       cum_barrier_unmatched=d["cum_barrier_unmatched"][i])
        rows.append(row)
    return rows


SECTION = Section(
    "landscape", 40, "3. Which layers make the barrier",
    "Adilova et al. (2024): move one block (or one kind of module) from A to B' while the "
    "rest stays at A, and measure the barrier of that path alone. Beside it, the same "
    "without matching, and the cumulative path (block after block), whose last bar is the "
    "full straight line.",
    defaults={"points": 5}, doing=lambda v: "matching, then one group at a time")

LAYERWISE = register(Measurement(
    "layerwise", "Layer-wise barriers",
    "barrier when one block or module kind moves to the matched source, the rest at the anchor",
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows, at_size=_at_size,
    at_size_help="matched streamed and each group's path evaluated with the anchor, "
                 "the matched source and the source held as stored, each point "
    "built block by block", section=SECTION, order=90))

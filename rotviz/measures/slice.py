"""Slices of the loss around one model: a line or a plane along seeded random directions,
filter-, layer- or not normalised (Li et al. 2018; rotviz.analysis.slices, docs/landscape.md)."""

from __future__ import annotations

from rotviz.limits import BATCH_SIZE, DIMS, GRID, HESSIAN_ITERATIONS, SEED, SPAN
from rotviz.measures.registry import Context, Measurement, register
from rotviz.params import Param, needs

PARAMS = (
    Param("dims", 2, f"1: a line, 2: a plane (default 2, {DIMS.text})", DIMS,
          label="Dimensions (1 line, 2 plane)", widget=(1, 2, 1)),
    Param("directions", "random", "random: seeded Gaussian directions; hessian: the top "
          "Hessian eigenvectors at the model (the sharpest directions; unit and orthonormal "
          "with --norm none) (default random)",
          choices=("random", "hessian"), label="Directions"),
    Param("norm", "filter", "filter: each output row scaled to that row's weight norm (Li et "
          "al.), layer: each tensor to its norm, none (default filter)",
          choices=("filter", "layer", "none"), label="Normalisation"),
    Param("biases", "zero", "biases and norm gains (1-D tensors): zero (the reference's "
          "biasbn off) or keep them in the directions (default zero)",
          choices=("zero", "keep"), label="Biases and norm gains"),
    Param("grid", 21, f"grid points per axis (default 21, {GRID.text})", GRID,
          label="Grid (points per axis)", widget=(5, 41, 2)),
    Param("span", 1.0, "half-width of each axis, in direction units (x = 1 moves each "
          f"filter by its own norm; default 1, {SPAN.text})", SPAN,
          label="Span (direction units)", widget=(0.1, 3.0, 0.1)),
    Param("seed", 0, "seed of the random directions, or of the Lanczos start of the Hessian "
          "ones (default 0)", SEED, label="Seed"),
    Param("iterations", 100, "with --directions hessian: Lanczos steps at most (default 100, "
          f"{HESSIAN_ITERATIONS.text})", HESSIAN_ITERATIONS, label="Lanczos steps (Hessian "
          "directions)", widget=(10, 300, 10)),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)


def _check(values: dict, given: set[str]) -> None:
    needs("--iterations", "iterations" in given, "--directions hessian (it bounds Lanczos)",
          values["directions"] == "hessian")


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.slices import slice_at

    return slice_at(ends.anchor, ctx.split, v["dims"], v["directions"], v["norm"],
                    v["biases"] == "keep", v["grid"], v["span"], v["seed"], ctx.device,
                    ctx.progress, v["batch_size"], steps=v["iterations"])


def _at_size(ends, ctx: Context, v: dict):
    from rotviz.dist import SINGLE
    from rotviz.stream.slices import sized_slice

    return sized_slice(ends.anchor_path, ctx.split, v["dims"], v["norm"], v["biases"] == "keep",
                       v["grid"], v["span"], v["seed"], ctx.device, ctx.progress,
                       v["batch_size"], ctx.group or SINGLE, name=ends.anchor_ref)


def _at_size_check(v: dict) -> None:
    from rotviz.stream.slices import refuse_directions

    refuse_directions(v["directions"])


def _summary(s, how: str) -> str:
    import numpy as np

    lo = np.asarray(s.loss, dtype=float)
    shape = f"{s.grid}x{s.grid} plane" if s.dims == 2 else f"{s.grid}-point line"
    eig = "" if not s.eigenvalues else \
        " (eigenvalues " + ", ".join(f"{e:.4g}" for e in s.eigenvalues) + ")"
    return (f"slice of {s.model}, {shape} on {s.device}{how}: {s.directions} directions{eig}, "
            f"{s.norm} normalised, biases {'kept' if s.keep_1d else 'zeroed'}, span "
            f"{s.span:g}; centre loss {s.centre_loss:.4f} (accuracy {s.centre_acc:.4f}), "
            f"loss {lo.min():.4f} to {lo.max():.4f} on {s.n} {s.split} samples in "
            f"{s.seconds:.2f} s")


def _plot(d: dict):
    from rotviz.plots.slices import slice_figure

    return slice_figure(d)


def _rows(d: dict) -> list[dict]:
    if d["dims"] == 1:
        return [{"x": x, "loss": lo, "acc": ac}
                for x, lo, ac in zip(d["xs"], d["loss"], d["acc"], strict=True)]
    return [{"x": x, "y": y, "loss": d["loss"][iy][ix], "acc": d["acc"][iy][ix]}
            for iy, y in enumerate(d["ys"]) for ix, x in enumerate(d["xs"])]


SLICE = register(Measurement(
    "slice", "Slice (random or Hessian directions)",
    "loss and accuracy on a line or plane of seeded random directions, or of the top Hessian "
    "eigenvectors, around one model",
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows, pair=False, check=_check,
    at_size=_at_size, at_size_check=_at_size_check,
    extra={"progress": True,
           "at_size_help": "sliced along random directions drawn tensor by tensor, each "
                           "grid point built block by block with the model held as stored"}))

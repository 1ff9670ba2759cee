"""Slices of the loss around one model, or around any point of a pair (the source, the
matched source, a point of the matched path, a merge): a line or a plane along seeded random,
Hessian, toward-the-other-model, symmetry-tangent or gauge-fixed directions, filter-, layer-,
unit- or not normalised (Li et al. 2018; rotviz.analysis.slices and .directions,
docs/landscape.md). One model by default; `--source` adds the second one (`source` below)."""

from __future__ import annotations

from rotviz.limits import ALPHA, BATCH_SIZE, DIMS, GRID, HESSIAN_ITERATIONS, SEED, SPAN
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param, needs
from rotviz.plots.figure_style import Style


def _params() -> tuple[Param, ...]:
    """The record's parameters; --merge lists the merge methods registered by then."""
    from rotviz.merging import methods

    # a merged centre merges the pair alone: the methods that take no base model
    names = tuple(m.name for m in methods() if not m.needs_base)
    return PARAMS[:1] + (
        Param("around", "anchor", "the slice's centre: anchor (the model), source (the "
              "second model, --source), matched (the source matched onto the model, B'), "
              "path ((1 - alpha) A + alpha B'), merged (A and B' merged by --merge with the "
              "source's weight --alpha) (default anchor)",
              choices=("anchor", "source", "matched", "path", "merged"), label="Centre",
              essential=True),
        Param("alpha", 0.5, "with --around path or merged: the position on the matched path, "
              f"or the source's weight in the merge (default 0.5, {ALPHA.text})", ALPHA,
              label="Alpha (path position / merge weight)", widget=(0.0, 1.0, 0.05)),
        Param("merge", "simple", f"with --around merged: the merge method, one of "
              f"{', '.join(names)} with its defaults (default simple: the average)",
              choices=names, label="Merge method (merged centre)"),
    ) + PARAMS[1:2] + (
        Param("toward", "matched", "with --directions toward: the point d1 runs to from the "
              "centre, matched (B') or source (B as it is) (default matched)",
              choices=("matched", "source"), label="Toward (toward directions)"),
    ) + PARAMS[2:]


PARAMS = (
    Param("dims", 2, f"1: a line, 2: a plane (default 2, {DIMS.text})", DIMS,
          label="Dimensions (1 line, 2 plane)", widget=(1, 2, 1)),
    Param("directions", "random", "random: seeded Gaussian directions; hessian: the top "
          "Hessian eigenvectors at the centre (the sharpest directions; unit and orthonormal "
          "with --norm none); toward: d1 from the centre to the other model (--toward; with "
          "--norm none and --biases keep x = 1 is it), d2 random, orthogonal to d1; tangent: "
          "inside the symmetry orbit's tangent space at the centre (flat to first order); "
          "gauge: random with the symmetry tangents projected out (default random)",
          choices=("random", "hessian", "toward", "tangent", "gauge"), label="Directions",
          essential=True),
    Param("norm", "filter", "filter: each output row scaled to that row's weight norm (Li et "
          "al.), layer: each tensor to its norm, unit: each FFN unit (input and gate rows, "
          "output column) and each head (Q, K, V rows, O columns; a KV group under GQA) "
          "together to its weights' norm, other tensors as filter; none (default filter)",
          choices=("filter", "layer", "unit", "none"), label="Normalisation"),
    Param("biases", "zero", "biases and norm gains (1-D tensors): zero (the reference's "
          "biasbn off) or keep them in the directions (default zero)",
          choices=("zero", "keep"), label="Biases and norm gains"),
    Param("grid", 21, f"grid points per axis (default 21, {GRID.text})", GRID,
          label="Grid (points per axis)", widget=(5, 41, 2), essential=True),
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
    needs("--alpha", "alpha" in given, "--around path or merged",
          values["around"] in ("path", "merged"))
    needs("--merge", "merge" in given, "--around merged", values["around"] == "merged")
    needs("--toward", "toward" in given, "--directions toward",
          values["directions"] == "toward")


def _source(values: dict) -> str | None:
    """Which of these values needs the second model (--source), or None."""
    from rotviz.analysis.directions import needs_source

    return needs_source(values["around"], values["directions"])


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.directions import slice_around

    return slice_around(ends, ctx.split, v["around"], v["alpha"], v["merge"], v["toward"],
                        v["directions"], dims=v["dims"], norm=v["norm"],
                        keep_1d=v["biases"] == "keep", grid=v["grid"], span=v["span"],
                        seed=v["seed"], device=ctx.device, progress=ctx.progress,
                        batch_size=v["batch_size"], steps=v["iterations"])


def _where(s) -> str:
    """Where the slice is centred, in words (empty: around the model itself)."""
    if s.around == "source":
        return f" around {s.source}"
    if s.around == "matched":
        return f" around {s.source} matched onto it ({s.match})"
    if s.around == "path":
        return f" at alpha {s.alpha:g} of the path to {s.source} matched ({s.match})"
    if s.around == "merged":
        return f" merged with {s.source} matched ({s.match}; {s.merge}, weight {s.alpha:g})"
    return ""


def _at_size(ends, ctx: Context, v: dict):
    from rotviz.dist import SINGLE
    from rotviz.stream.slices import sized_slice

    return sized_slice(ends.anchor_path, ctx.split, v["dims"], v["norm"], v["biases"] == "keep",
                       v["grid"], v["span"], v["seed"], ctx.device, ctx.progress,
                       v["batch_size"], ctx.group or SINGLE, name=ends.anchor_ref)


def _at_size_check(v: dict) -> None:
    from rotviz.errors import RotvizError
    from rotviz.stream.slices import refuse_directions

    refuse_directions(v["directions"])
    if v["around"] != "anchor":
        raise RotvizError(f"--around {v['around']} needs the pair in memory; at size a slice "
                          "is taken around the model itself (--around anchor)")
    if v["norm"] == "unit":
        raise RotvizError("--norm unit groups each head's and FFN unit's rows across tensors, "
                          "which needs the model in memory; at size use --norm filter, layer "
                          "or none")


def _summary(s, how: str) -> str:
    import numpy as np

    lo = np.asarray(s.loss, dtype=float)
    shape = f"{s.grid}x{s.grid} plane" if s.dims == 2 else f"{s.grid}-point line"
    eig = "" if not s.eigenvalues else \
        " (eigenvalues " + ", ".join(f"{e:.4g}" for e in s.eigenvalues) + ")"
    if s.converged is False:
        eig += f" (not converged (residual {s.residual:.2g}): raise --iterations)"
    if s.toward:
        goal = "B" if s.toward == "source" else "B'"
        eig += f" (toward {goal}, its loss {s.target_loss:.4f})"
    if s.tangent_cosine is not None:
        eig += f" (largest |cos| with a tangent {s.tangent_cosine:.2g})"
    return (f"slice of {s.model}{_where(s)}, {shape} on {s.device}{how}: {s.directions} "
            f"directions{eig}, {s.norm} normalised, biases {'kept' if s.keep_1d else 'zeroed'}, "
            f"span {s.span:g}; centre loss {s.centre_loss:.4f} (accuracy {s.centre_acc:.4f}), "
            f"loss {lo.min():.4f} to {lo.max():.4f} on {s.n} {s.split} samples in "
            f"{s.seconds:.2f} s")


def _plot(d: dict, style: Style):
    from rotviz.plots.slices import slice_figure

    return slice_figure(d, log=style.log, font_size=style.font_size)


def _rows(d: dict) -> list[dict]:
    if d["dims"] == 1:
        return [{"x": x, "loss": lo, "acc": ac}
                for x, lo, ac in zip(d["xs"], d["loss"], d["acc"], strict=True)]
    return [{"x": x, "y": y, "loss": d["loss"][iy][ix], "acc": d["acc"][iy][ix]}
            for iy, y in enumerate(d["ys"]) for ix, x in enumerate(d["xs"])]


# the words for a slice's centre, in its caption on the Landscape page
CENTRE_WORDS = {"anchor": "the anchor", "source": "the source B", "matched": "B'",
                "path": "the point of the matched path", "merged": "the merged model",
                "point": "the centre"}


def _caption(d: dict) -> str:
    """The line under the slice on the Landscape page: its centre's own numbers."""
    return (f"Centre: {CENTRE_WORDS.get(d.get('around'), 'the centre')}, test loss "
            f"{d['centre_loss']:.4f} nats (accuracy {d['centre_acc']:.3f}). Axes are in "
            "direction units: 1 moves each filter (or unit) by its own norm."
            + ("" if d.get("target_loss") is None else
               f" The target's own loss: {d['target_loss']:.4f} nats.")
            + ("" if d.get("tangent_cosine") is None else
               f" Largest |cosine| of a direction with a symmetry tangent: "
               f"{d['tangent_cosine']:.2g}."))


def _doing(v: dict) -> str:
    where = CENTRE_WORDS.get(v["around"], "the centre")
    g = v["grid"]
    return f"{g} x {g} grid around {where}" if v["dims"] == 2 else f"{g} points around {where}"


SECTION = Section(
    "landscape", 10, "1. A slice around the anchor, or any point of the pair",
    "Two seeded directions through a centre: the anchor **A**, the source **B**, the "
    "matched source **B'**, a point of the matched path, or the merged model (the last "
    "three use the matching chosen above). The directions are random, the sharpest Hessian "
    "eigenvectors, the line toward B' (or B), the symmetry tangents (along which the "
    "function does not change) or gauge-fixed random directions (the tangents removed). "
    "Each is scaled to the weights' own size: filter by filter (Li et al., 2018), or unit "
    "by unit (an FFN neuron's rows and column, a head's Q, K, V rows and O columns), which "
    "does not depend on which member of the symmetry class is sliced. The star is the "
    "centre; a wide, low valley around it is a flat minimum. Turn on the log scale when a "
    "wall hides the basin.",
    defaults={"grid": 11}, caption=_caption, doing=_doing,
    log="Log colour scale (log10 of the loss)")

SLICE = register(Measurement(
    "slice", "Slice (random, Hessian, toward, tangent or gauge-fixed directions)",
    "loss and accuracy on a line or plane of seeded random directions, the top Hessian "
    "eigenvectors, the direction toward a second model, symmetry tangents or gauge-fixed "
    "random directions, around one model or (with --source) around the source, the matched "
    "source, a point of the matched path or a merge",
    _run, _params, summary=_summary, plot=_plot, rows=_rows, pair=False, check=_check,
    source=_source, at_size=_at_size, at_size_check=_at_size_check,
    progress=True,
    source_use="--around source, matched, path or merged, or --directions toward",
    at_size_help="sliced around the model along random directions drawn tensor by "
                 "tensor, each grid point built block by block with the model held "
                 "as stored", section=SECTION, order=80))

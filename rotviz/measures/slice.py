"""Slices of the loss around one model, or around any point of a pair (the source, the
matched source, a point of the matched path, a merge): a line or a plane along seeded random,
Hessian, toward-the-other-model, symmetry-tangent or gauge-fixed directions, filter-, layer-,
unit- or not normalised (Li et al. 2018; the directions: rotviz.analysis.directions;
docs/landscape.md, "slice"). One model by default; `--source` adds the second one
(`source` below).

The record, its computation (`slice_around`: any centre of the pair, any kind of direction,
laid through rotviz.analysis.loss_grid.slice_with) and its figure (a line; a contour
beside a 3D surface). At size: rotviz.atsize.slice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from rotviz.errors import RotvizError
from rotviz.limits import ALPHA, BATCH_SIZE, DIMS, GRID, HESSIAN_ITERATIONS, SEED, SPAN
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param, needs
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import torch

    from rotviz.analysis.loss_grid import Slice
    from rotviz.data.split import Split

    Tensor = torch.Tensor

CENTRES = ("anchor", "source", "matched", "path", "merged")
TOWARD = ("matched", "source")


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
    return needs_source(values["around"], values["directions"])


def needs_source(around: str, directions: str) -> str | None:
    """The option that needs a second model (a phrase for the one-line error), or None."""
    if around != "anchor":
        return f"--around {around}"
    if directions == "toward":
        return "--directions toward"
    return None


def centre_state(ends, around: str, alpha: float = 0.5, merge: str = "simple",
                 split: Split | None = None, device: str | torch.device = "cpu"
                 ) -> Mapping[str, Tensor] | None:
    """The parameter set a slice is centred on, from held endpoints (rotviz.match.endpoints):
    `anchor` A (None: the anchor's own state), `source` B, `matched` B', `path` the point
    (1 - alpha) A + alpha B' of the matched straight path (rotviz.analysis.paths), `merged`
    the matched pair merged by the registered method `merge` with the source's weight
    `alpha` (`simple` at 0.5 is the plain average; methods with statistics take them from
    the split's train sibling, rotviz.analysis.merges.merge_on)."""
    if around not in CENTRES:
        raise RotvizError(f"unknown --around '{around}': use one of {', '.join(CENTRES)}")
    if around == "anchor":
        return None
    if around == "source":
        return ends.source.state
    if around == "matched":
        return ends.matched
    if around == "path":
        from rotviz.analysis.paths import path_point

        return path_point(ends.anchor.state, ends.matched, alpha)
    from rotviz.analysis.merges import merge_on

    if split is None:
        raise RotvizError("--around merged needs data for the merge: give --data")
    return merge_on(ends, merge, split, alpha, device).state


def slice_around(ends, split: Split, around: str = "anchor", alpha: float = 0.5,
                 merge: str = "simple", toward: str = "matched", directions: str = "random",
                 **kw) -> Slice:
    """slice_around(endpoints, split, around="matched", directions="toward", ...) -> Slice

    A slice (rotviz.analysis.loss_grid.slice_with, whose keywords `kw` takes) centred on a
    point of held endpoints (`centre_state`), with `toward` directions pointing at the
    matched source B' (`toward="matched"`) or the source B as it is (`"source"`). Endpoints
    of one model (its anchor and source the same reference) can only be sliced around the
    anchor."""
    from rotviz.analysis.loss_grid import slice_with

    if toward not in TOWARD:
        raise RotvizError(f"unknown --toward '{toward}': use one of {', '.join(TOWARD)}")
    why = needs_source(around, directions)
    if why and ends.source_ref == ends.anchor_ref:
        raise RotvizError(f"{why} needs a second model: add --source MODEL (and --match SPEC)")
    point = centre_state(ends, around, alpha, merge, split, kw.get("device", "cpu"))
    target = None
    if directions == "toward":
        target = ends.matched if toward == "matched" else ends.source.state
    s = slice_with(ends.anchor, split, directions=directions, point=point, target=target, **kw)
    return replace(s, around=around, alpha=float(alpha) if around in ("path", "merged") else None,
                   merge=merge if around == "merged" else None,
                   toward=toward if directions == "toward" else None,
                   source=ends.source_ref if why else "", match=ends.match if why else "none")


def _run(ends, ctx: Context, v: dict):
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
    from rotviz.atsize.slice import slice_at_size

    return slice_at_size(ends, ctx, v)


def _at_size_check(v: dict) -> None:
    from rotviz.atsize.slice import check_at_size

    check_at_size(v)


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


DIRECTION_WORDS = {"random": "random", "hessian": "Hessian-eigenvector", "toward": "toward",
                   "tangent": "symmetry-tangent", "gauge": "gauge-fixed random",
                   "given": "given"}


def _centre(d: Mapping) -> str:
    """The slice's centre in words (the model itself unless `around` says otherwise)."""
    model, source = d.get("model") or "the model", d.get("source") or "the source"
    around = d.get("around", "anchor")
    if around == "source":
        return source
    if around == "matched":
        return f"{source} matched onto {model}"
    if around == "path":
        return f"alpha {d.get('alpha', 0.5):g} of the path {model} → {source} matched"
    if around == "merged":
        return f"{model} merged with {source} matched ({d.get('merge')})"
    return model


def _title(d: Mapping) -> str:
    what = "plane" if d["dims"] == 2 else "line"
    keep = "kept" if d.get("keep_1d") else "zeroed"
    kind = DIRECTION_WORDS.get(d.get("directions", "random"), d.get("directions", "random"))
    return (f"Test loss on a {kind} {what} around {_centre(d)} "
            f"({d.get('norm')} normalised, biases {keep}, seed {d.get('seed')})")


def _target_name(d: Mapping) -> str:
    return "B (target)" if d.get("toward") == "source" else "B' (target)"


def slice_line(d: Mapping, log: bool = False, font_size: int = 14,
               zmin: float | None = None, zmax: float | None = None,
               acc_range: Sequence[float] | None = None):
    """A 1D slice: loss (and accuracy, dotted, on a second axis) against x. The accuracy
    axis follows the data unless `acc_range` is given (`style.ACC_FIXED`: 0-1)."""
    import numpy as np
    from plotly.subplots import make_subplots

    from rotviz.plots import style
    from rotviz.plots.surface import axis_title as _axis

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(x=d["xs"], y=d["loss"], mode="lines+markers", name="test loss",
                    line={"color": style.color(0), "dash": style.dash(0)},
                    marker={"symbol": style.marker(0)})
    fig.add_scatter(x=d["xs"], y=d["acc"], mode="lines+markers", name="test accuracy",
                    line={"color": style.color(1), "dash": style.dash(2)},
                    marker={"symbol": style.marker(1)}, secondary_y=True)
    fig.add_scatter(x=[0.0], y=[d["centre_loss"]], mode="markers", name="the model (centre)",
                    marker={"color": style.OKABE_ITO[-1], "size": 12, "symbol": "star"})
    if d.get("target_x") is not None and d.get("target_loss") is not None:
        fig.add_scatter(x=[d["target_x"]], y=[d["target_loss"]], mode="markers",
                        name=_target_name(d), marker={"color": style.color(2), "size": 11,
                                                      "symbol": "diamond"})
    fig = style.finish(fig, _title(d), _axis(d, 1), style.LOSS, "curve", font_size)
    fig.update_yaxes(title_text=style.ACCURACY, secondary_y=True,
                     range=list(acc_range) if acc_range is not None else
                     style.acc_range(d["acc"]))
    if log:
        style.log_axis(fig, "y", secondary_y=False)
    if zmin is not None or zmax is not None:
        lo = zmin if zmin is not None else float(np.nanmin(d["loss"]))
        hi = zmax if zmax is not None else float(np.nanmax(d["loss"]))
        fig.update_yaxes(range=[np.log10(lo), np.log10(hi)] if log else [lo, hi],
                         secondary_y=False)
    return fig


def slice_figure(d: Mapping, log: bool = False, zmin: float | None = None,
                 zmax: float | None = None, font_size: int = 14,
                 acc_range: Sequence[float] | None = None):
    """A slice result (`Slice.to_dict()`): a line in 1D (its accuracy axis: `slice_line`);
    in 2D a contour beside a 3D surface, one colour scale (`zmin`/`zmax` in loss units,
    log10 of them with `log`)."""
    if d["dims"] == 1:
        return slice_line(d, log, font_size, zmin, zmax, acc_range)
    import numpy as np
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from rotviz.plots import style
    from rotviz.plots.surface import LOG_BAR, LOSS_BAR, colour_range, colours
    from rotviz.plots.surface import axis_title as _axis

    z = np.asarray(d["loss"], dtype=float)
    c = colours(z, log)
    lo, hi = colour_range(zmin, zmax, z, log)
    bar = LOG_BAR if log else LOSS_BAR
    fig = make_subplots(rows=1, cols=2, specs=[[{"type": "xy"}, {"type": "scene"}]],
                        subplot_titles=("contour", "surface"), horizontal_spacing=0.08)
    fig.add_trace(go.Contour(
        x=d["xs"], y=d["ys"], z=c.tolist(), colorscale=style.SEQUENTIAL, zmin=lo, zmax=hi,
        name="test loss", contours={"coloring": "heatmap", "showlabels": True},
        colorbar={"title": {"text": bar, "side": "right"}, "x": 0.46},
        hovertemplate="(%{x:.2f}, %{y:.2f}): %{z:.3f}<extra></extra>"), row=1, col=1)
    fig.add_scatter(x=[0.0], y=[0.0], mode="markers", name="the model (centre)",
                    marker={"color": style.OKABE_ITO[-1], "size": 12, "symbol": "star",
                            "line": {"color": "white", "width": 1.5}}, row=1, col=1)
    if d.get("target_x") is not None:
        fig.add_scatter(x=[d["target_x"]], y=[0.0], mode="markers", name=_target_name(d),
                        marker={"color": style.color(2), "size": 11, "symbol": "diamond",
                                "line": {"color": "white", "width": 1.5}}, row=1, col=1)
    fig.add_trace(go.Surface(
        x=d["xs"], y=d["ys"], z=z.tolist(), surfacecolor=c.tolist(), cmin=lo, cmax=hi,
        colorscale=style.SEQUENTIAL, name="test loss surface",
        showscale=False,  # the contour's colour bar is the surface's too: one scale
        hovertemplate="(%{x:.2f}, %{y:.2f}): loss %{z:.3f}<extra></extra>"), row=1, col=2)
    fig.add_trace(go.Scatter3d(
        x=[0.0], y=[0.0], z=[d["centre_loss"]], mode="markers", name="the model (centre, 3D)",
        marker={"color": style.OKABE_ITO[-1], "size": 6, "symbol": "diamond"}), row=1, col=2)
    fig = style.finish(fig, _title(d), _axis(d, 1), _axis(d, 2), "marker", font_size,
                       height=600)
    fig.update_layout(scene={"xaxis_title": "direction 1", "yaxis_title": "direction 2",
                             "zaxis_title": LOSS_BAR},
                      legend={"orientation": "h", "y": -0.15, "x": 0})
    return fig


def slice_plot(d: dict, style: Style | None = None):
    """The record's figure, drawn as the page asks (`Style`): its font, a log loss axis (log
    colours in 2D), the page's shared colour range (2D) or loss range (1D), its accuracy
    axis (1D: the page's shared range, or 0-1 with `fixed_accuracy`)."""
    style = style or Style()
    lo, hi = style.colour_range or (None, None)
    acc = style.accuracy_range or ((0.0, 1.02) if style.fixed_accuracy else None)
    return slice_figure(d, style.log, lo, hi, style.font_size, acc)


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
    _run, _params, summary=_summary, plot=slice_plot, rows=_rows, pair=False, check=_check,
    source=_source, at_size=_at_size, at_size_check=_at_size_check,
    progress=True,
    source_use="--around source, matched, path or merged, or --directions toward",
    at_size_help="sliced around the model along random directions drawn tensor by "
                 "tensor, each grid point built block by block with the model held "
                 "as stored", section=SECTION, order=80))

"""Sharpness along the straight path: the top Hessian eigenvalue (and, optionally, the
Hutchinson trace) of the split's mean loss at points theta(alpha) = (1 - alpha) A + alpha B'
between the anchor A and the matched source B', and, for comparison, on the unmatched path
A -> B.

Why: a loss barrier says the midpoint is high; the curvature says how the basin's shape
changes on the way. On the unmatched path the points in the middle are far from any
minimum and the curvature there is usually larger (and may turn negative); matching moves
B into A's basin, so the matched path's curvature should stay close to the endpoints'.

Every point is measured by `rotviz.measures.hessian.hessian` at that parameter set with the
same seed, the same Lanczos steps and the same examples, so the numbers at alpha = 0 and 1
are exactly what `rotviz hessian` reports at A and at B'. B and B' compute one function:
when the matching is made of permutations and rotations only (no rescale) their Hessians are
conjugate by an orthogonal map and the two paths' values at alpha = 1 agree; a rescale
changes the spectrum while keeping the function (Dinh et al., 2017), so they need not.

The record, its computation (`sharpness_on`) and its figure (`sharpness_figure`: one line
per path) are this module (docs/landscape.md, "sharpness").
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from rotviz.limits import (
    BATCH_SIZE,
    HESSIAN_EXAMPLES,
    HESSIAN_ITERATIONS,
    HESSIAN_PROBES,
    HESSIAN_TOP,
    SEED,
    SHARPNESS_POINTS,
)
from rotviz.measures.registry import Context, Measurement, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

    from rotviz.data.split import Split
    from rotviz.match.endpoints import HeldEndpoints
    from rotviz.types import Progress

    Tensor = torch.Tensor

PARAMS = (
    Param("points", 5, "alphas in [0, 1] where the Hessian is taken, ends included "
          f"(default 5, {SHARPNESS_POINTS.text})", SHARPNESS_POINTS,
          label="Points on the path", widget=(2, 21, 1)),
    Param("top", 1, f"Hessian eigenvalues per point, largest first ({HESSIAN_TOP.text})",
          HESSIAN_TOP, label="Top eigenvalues", widget=(1, 10, 1)),
    Param("trace", 0, "Hutchinson probes for the trace at each point (0: no trace; "
          f"{HESSIAN_PROBES.text})", HESSIAN_PROBES, label="Trace probes (0: off)",
          widget=(0, 100, 5)),
    Param("compare", "yes", "yes: also the unmatched path A -> B (twice the time); no: the "
          "matched path only (default yes)", choices=("yes", "no"),
          label="Compare with the unmatched path"),
    Param("iterations", 50, f"Lanczos steps at most per point ({HESSIAN_ITERATIONS.text})",
          HESSIAN_ITERATIONS, label="Lanczos steps", widget=(10, 300, 10)),
    Param("examples", 256, "examples of the split the loss is taken on, the first ones "
          f"(default 256, {HESSIAN_EXAMPLES.text})", HESSIAN_EXAMPLES, label="Examples",
          widget=(16, 2048, 16)),
    Param("seed", 0, "seed of the Lanczos start and the probes, the same at every point "
          "(default 0)", SEED, label="Seed"),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)


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
    # converged (rotviz.measures.hessian's `residual` and `converged`)
    residual: float = 0.0
    converged: bool = True
    data: str = ""  # the data reference the split was read from (digits, text:FILE)

    def to_dict(self) -> dict:
        return asdict(self)


def _along(ends: HeldEndpoints, b: Mapping[str, Tensor], split: Split, alphas: list[float],
           device, top: int, probes: int, seed: int, batch_size: int, steps: int,
           dtype, progress: Progress | None, done: int, total: int, label: str) -> dict:
    from rotviz.analysis.paths import path_point
    from rotviz.measures.hessian import hessian

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
    import numpy as np

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


def _check(values: dict, given: set[str]) -> None:
    """--top at most --iterations, as the hessian record checks it (one Ritz value a step)."""
    from rotviz.measures.hessian import check_top

    check_top(values, given)


def _run(ends, ctx: Context, v: dict):
    split = ctx.split.subset(min(v["examples"], ctx.split.n))
    return sharpness_on(ends, split, v["points"], ctx.device, v["top"], v["trace"],
                        v["compare"] == "yes", v["seed"], v["batch_size"], v["iterations"],
                        progress=ctx.progress)


def _summary(r, how: str) -> str:
    def span(xs):
        return f"{min(xs):.4g} to {max(xs):.4g}"

    un = "" if r.unmatched is None else f"; unmatched {span(r.unmatched)}"
    if not r.converged:
        un += f" (not converged (residual {r.residual:.2g}): raise --iterations)"
    return (f"sharpness on {r.device}{how}: top Hessian eigenvalue along {len(r.alphas)} "
            f"alphas, matched ({r.match}) {span(r.matched)}{un}{_traces(r, span)}; on {r.n} "
            f"{r.split} samples, {r.n_params} parameters, {r.hvps} Hessian-vector products "
            f"in {r.seconds:.2f} s")


def _traces(r, span) -> str:
    """The traces' span per path and their largest standard error; from one probe there is
    none (None in the result, null in the JSON), and the line says so."""
    if r.matched_trace is None:
        return ""
    paths = [("matched", r.matched_trace, r.matched_trace_se)]
    if r.unmatched_trace is not None:
        paths.append(("unmatched", r.unmatched_trace, r.unmatched_trace_se))
    ses = [e for _, _, se in paths for e in se]
    err = "n/a (one probe)" if None in ses else f"at most {max(ses):.2g}"
    return ("; trace " + ", ".join(f"{name} {span(tr)}" for name, tr, _ in paths)
            + f" (standard error {err})")


def sharpness_figure(d: dict, style: Style | None = None):
    """One line per path: the top eigenvalue at each alpha (the trace, when measured, is in
    the hover text and the table, its scale being far from the eigenvalue's); `style.log`:
    the eigenvalue on a log axis (where every point's top eigenvalue is positive)."""
    import plotly.graph_objects as go

    from rotviz.plots import style as look

    font_size = (style or Style()).font_size
    fig = go.Figure()
    lines = [("matched (A to B')", "matched", 0)]
    if d.get("unmatched") is not None:
        lines.append(("unmatched (A to B)", "unmatched", 1))
    for name, key, i in lines:
        fig.add_scatter(x=d["alphas"], y=d[key], mode="lines+markers", name=name,
                        line={"color": look.color(i), "dash": look.dash(i)},
                        marker={"symbol": look.marker(i)},
                        hovertemplate="alpha %{x:.3g}: %{y:.4g}<extra>" + name + "</extra>")
    look.finish(fig, f"Sharpness along the path<br>{d['model']} to {d['source']} on "
                 f"{look.evaluated_on(d)}",
                 "alpha (0: anchor A, 1: source B or B'; unitless)", Y_TITLE, "path",
                 font_size)
    # the title stands off the image's left edge (flush at x = 0, kaleido cut its first
    # letter off) and the pair's names go on a second line (on one, two zoo names and the
    # data ran off the right edge); the two-line axis title gets room to its left
    fig.update_layout(title={"pad": {"l": 12}}, margin={"l": 100, "t": 90})
    if style is not None and style.log:
        look.log_axis(fig, "y")
    return fig


# the eigenvalue's axis title in two lines: on one (rotviz.measures.hessian.EIGENVALUE, written
# for a horizontal axis on the test split) it is longer than the plot is high, and kaleido
# clipped both ends; the split is the title's, so the unit alone stays here
Y_TITLE = "top Hessian eigenvalue<br>(nats per unit parameter², curvature of the loss)"


def _rows(d: dict) -> list[dict]:
    rows = []
    for path in ("matched", "unmatched"):
        if d.get(path) is None:
            continue
        tr, se = d.get(f"{path}_trace"), d.get(f"{path}_trace_se")
        rows += [{"path": path, "alpha": a, "top_eigenvalue": d[path][i],
                  "loss": d[f"{path}_loss"][i], "trace": None if tr is None else tr[i],
                  "trace_se": None if se is None else se[i]}
                 for i, a in enumerate(d["alphas"])]
    return rows


SHARPNESS = register(Measurement(
    "sharpness", "Sharpness along the path",
    "the top Hessian eigenvalue (and trace) against alpha on the matched path A -> B' and "
    "the unmatched path A -> B",
    _run, PARAMS, summary=_summary, plot=sharpness_figure, rows=_rows, check=_check,
    refusal="Hessian-vector products differentiate the whole model twice, held in memory",
    progress=True, order=120))

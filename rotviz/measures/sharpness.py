"""Sharpness along the path: the top Hessian eigenvalue (and optionally the Hutchinson
trace) at points of the straight path A -> B', and of the unmatched path A -> B beside it
(rotviz.analysis.sharpness, docs/landscape.md)."""

from __future__ import annotations

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


def _check(values: dict, given: set[str]) -> None:
    """--top at most --iterations, as the hessian record checks it (one Ritz value a step)."""
    from rotviz.measures.hessian import check_top

    check_top(values, given)


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.sharpness import sharpness_on

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


def _plot(d: dict, style: Style):
    from rotviz.plots.sharpness import sharpness_figure

    return sharpness_figure(d)


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
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows, check=_check,
    refusal="Hessian-vector products differentiate the whole model twice, held in memory",
    progress=True, order=120))

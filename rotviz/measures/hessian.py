"""Curvature of one model's test loss: the top Hessian eigenvalues (Lanczos), the trace
(Hutchinson, with its standard error), the eigenvalue density (stochastic Lanczos
quadrature), for the whole model and per block or module kind (docs/landscape.md)."""

from __future__ import annotations

from rotviz.limits import (
    BATCH_SIZE,
    HESSIAN_DENSITY,
    HESSIAN_EXAMPLES,
    HESSIAN_ITERATIONS,
    HESSIAN_PROBES,
    HESSIAN_TOP,
    SEED,
)
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.plots.figure_style import Style

BY = ("none", "block", "kind")
ONE_PROBE = "n/a (one probe)"  # the text for a standard error one probe cannot give


def _params():
    from rotviz.params import Param

    return (
        Param("top", 3, f"Hessian eigenvalues to report, largest first ({HESSIAN_TOP.text})",
              HESSIAN_TOP, label="Top eigenvalues", widget=(1, 20, 1), essential=True),
        Param("trace", 0, "Hutchinson probes for the trace and its standard error (0: no "
              "trace; at least the number of parameters: the exact trace; "
              f"{HESSIAN_PROBES.text})", HESSIAN_PROBES, label="Trace probes (0: off)",
              widget=(0, 200, 10)),
        Param("density", 0, "probes of the eigenvalue density by stochastic Lanczos "
              f"quadrature (0: no density; {HESSIAN_DENSITY.text})", HESSIAN_DENSITY,
              label="Density probes (0: off)", widget=(0, 20, 1)),
        Param("by", "none", "also per group of parameters: block or kind (Q/K, V/O, FFN, "
              "norms, embeddings, head)", choices=BY, label="Per group", essential=True),
        Param("iterations", 100, f"Lanczos steps at most ({HESSIAN_ITERATIONS.text})",
              HESSIAN_ITERATIONS, label="Lanczos steps", widget=(10, 300, 10)),
        Param("examples", 512, "examples of the split the loss is taken on, the first ones "
              f"({HESSIAN_EXAMPLES.text})", HESSIAN_EXAMPLES, label="Examples",
              widget=(16, 2048, 16)),
        Param("seed", 0, "seed of the Lanczos start and the probes (default 0)", SEED,
              label="Seed"),
        Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
              BATCH_SIZE, label="Evaluation batch size"),
    )


def check_top(values: dict, given: set[str]) -> None:
    """Lanczos gives at most one Ritz value per step: more eigenvalues than steps would
    quietly come back fewer (or as unconverged Ritz values), so it is refused."""
    from rotviz.errors import RotvizError

    if values["top"] > values["iterations"]:
        raise RotvizError(f"--top {values['top']} asks for more eigenvalues than "
                          f"--iterations {values['iterations']} Lanczos steps can give: use "
                          f"--top at most {values['iterations']}, or more --iterations")


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.hessian import hessian

    split = ctx.split.subset(min(v["examples"], ctx.split.n))
    r = hessian(ends.anchor, None, split, ctx.device, v["top"], v["trace"], v["by"],
                v["seed"], v["batch_size"], v["iterations"], v["density"],
                progress=ctx.progress)
    r.model = ends.anchor_ref
    return r


def _summary(r, how: str) -> str:
    eig = ", ".join(f"{e:.4g}" for e in r.eigenvalues)
    if not r.converged:
        eig += f" (not converged (residual {r.residual:.2g}): raise --iterations)"
    se = ONE_PROBE if r.trace_se is None else f"{r.trace_se:.2g}"  # None: from one probe
    tr = "" if r.trace is None else f"; trace {r.trace:.4g} +- {se}"
    by = "" if not r.groups else f"; {len(r.groups)} groups by {r.by}"
    return (f"hessian on {r.device}{how}: top eigenvalues {eig}{tr}{by}; loss {r.loss:.4f} "
            f"on {r.n} {r.split} samples, {r.n_params} parameters, {r.hvps} Hessian-vector "
            f"products in {r.seconds:.2f} s")


def _plot(d: dict, style: Style):
    from rotviz.plots.hessian import hessian_figure

    return hessian_figure(d)


def _rows(d: dict) -> list[dict]:
    rows = [{"group": "whole model", "rank": i + 1, "eigenvalue": e,
             "trace": d["trace"], "trace_se": d["trace_se"]}
            for i, e in enumerate(d["eigenvalues"])]
    for g in d.get("groups") or []:
        rows += [{"group": g["group"], "rank": i + 1, "eigenvalue": e, "trace": g["trace"],
                  "trace_se": g["trace_se"]} for i, e in enumerate(g["eigenvalues"])]
    return rows


def _caption(d: dict) -> str:
    """The line under the eigenvalues on the Landscape page."""
    top = ", ".join(f"{v:.4g}" for v in d["eigenvalues"])
    trace, se = d.get("trace"), d.get("trace_se")
    se = "n/a (one probe)" if se is None else f"{se:.2g}"  # one probe: no spread, no error
    return (f"Top eigenvalues, largest first: {top}."
            + (f" Trace {trace:.4g} ± {se} (Hutchinson, standard error)."
               if isinstance(trace, float) else "")
            + ("" if d.get("converged") is not False else
               f" Not converged (residual {d['residual']:.2g}): these are Ritz values short "
               "of the Hessian's eigenvalues; raise the Lanczos steps."))


SECTION = Section(
    "landscape", 50, "4. How sharp the anchor's minimum is",
    "The largest eigenvalues of the Hessian of the test loss at the anchor (Lanczos on "
    "Hessian-vector products): the curvature along the steepest directions. Larger means a "
    "sharper minimum. Per group splits the parameters by block or by module kind.",
    defaults={"iterations": 20, "examples": 128}, caption=_caption,
    doing=lambda v: f"top {v['top']} eigenvalues, {v['iterations']} Lanczos steps at most")

HESSIAN = register(Measurement(
    "hessian", "Curvature (Hessian)",
    "top Hessian eigenvalues, trace and eigenvalue density of one model's test loss, "
    "whole or per block or module kind",
    _run, _params, summary=_summary, plot=_plot, rows=_rows, pair=False, check=check_top,
    refusal="Hessian-vector products differentiate the whole model twice, held in memory",
    section=SECTION, order=100))

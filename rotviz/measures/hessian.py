"""Curvature of one model's test loss: the top Hessian eigenvalues (Lanczos), the trace
(Hutchinson, with its standard error), the eigenvalue density (stochastic Lanczos
quadrature), for the whole model and per block or module kind, and on request the geodesic
sharpness that no symmetry changes (rotviz.analysis.geodesic_sharpness; docs/landscape.md,
"hessian" and "geodesic sharpness"): the record, its computation (`hessian`, on
rotviz.analysis.hvp's products and rotviz.analysis.lanczos) and its figure (the eigenvalues
as bars, or the density on a log axis)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from rotviz.limits import (
    BATCH_SIZE,
    GEODESIC_RHO,
    GEODESIC_SAMPLES,
    GEODESIC_STEPS,
    HESSIAN_DENSITY,
    HESSIAN_EXAMPLES,
    HESSIAN_ITERATIONS,
    HESSIAN_PROBES,
    HESSIAN_TOP,
    SEED,
)
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

    Tensor = torch.Tensor

BY = ("none", "block", "kind")
GEODESIC = ("no", "average", "worst")  # geodesic sharpness: off, average-case, worst-case
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
        Param("geodesic", "no", "also the geodesic sharpness (Hide & Seek, da Silva et al. "
              "2025), which no symmetry of the model changes: average-case or worst-case "
              "(default no)", choices=GEODESIC, label="Geodesic sharpness"),
        Param("geodesic_rho", 0.1, "geodesic sharpness' rho: the scale of the average-case "
              "directions (per weight, relative), or the worst-case ball's radius "
              f"({GEODESIC_RHO.text})", GEODESIC_RHO, label="Geodesic rho",
              needs=("geodesic", ("average", "worst"))),
        Param("geodesic_samples", 4, "average-case geodesic sharpness: seeded directions "
              f"averaged ({GEODESIC_SAMPLES.text})", GEODESIC_SAMPLES,
              label="Geodesic directions", widget=(1, 64, 1), needs=("geodesic", ("average",))),
        Param("geodesic_steps", 3, "worst-case geodesic sharpness: Riemannian gradient-ascent "
              f"steps ({GEODESIC_STEPS.text})", GEODESIC_STEPS, label="Geodesic ascent steps",
              widget=(0, 50, 1), needs=("geodesic", ("worst",))),
    )


def check_top(values: dict, given: set[str]) -> None:
    """Lanczos gives at most one Ritz value per step: more eigenvalues than steps would
    quietly come back fewer (or as unconverged Ritz values), so it is refused."""
    from rotviz.errors import RotvizError

    if values["top"] > values["iterations"]:
        raise RotvizError(f"--top {values['top']} asks for more eigenvalues than "
                          f"--iterations {values['iterations']} Lanczos steps can give: use "
                          f"--top at most {values['iterations']}, or more --iterations")


@dataclass
class GroupCurvature:
    group: str
    n_params: int
    eigenvalues: list[float]
    trace: float | None = None
    trace_se: float | None = None  # None without a trace, or from one probe (no spread)
    residual: float = 0.0  # the largest ||H y - theta y|| of the group's top Ritz pairs
    converged: bool = True


@dataclass
class HessianResult:
    """What `hessian` found; `to_dict()` is the JSON (eigenvalues largest first)."""

    model: str
    split: str  # the split's name (test, train), as every record's JSON says it
    n: int  # examples
    n_params: int
    loss: float
    eigenvalues: list[float]
    trace: float | None
    trace_se: float | None  # None without a trace, or from one probe (no spread)
    probes: int
    by: str
    groups: list[GroupCurvature] = field(default_factory=list)
    density: dict | None = None
    hvps: int = 0
    seconds: float = 0.0
    device: str = "cpu"
    # the largest ||H y - theta y|| of the reported Ritz pairs, and whether every one is at
    # most CONVERGED times the largest |eigenvalue| (each eigenvalue is then that close to
    # one of H's); False: too few --iterations for these eigenvalues
    residual: float = 0.0
    converged: bool = True
    data: str = ""  # the data reference the split was read from (digits, text:FILE)
    # rotviz.analysis.geodesic_sharpness' dict (value, kind, rho, ...), None when not asked
    geodesic: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def hessian(loaded: Loaded, state: Mapping[str, Tensor] | None, split, device="cpu",
            top: int = 3, probes: int = 0, by: str = "none", seed: int = 0,
            batch_size: int = 512, steps: int = 100, density_probes: int = 0,
            dtype: torch.dtype | None = None, progress: Progress | None = None,
            geodesic: Mapping | None = None) -> HessianResult:
    """Top-`top` eigenvalues of the Hessian of the split's mean loss at `state` (the model's
    own state by default), its Hutchinson trace with `probes` probes (0: none), and with `by`
    ('block' or 'kind') the same per group of parameters; with `density_probes`, the SLQ
    density. Seeded: the same call gives the same numbers. `geodesic`: keywords of
    rotviz.analysis.geodesic_sharpness.geodesic_sharpness (kind, rho, samples, steps, ...),
    taken after everything else with a generator of its own (the other numbers stay)."""
    import torch

    from rotviz.analysis.hvp import Curvature, restricted
    from rotviz.analysis.lanczos import converged, density, hutchinson, top_ritz
    from rotviz.evaluation import Evaluator

    t0 = time.perf_counter()
    ev = Evaluator(loaded, split, device, batch_size)
    cur = Curvature(ev, loaded.state if state is None else state, dtype)
    gen = torch.Generator().manual_seed(int(seed))
    dt, dev = cur.dtype, cur.device

    eig, res = top_ritz(cur.hvp, cur.n, top, gen, dt, dev, steps=steps, progress=progress)
    ok = converged(eig, res, min(top, cur.n))
    tr = se = None
    if probes:
        tr, se = hutchinson(cur.hvp, cur.n, probes, gen, dt, dev, progress=progress,
                            rows=cur.hvp_rows)
    groups = []
    if by != "none":
        masks = cur.masks(by, loaded)
        for i, (g, mask) in enumerate(masks.items()):
            if progress is not None:
                progress(i, len(masks), f"group {g}")
            h = restricted(cur.hvp, mask)
            ge, gr = top_ritz(h, cur.n, top, gen, dt, dev, mask, steps)
            gt = gse = None
            if probes:
                gt, gse = hutchinson(h, cur.n, probes, gen, dt, dev, mask)
            groups.append(GroupCurvature(g, int(mask.sum()), ge, gt, gse, max(gr, default=0.0),
                                         converged(ge, gr, min(top, int(mask.sum())))))
    dens = density(cur.hvp, cur.n, density_probes, min(steps, cur.n), gen, dt, dev) \
        if density_probes else None
    geo = None
    if geodesic:
        from rotviz.analysis.geodesic_sharpness import geodesic_sharpness

        geo = geodesic_sharpness(loaded, state, split, device, batch_size=batch_size,
                                 dtype=dtype, progress=progress, **{"seed": seed, **geodesic})
    return HessianResult(loaded.ref, split.split, split.n, cur.n, cur.loss(), eig, tr, se,
                         probes, by, groups, dens, cur.hvps, time.perf_counter() - t0,
                         str(ev.device), max(res, default=0.0), ok, data=split.data,
                         geodesic=geo)


def _run(ends, ctx: Context, v: dict):
    split = ctx.split.subset(min(v["examples"], ctx.split.n))
    r = hessian(ends.anchor, None, split, ctx.device, v["top"], v["trace"], v["by"],
                v["seed"], v["batch_size"], v["iterations"], v["density"],
                progress=ctx.progress, geodesic=_geodesic_settings(v))
    r.model = ends.anchor_ref
    return r


def _geodesic_settings(v: dict) -> dict | None:
    """The geodesic-sharpness keywords the record's values ask for (None: off)."""
    if v.get("geodesic", "no") == "no":
        return None
    return {"kind": v["geodesic"], "rho": v["geodesic_rho"], "samples": v["geodesic_samples"],
            "steps": v["geodesic_steps"]}


def geodesic_text(g: dict | None) -> str:
    """The geodesic sharpness in words (summary and caption); empty when it was not asked."""
    if not g:
        return ""
    how = (f"{g['samples']} directions" if g["kind"] == "average" else
           f"{g['steps']} ascent steps")
    first = f", first order {g['first_order']:.4g}" if "first_order" in g else ""
    return (f"geodesic sharpness ({g['kind']}-case, rho {g['rho']:g}, {how}) "
            f"{g['value']:.4g}{first}")


def _summary(r, how: str) -> str:
    eig = ", ".join(f"{e:.4g}" for e in r.eigenvalues)
    if not r.converged:
        eig += f" (not converged (residual {r.residual:.2g}): raise --iterations)"
    se = ONE_PROBE if r.trace_se is None else f"{r.trace_se:.2g}"  # None: from one probe
    tr = "" if r.trace is None else f"; trace {r.trace:.4g} +- {se}"
    by = "" if not r.groups else f"; {len(r.groups)} groups by {r.by}"
    geo = geodesic_text(r.geodesic)
    by += f"; {geo}" if geo else ""
    return (f"hessian on {r.device}{how}: top eigenvalues {eig}{tr}{by}; loss {r.loss:.4f} "
            f"on {r.n} {r.split} samples, {r.n_params} parameters, {r.hvps} Hessian-vector "
            f"products in {r.seconds:.2f} s")


EIGENVALUE = "Hessian eigenvalue<br>(nats per unit parameter², test-loss curvature)"


def eigenvalue_bars(d: dict, font_size: int = 14, log: bool = False):
    """The top eigenvalues (largest first) of the whole model and, with `by`, of each group's
    principal sub-matrix, as grouped bars: bar i is the i-th largest eigenvalue. `log`: the
    eigenvalue axis on a log scale (for groups whose curvatures differ by decades)."""
    import plotly.graph_objects as go

    from rotviz.plots import style

    rows = [("whole model", d["eigenvalues"])] + [(g["group"], g["eigenvalues"])
                                                   for g in d.get("groups") or []]
    k = max(len(e) for _, e in rows)
    fig = go.Figure()
    for i in range(k):
        fig.add_bar(x=[name for name, _ in rows],
                    y=[e[i] if i < len(e) else None for _, e in rows],
                    name=f"eigenvalue {i + 1}", marker_color=style.color(i),
                    hovertemplate="%{x}: %{y:.4g}<extra>eigenvalue " + str(i + 1) + "</extra>")
    fig.update_layout(barmode="group")
    by = d.get("by", "none")
    where = "parameter group" if by == "none" else f"parameter group (by {by})"
    fig = style.finish(fig, f"Top Hessian eigenvalues of {d['model']} on "
                       f"{style.evaluated_on(d)}",
                       where, EIGENVALUE, "rank (largest first)", font_size)
    if log:
        style.log_axis(fig, "y")
    return fig


def density_plot(d: dict, font_size: int = 14):
    """The eigenvalue density (stochastic Lanczos quadrature), on a log density axis, with
    the top eigenvalues marked."""
    import plotly.graph_objects as go

    from rotviz.plots import style

    dens = d["density"]
    fig = go.Figure()
    fig.add_scatter(x=dens["grid"], y=[max(v, 1e-12) for v in dens["density"]],
                    mode="lines", name="density (SLQ)", line={"color": style.color(0)})
    fig.add_scatter(x=d["eigenvalues"], y=[max(max(dens["density"]), 1e-12)] *
                    len(d["eigenvalues"]), mode="markers", name="top eigenvalues (Lanczos)",
                    marker={"color": style.color(1), "symbol": style.marker(2)})
    style.finish(fig, f"Hessian eigenvalue density of {d['model']} on "
                 f"{style.evaluated_on(d)}",
                 EIGENVALUE, "density (fraction of eigenvalues per unit eigenvalue)",
                 "estimate", font_size)
    fig.update_yaxes(type="log")
    return fig


def hessian_figure(d: dict, style: Style | None = None):
    """The record's figure: the density when it was estimated (its axis is always log),
    else the eigenvalues as bars (`style.log`: on a log axis)."""
    style = style or Style()
    if d.get("density"):
        return density_plot(d, style.font_size)
    return eigenvalue_bars(d, style.font_size, style.log)


def _rows(d: dict) -> list[dict]:
    rows = [{"group": "whole model", "rank": i + 1, "eigenvalue": e,
             "trace": d["trace"], "trace_se": d["trace_se"]}
            for i, e in enumerate(d["eigenvalues"])]
    for g in d.get("groups") or []:
        rows += [{"group": g["group"], "rank": i + 1, "eigenvalue": e, "trace": g["trace"],
                  "trace_se": g["trace_se"]} for i, e in enumerate(g["eigenvalues"])]
    if d.get("geodesic"):  # the whole model's, beside its eigenvalues (a column only when on)
        for r in rows:
            r["geodesic_sharpness"] = d["geodesic"]["value"] if r["group"] == "whole model" \
                else None
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
               "of the Hessian's eigenvalues; raise the Lanczos steps.")
            + (f" {geodesic_text(d['geodesic']).capitalize()}: the same at every point of "
               "the symmetry orbit (Hide & Seek)." if d.get("geodesic") else ""))


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
    _run, _params, summary=_summary, plot=hessian_figure, rows=_rows, pair=False, check=check_top,
    refusal="Hessian-vector products differentiate the whole model twice, held in memory",
    section=SECTION, order=100))

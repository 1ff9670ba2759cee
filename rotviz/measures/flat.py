"""The flat directions that symmetry explains: at one model, the tangents of its continuous
symmetries (per KV group Q-K and V-O maps, gated/ReLU FFN unit scales, the residual stream's
map where the family allows one), the loss along each orbit, the gradient's cosine with each
tangent and the curvature along it; and per block the group's dimension against the number
of near-zero eigenvalues of the Hessian restricted to the block (docs/landscape.md).
"""

from __future__ import annotations

from rotviz.limits import (
    BATCH_SIZE,
    FLAT_STEP,
    FLAT_TANGENTS,
    HESSIAN_EXAMPLES,
    NULLITY_EXACT,
    NULLITY_PROBES,
    NULLITY_STEPS,
    NULLITY_TOL,
    SEED,
)
from rotviz.measures.registry import Context, Measurement, register
from rotviz.plots.figure_style import Style

NULLITY = ("nullity", ("yes",))  # the nullity count's settings mean nothing without it


def _params():
    from rotviz.params import Param

    return (
        Param("per_layer", 8, "symmetry tangents checked per block and kind (Q-K, V-O, FFN; "
              "the residual map's once for the model), a seeded choice among all of them "
              f"({FLAT_TANGENTS.text})", FLAT_TANGENTS,
              label="Tangents per block and kind", widget=(1, 64, 1)),
        Param("step", 0.3, "the orbit's finite step: the loss is taken at exp(+-step E) "
              f"({FLAT_STEP.text})", FLAT_STEP, label="Orbit step s"),
        Param("curvature", "yes", "yes: also t^T H t / |t|^2 along each tangent (one "
              "Hessian-vector product each); no: skip it", choices=("yes", "no"),
              label="Curvature along tangents"),
        Param("nullity", "no", "yes: per block, the symmetry group's dimension against the "
              "number of near-zero eigenvalues of the Hessian restricted to the block (and "
              "of the whole Hessian against every block's group and the residual one): "
              "probes x steps Hessian-vector products per block larger than --nullity-exact, "
              "a dense Hessian per smaller one (minutes on a CPU for the default pair's "
              "33k-parameter blocks); no: skip it (default no)", choices=("yes", "no"),
              label="Dimension against near-zero eigenvalues"),
        Param("nullity_tol", 1e-6, "near zero means |eigenvalue| <= this times the block's "
              f"largest |eigenvalue| (default 1e-6, {NULLITY_TOL.text})", NULLITY_TOL,
              label="Near-zero tolerance (relative)", needs=NULLITY),
        Param("nullity_exact", 2048, "blocks of at most this many parameters are counted "
              "exactly (dense Hessian from Hessian-vector products, then its eigenvalues); "
              f"larger ones by stochastic Lanczos quadrature (default 2048, "
              f"{NULLITY_EXACT.text})", NULLITY_EXACT, label="Exact count up to (parameters)",
              widget=(0, 20000, 256), needs=NULLITY),
        Param("nullity_probes", 3, "random probes of the quadrature estimate, per larger "
              f"block; their spread is the count's error (default 3, {NULLITY_PROBES.text})",
              NULLITY_PROBES, label="Quadrature probes", needs=NULLITY),
        Param("nullity_steps", 30, "Lanczos steps per probe (more resolve eigenvalues "
              f"closer to zero; default 30, {NULLITY_STEPS.text})", NULLITY_STEPS,
              label="Lanczos steps per probe", needs=NULLITY),
        Param("examples", 256, "examples of the split the loss is taken on, the first ones "
              f"({HESSIAN_EXAMPLES.text})", HESSIAN_EXAMPLES, label="Examples",
              widget=(16, 2048, 16)),
        Param("seed", 0, "seed of the tangents' choice and the random control direction "
              "(default 0)", SEED, label="Seed"),
        Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
              BATCH_SIZE, label="Evaluation batch size"),
    )


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.tangents import NullityOptions, flat

    split = ctx.split.subset(min(v["examples"], ctx.split.n))
    s = float(v["step"])
    null = None if v["nullity"] == "no" else NullityOptions(
        v["nullity_tol"], v["nullity_exact"], v["nullity_probes"], v["nullity_steps"])
    r = flat(ends.anchor, None, split, ctx.device, v["per_layer"], v["seed"], (-s, s),
             v["curvature"] == "yes", v["batch_size"], ctx.progress, null)
    r.model = ends.anchor_ref
    return r


def _summary(r, how: str) -> str:
    rows = r.rows
    dim = sum(d["total"] for d in r.dimension)
    change = max((x.loss_change for x in rows), default=0.0)
    cos = max((x.cosine for x in rows), default=0.0)
    curv = [abs(x.curvature) for x in rows if x.curvature is not None]
    c = f"; max |curvature| {max(curv):.3g}" if curv else ""
    blocks = [d for d in r.dimension if d["layer"] != "residual"]
    res = next((d for d in r.dimension if d["layer"] == "residual"), None)
    stream = "" if res is None else (
        f" (residual {res['group']} map: {res['residual']})" if res["group"] else
        " (no residual map: " + res["why"].rstrip(".") + ")")
    null = ""
    if r.nullity:
        tol = r.nullity[0]["tolerance"]
        parts = [f"{x['block']} {x['dimension']} vs {_count(x)}" for x in r.nullity]
        null = (f"; group dimension vs near-zero Hessian eigenvalues (|lambda| <= {tol:.3g} "
                f"lambda_max): " + ", ".join(parts))
    return (f"flat on {r.device}{how}: symmetry group of dimension {dim} over "
            f"{len(blocks)} blocks{stream}; {len(rows)} tangents checked: max relative loss "
            f"change {change:.3g}, max |cos(gradient, tangent)| {cos:.3g} (a random "
            f"direction: {r.control_cosine:.3g}){c}{null}; loss {r.loss:.4f} on {r.n} "
            f"{r.split} samples in {r.seconds:.2f} s")


def _count(row: dict) -> str:
    if row["method"] == "exact":
        return f"{row['near_zero']}"
    # one probe has no spread: its error is None (null in the JSON), said as such
    err = "n/a (one probe)" if row["error"] is None else f"{row['error']:.1f}"
    return f"{row['near_zero']:.1f} +- {err} (slq)"


def _plot(d: dict, style: Style):
    from rotviz.plots.flat import flat_figure

    return flat_figure(d)


def _rows(d: dict) -> list[dict]:
    """One table: the tangents checked (table 'tangents') and, when counted, the group
    dimension against the near-zero eigenvalues per block (table 'nullity')."""
    return [{"table": "tangents", **row} for row in d["rows"]] + \
        [{"table": "nullity", **row} for row in d.get("nullity") or []]


FLAT = register(Measurement(
    "flat", "Symmetry's flat directions",
    "tangents of one model's continuous symmetries: loss along each orbit, the gradient's "
    "cosine and the curvature along each tangent; the group's dimension against the "
    "Hessian's near-zero eigenvalues per block",
    _run, _params, summary=_summary, plot=_plot, rows=_rows, pair=False,
    refusal="the gradient and the curvature along the tangents differentiate the whole "
            "model, held in memory", order=130))

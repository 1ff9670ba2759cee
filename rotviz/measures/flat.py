"""The flat directions that symmetry explains: at one model, the tangents of its continuous
symmetries (per KV group Q-K and V-O maps, gated/ReLU FFN unit scales), the loss along each
orbit, the gradient's cosine with each tangent and the curvature along it (docs/landscape.md).
"""

from __future__ import annotations

from rotviz.limits import BATCH_SIZE, FLAT_STEP, FLAT_TANGENTS, HESSIAN_EXAMPLES, SEED
from rotviz.measures.registry import Context, Measurement, register


def _params():
    from rotviz.params import Param

    return (
        Param("per_layer", 8, "symmetry tangents checked per block and kind (Q-K, V-O, FFN), "
              f"a seeded choice among all of them ({FLAT_TANGENTS.text})", FLAT_TANGENTS,
              label="Tangents per block and kind", widget=(1, 64, 1)),
        Param("step", 0.3, "the orbit's finite step: the loss is taken at exp(+-step E) "
              f"({FLAT_STEP.text})", FLAT_STEP, label="Orbit step s"),
        Param("curvature", "yes", "yes: also t^T H t / |t|^2 along each tangent (one "
              "Hessian-vector product each); no: skip it", choices=("yes", "no"),
              label="Curvature along tangents"),
        Param("examples", 256, "examples of the split the loss is taken on, the first ones "
              f"({HESSIAN_EXAMPLES.text})", HESSIAN_EXAMPLES, label="Examples",
              widget=(16, 2048, 16)),
        Param("seed", 0, "seed of the tangents' choice and the random control direction "
              "(default 0)", SEED, label="Seed"),
        Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
              BATCH_SIZE, label="Evaluation batch size"),
    )


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.tangents import flat

    split = ctx.split.subset(min(v["examples"], ctx.split.n))
    s = float(v["step"])
    r = flat(ends.anchor, None, split, ctx.device, v["per_layer"], v["seed"], (-s, s),
             v["curvature"] == "yes", v["batch_size"], ctx.progress)
    r.model = ends.anchor_ref
    return r


def _summary(r, how: str) -> str:
    rows = r.rows
    dim = sum(d["total"] for d in r.dimension)
    change = max((x.loss_change for x in rows), default=0.0)
    cos = max((x.cosine for x in rows), default=0.0)
    curv = [abs(x.curvature) for x in rows if x.curvature is not None]
    c = f"; max |curvature| {max(curv):.3g}" if curv else ""
    return (f"flat on {r.device}{how}: symmetry group of dimension {dim} over "
            f"{len(r.dimension)} blocks; {len(rows)} tangents checked: max relative loss "
            f"change {change:.3g}, max |cos(gradient, tangent)| {cos:.3g} (a random "
            f"direction: {r.control_cosine:.3g}){c}; loss {r.loss:.4f} on {r.n} {r.split} "
            f"samples in {r.seconds:.2f} s")


def _plot(d: dict):
    from rotviz.plots.flat import flat_bars

    return flat_bars(d)


def _rows(d: dict) -> list[dict]:
    return [dict(row) for row in d["rows"]]


FLAT = register(Measurement(
    "flat", "Symmetry's flat directions",
    "tangents of one model's continuous symmetries: loss along each orbit, the gradient's "
    "cosine and the curvature along each tangent",
    _run, _params, summary=_summary, plot=_plot, rows=_rows, pair=False,
    refusal="the gradient and the curvature along the tangents differentiate the whole "
            "model, held in memory"))

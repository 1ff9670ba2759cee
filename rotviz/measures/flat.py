"""The flat directions that symmetry explains: at one model, the tangents of its continuous
symmetries (per KV group Q-K and V-O maps, gated/ReLU FFN unit scales, the residual stream's
map where the family allows one), the loss along each orbit, the gradient's cosine with each
tangent and the curvature along it; and per block the group's dimension against the number
of near-zero eigenvalues of the Hessian restricted to the block (docs/landscape.md).

The record, its computation (`flat`, on the tangent geometry of rotviz.analysis.tangents
and the Hessian-vector products of rotviz.analysis.hvp) and its figure.

Dimension against near-zero eigenvalues (docs/landscape.md, `count_nullity`): every tangent
t of the group satisfies grad L . t = 0 everywhere on the orbit, so H t = -(Dt)^T grad L: at
a critical point (grad L = 0) every tangent is a null vector of the Hessian. A block's
tangents are zero outside the block's parameters G, so they are null vectors of the
principal sub-matrix H_GG too, and (being linearly independent) the nullity of H_GG is at
least the block's group dimension. Other invariances (a key bias under the softmax, writer
means under a LayerNorm, dead units) add null directions the group does not count, so the
count may be higher; away from a critical point the tangents' curvature is O(|grad L|) and
the count may be lower. The residual map's tangents move every block at once, so they are
counted against the whole Hessian (the row 'model': every block's group and the residual one
together).

Near zero means |lambda| <= tol * lambda_max, lambda_max the largest |eigenvalue| of that
sub-matrix. A block of at most `exact_max` parameters is counted exactly: H_GG from Hessian-
vector products against the identity's columns, then eigvalsh. A larger one is estimated by
stochastic Lanczos quadrature: for each Rademacher probe z (on G), Lanczos gives nodes
theta_k and weights tau_k^2 (summing to 1) of the spectral measure seen from z; the mass of
the nodes within the tolerance, times |G|, estimates the count, and the standard error of
that over probes is its error. The quadrature has `steps` nodes per probe, so eigenvalues
closer to zero than the spectrum's resolution are lumped with the null ones."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

    from rotviz.analysis.hvp import Curvature
    from rotviz.analysis.tangents import Generator
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

    Tensor = torch.Tensor

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


@dataclass
class TangentRow:
    label: str
    layer: int
    kind: str
    norm: float  # |t|
    loss_change: float  # max over s of |L(exp(sE) theta) - L(theta)| / |L(theta)|
    cosine: float  # |grad . t| / (|grad| |t|)
    curvature: float | None  # t^T H t / |t|^2


@dataclass
class FlatResult:
    """What `flat` found; `to_dict()` is the JSON."""

    model: str
    split: str
    n: int
    n_params: int
    loss: float
    grad_norm: float
    steps: list[float]
    dimension: list[dict]  # group dimension per block (derived) and tangents generated
    rows: list[TangentRow] = field(default_factory=list)
    control_cosine: float = 0.0  # a seeded random direction's |cos| with the gradient
    nullity: list[dict] = field(default_factory=list)  # `count_nullity` rows
    seconds: float = 0.0
    device: str = "cpu"

    def to_dict(self) -> dict:
        return asdict(self)


def pick(gens: list[Generator], per_layer: int, seed: int) -> list[Generator]:
    """At most `per_layer` generators per block and kind, drawn without replacement (seeded)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out: list[Generator] = []
    keys = sorted({(g.layer, g.kind) for g in gens}, key=lambda k: (k[0], k[1]))
    for key in keys:
        some = [g for g in gens if (g.layer, g.kind) == key]
        if len(some) > per_layer:
            idx = sorted(rng.choice(len(some), per_layer, replace=False).tolist())
            some = [some[i] for i in idx]
        out += some
    return out


@dataclass(frozen=True)
class NullityOptions:
    """How `flat` counts near-zero Hessian eigenvalues (`count_nullity`): |lambda|
    <= tol * lambda_max; exactly for blocks of at most `exact_max` parameters, else by SLQ
    with `probes` probes of `steps` Lanczos steps."""

    tol: float = 1e-6
    exact_max: int = 2048
    probes: int = 3
    steps: int = 30


def flat(loaded: Loaded, state: Mapping[str, Tensor] | None, split, device="cpu",
         per_layer: int = 8, seed: int = 0, steps: tuple[float, ...] = (-0.3, 0.3),
         curvature: bool = True, batch_size: int = 512,
         progress: Progress | None = None,
         nullity: NullityOptions | None = None) -> FlatResult:
    """The report: for up to `per_layer` tangents per block and kind (the residual map's
    counting as one more block; seeded choice), the relative loss change along the orbit
    exp(s E) for s in `steps`, the gradient's cosine with the tangent, and (with
    `curvature`) t^T H t / |t|^2; with `nullity`, per block the group dimension against the
    near-zero eigenvalues of the Hessian restricted to it; in float64, on the split's mean
    loss. Neither `state` nor the loaded model is modified."""
    import torch

    from rotviz.analysis.hvp import Curvature
    from rotviz.analysis.tangents import (
        F64,
        RESIDUAL,
        f64_view,
        generators,
        group_dimension,
        moved_state,
        tangents,
    )
    from rotviz.errors import RotvizError
    from rotviz.evaluation import Evaluator

    t0 = time.perf_counter()
    if not steps:
        raise RotvizError("the orbit needs at least one step s; give some")
    ev = Evaluator(loaded, split, device, batch_size)
    st = loaded.state if state is None else state
    cur = Curvature(ev, st, F64)
    view = f64_view(loaded, st)
    all_gens = generators(view)
    gens = pick(all_gens, per_layer, seed)
    names, t, gens = tangents(loaded, st, gens)
    if names != cur.names:
        raise RotvizError("the model's floating parameters differ from the Hessian's; "
                          "report this model's family")
    t = t.to(cur.device)
    base = cur.loss()
    grad = cur.gradient()
    gn = float(grad.norm())
    counts = {}
    for g in all_gens:
        counts[(g.layer, g.kind)] = counts.get((g.layer, g.kind), 0) + 1
    dim = group_dimension(view)
    for row in dim:
        row["tangents"] = (counts.get((RESIDUAL, "residual"), 0) if row["layer"] == "residual"
                           else sum(counts.get((row["layer"], k), 0)
                                    for k in ("qk", "vo", "ffn")))
    rows = []
    for i, gen in enumerate(gens):
        if progress is not None:
            progress(i, len(gens), gen.label)
        tn = float(t[i].norm())
        change = 0.0
        for s in steps:
            moved = moved_state(view, gen, s)
            change = max(change, abs(loss_at(cur, moved) - base) / max(abs(base), 1e-300))
        cos = abs(float(grad @ t[i])) / max(gn * tn, 1e-300)
        curv = float(t[i] @ cur.hvp(t[i])) / tn ** 2 if curvature and tn > 0 else None
        rows.append(TangentRow(gen.label, gen.layer, gen.kind, tn, change, cos, curv))
    gen = torch.Generator().manual_seed(int(seed))
    r = torch.randn(cur.n, generator=gen, dtype=F64).to(cur.device)
    control = abs(float(grad @ r)) / max(gn * float(r.norm()), 1e-300)
    null: list[dict] = []
    if nullity is not None:
        null = count_nullity(cur, loaded, dim, nullity.tol, nullity.exact_max,
                             nullity.probes, nullity.steps, seed, progress)
    return FlatResult(loaded.ref, split.data, split.n, cur.n, base, gn, list(steps), dim,
                      rows, control, null, time.perf_counter() - t0, str(ev.device))


def loss_at(cur: Curvature, state: Mapping[str, Tensor]) -> float:
    """The split's mean loss (float64) at another parameter set of the same model."""
    import torch

    params = cur.ev.params(state)
    ps = [cur.cast(params[n]) for n in cur.names]
    with torch.no_grad():
        return float(sum(cur._loss(ps, x, y) for x, y in cur.ev.batches))


def count_exact(h: Tensor, tol: float) -> tuple[int, float]:
    """(the number of eigenvalues with |lambda| <= tol * max |lambda|, max |lambda|)."""
    import torch

    eig = torch.linalg.eigvalsh(h.to(torch.float64))
    top = float(eig.abs().max()) if eig.numel() else 0.0
    return int((eig.abs() <= tol * top).sum()), top


def count_slq(cur: Curvature, mask: Tensor, tol: float, probes: int, steps: int,
              gen: torch.Generator) -> tuple[float, float | None, float]:
    """(count, its standard error over probes, lambda_max), estimated by stochastic Lanczos
    quadrature on the sub-matrix of `mask`. One probe has no spread: its error is None, never
    NaN, so the JSON stays strict and the text can say why there is none."""
    import numpy as np

    from rotviz.analysis.hvp import restricted
    from rotviz.analysis.lanczos import lanczos, rademacher, ritz

    m = int(mask.sum())
    h = restricted(cur.hvp, mask)
    nodes, weights = [], []
    for _ in range(probes):
        z = rademacher(cur.n, gen, cur.dtype, cur.device) * mask
        a, b = lanczos(h, z, min(steps, m), mask)
        theta, s = ritz(list(a), list(b))
        nodes.append(theta)
        weights.append(s[0] ** 2)
    top = max(float(np.abs(t).max()) for t in nodes)
    mass = np.asarray([float(w[np.abs(t) <= tol * top].sum())
                       for t, w in zip(nodes, weights, strict=True)])
    se = float(mass.std(ddof=1) / math.sqrt(probes)) * m if probes > 1 else None
    return float(mass.mean()) * m, se, top


def count_nullity(cur: Curvature, loaded, dimension: list[dict], tol: float, exact_max: int,
            probes: int, steps: int, seed: int = 0, progress: Progress | None = None
            ) -> list[dict]:
    """One row per block ('block i'), for the parameters outside the blocks ('outside') and
    for the whole model ('model'): the group dimension it holds (`dimension` as
    rotviz.analysis.tangents.group_dimension gives it; the model's row counts every block
    and the residual map), the parameters, the near-zero count, its error (0 when exact),
    the method (exact or slq), the tolerance and lambda_max. The error is None for an slq
    count from one probe (undefined)."""
    import torch

    from rotviz.analysis.hvp import dense_block

    masks = cur.masks("block", loaded)
    masks["model"] = torch.ones(cur.n, dtype=torch.bool, device=cur.device)
    per_block = {f"block {d['layer']}": d["total"] for d in dimension
                 if isinstance(d["layer"], int)}
    gen = torch.Generator().manual_seed(int(seed))
    rows = []
    for i, (name, mask) in enumerate(masks.items()):
        if progress is not None:
            progress(i, len(masks), f"near-zero eigenvalues of {name}")
        m = int(mask.sum())
        dim = sum(d["total"] for d in dimension) if name == "model" else per_block.get(name, 0)
        if m <= exact_max:
            count, top = count_exact(dense_block(cur, mask), tol)
            err, method = 0.0, "exact"
        else:
            count, err, top = count_slq(cur, mask, tol, probes, steps, gen)
            method = "slq"
        rows.append({"block": name, "params": m, "dimension": dim, "near_zero": count,
                     "error": err, "method": method, "tolerance": tol, "lambda_max": top})
    return rows


def _run(ends, ctx: Context, v: dict):
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


FLOOR = 1e-18  # exact zeros drawn at the floor of the log axis


def flat_bars(d: Mapping, font_size: int = 14, title: str | None = None):
    """`d` is `FlatResult.to_dict()`."""
    import plotly.graph_objects as go

    from rotviz.plots import style

    groups: dict[str, list[dict]] = {}
    for row in d["rows"]:
        key = "residual" if row["kind"] == "residual" else f"L{row['layer']} {row['kind']}"
        groups.setdefault(key, []).append(row)
    x = list(groups)
    series = [("max |relative loss change| along the orbits", "loss_change"),
              ("max |cos(gradient, tangent)|", "cosine")]
    if any(r.get("curvature") is not None for r in d["rows"]):
        series.append(("max |tᵀHt| / |t|² (curvature along tangents)", "curvature"))
    fig = go.Figure()
    for i, (name, key) in enumerate(series):
        ys = [max(FLOOR, max(abs(r[key] or 0.0) for r in rows)) for rows in groups.values()]
        fig.add_bar(x=x, y=ys, name=name, marker_color=style.color(i),
                    hovertemplate="%{x}: %{y:.3g}<extra>" + name + "</extra>")
    fig.add_scatter(x=x, y=[max(FLOOR, d["control_cosine"])] * len(x), mode="lines",
                    name="|cos(gradient, random direction)| (control)",
                    line={"color": style.GREY, "dash": style.dash(1), "width": 2})
    fig.update_layout(barmode="group")
    style.log_axis(fig, "y")
    return style.finish(fig, title or "Flat directions of the symmetry group: loss change, "
                        "gradient cosine and curvature along each tangent",
                        "block and kind (qk: Q-K maps, vo: V-O maps, ffn: unit scales; "
                        "residual: the stream's map)",
                        "magnitude (dimensionless; curvature in nats per unit²)",
                        "quantity", font_size)


def nullity_bars(d: Mapping, font_size: int = 14, title: str | None = None):
    """Per block (then the parameters outside the blocks and the whole model), the symmetry
    group's dimension and the number of near-zero eigenvalues of the Hessian restricted to
    those parameters, side by side; an SLQ estimate carries its standard error as an error
    bar. `d` is `FlatResult.to_dict()` with its `nullity` rows."""
    import plotly.graph_objects as go

    from rotviz.plots import style

    rows = d["nullity"]
    x = [r["block"] if r["method"] == "exact" else f"{r['block']} (slq)" for r in rows]
    fig = go.Figure()
    fig.add_bar(x=x, y=[r["dimension"] for r in rows], name="symmetry group dimension",
                marker_color=style.color(0),
                hovertemplate="%{x}: %{y}<extra>group dimension</extra>")
    errors = [r["error"] if r["method"] == "slq" and r["error"] is not None else 0.0
              for r in rows]  # None: an slq count from one probe, with no error to draw
    fig.add_bar(x=x, y=[r["near_zero"] for r in rows],
                name="near-zero Hessian eigenvalues", marker_color=style.color(1),
                error_y={"type": "data", "array": errors, "visible": any(errors)},
                hovertemplate="%{x}: %{y:.4g}<extra>near-zero eigenvalues</extra>")
    fig.update_layout(barmode="group")
    tol = rows[0]["tolerance"] if rows else 0.0
    return style.finish(fig, title or "Symmetry group dimension against near-zero Hessian "
                        f"eigenvalues (|λ| ≤ {tol:.3g} λ_max), per block",
                        "parameter group (block; 'model': all parameters, every block's "
                        "group and the residual map)", "count (dimensions, eigenvalues)",
                        "quantity", font_size)


def flat_figure(d: Mapping, style: Style | None = None):
    """The record's figure: the dimension against the near-zero eigenvalues when they were
    counted, else the tangents' checks (on their log axis)."""
    font_size = (style or Style()).font_size
    return nullity_bars(d, font_size) if d.get("nullity") else flat_bars(d, font_size)


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
    _run, _params, summary=_summary, plot=flat_figure, rows=_rows, pair=False,
    refusal="the gradient and the curvature along the tangents differentiate the whole "
            "model, held in memory", order=130))

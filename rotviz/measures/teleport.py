"""Symmetry teleportation (Zhao, Dehmamy, Walters and Yu, NeurIPS 2022; Zhao et al., ICLR
2024): move one model along its symmetry orbit, where the function and so the loss do not
change, to where the gradient is largest (grad-max) or the curvature highest or lowest
(sharp-max, sharp-min) (docs/landscape.md, "teleport"). The record, its computation
(`teleport`, on rotviz.analysis.orbit's coordinates, rotviz.analysis.hvp's functional loss
and rotviz.analysis.lanczos) and its figure (the orbit as a path).

Each step starts at coordinates X = 0 at the current point theta, takes the objective
f(act(X, theta)) on the first `examples` of the train split and its gradient in X by
autograd, and moves along the normalised gradient by a step eta (ascent for grad-max and
sharp-max, descent for sharp-min), kept only where the objective improved and the
accumulated element's condition number stays under `max_condition` (else eta is halved and
the step tried again). The objective:
- grad-max: |grad_theta L|^2, a double backward pass through the functional model;
- sharp-max / sharp-min: the top Hessian eigenvalue lambda (Lanczos on Hessian-vector
  products, warm-started from the last step's eigenvector), its gradient by Hellmann-
  Feynman: d lambda = v^T (dH) v with the eigenvector v held fixed. Directly that is a
  third-order pass; since the group acts linearly on theta and keeps the loss, it equals
  the action's pullback at v of -2 H v, one product (`_coordinate_grad`), which the path
  takes (the two agree to rounding: tests/measures/test_teleport.py).
The model is always the original moved by the accumulated element, in float64 and then
rounded once, so no rounding gathers along the path. The step loop lives in
rotviz.analysis.teleporting (shared with rotviz.measures.teleport_train)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from rotviz.limits import BATCH_SIZE, HESSIAN_EXAMPLES, HESSIAN_ITERATIONS, SEED, Bound
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import torch

    from rotviz.analysis.loss_graph import LossGraph
    from rotviz.data.split import Split
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

    Tensor = torch.Tensor

OBJECTIVES = ("grad-max", "sharp-max", "sharp-min")
GEODESIC = ("average", "worst", "no")
STEPS = Bound("--steps", 1, 10_000)
PROBES = Bound("--trace-probes", 0, 100_000)
CONDITION = Bound("--max-condition", 1.0, 1e6, integer=False)
LOGIT_TOL = 1e-4  # the teleported model's logits, relative to the largest |logit|
LOSS_TOL = 1e-6  # its test loss, relative


def _params():
    from rotviz.params import Param

    return (
        Param("objective", "grad-max", "grad-max: raise the gradient norm; sharp-max / "
              "sharp-min: raise / lower the top Hessian eigenvalue (default grad-max)",
              choices=OBJECTIVES, label="Objective", essential=True),
        Param("group", "all", "the symmetries to move along, a comma list of qk, vo, "
              "ffn-scale (gated and ReLU FFNs only); all: qk,vo and ffn-scale where the "
              "model has it (default all)", label="Symmetry groups", metavar="GROUPS"),
        Param("steps", 20, f"teleport steps (default 20, {STEPS.text})", STEPS, label="Steps",
              widget=(1, 200, 1), essential=True),
        Param("examples", 128, "examples of the train split the objective is taken on, the "
              f"first ones (default 128, {HESSIAN_EXAMPLES.text})", HESSIAN_EXAMPLES,
              label="Examples",
              widget=(8, 1024, 8)),
        Param("trace_probes", 10, "Hutchinson probes of the trace before and after (the same "
              f"probes; 0: no trace; default 10, {PROBES.text})", PROBES, label="Trace probes",
              widget=(0, 100, 1)),
        Param("iterations", 30, "Lanczos steps at most for the top eigenvalue before and "
              f"after (default 30, {HESSIAN_ITERATIONS.text})",
              HESSIAN_ITERATIONS, label="Lanczos steps", widget=(2, 200, 1)),
        Param("max_condition", 30.0, "the largest condition number any Q-K or V-O map (or "
              f"ratio of unit scales) of the element may reach (default 30, {CONDITION.text})",
              CONDITION,
              label="Largest condition number"),
        Param("geodesic", "average", "geodesic sharpness (Hide & Seek; docs/landscape.md) before "
              "and after, the sharpness no symmetry changes: average or worst (as `rotviz "
              "hessian --geodesic`, its default settings), or no (default average)",
              choices=GEODESIC, label="Geodesic sharpness"),
        Param("seed", 0, "seed of the Lanczos start, the trace probes and the geodesic "
              "sharpness's directions (default 0)", SEED, label="Seed"),
        Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
              BATCH_SIZE, label="Evaluation batch size"),
    )


def _check(values: dict, given: set[str]) -> None:
    from rotviz.analysis.orbit import parse_groups

    if values["group"] != "all":
        parse_groups(values["group"])


@dataclass
class TeleportResult:
    """What `teleport` found; `to_dict()` is the JSON (`state`, the teleported model, is
    left out: --out writes it)."""

    model: str
    objective: str
    group: list[str]
    examples: int
    split: str  # the split the objective is taken on (train)
    test_split: str  # the split the loss is checked on (test)
    data: str
    n_params: int
    dimension: int  # of the orbit's coordinates
    steps: int  # steps taken (a step that found no improvement ends the path early)
    loss_before: float
    loss_after: float
    top_before: float
    top_after: float
    trace_before: float | None
    trace_after: float | None
    grad_norm_before: float
    grad_norm_after: float
    train_loss_before: float
    train_loss_after: float
    conditions: list[dict]
    max_condition: float
    path: list[dict]
    function_check: dict
    # geodesic sharpness (rotviz.analysis.geodesic_sharpness) on the train examples before and
    # after, with the same seed: what the orbit cannot move; None with --geodesic no
    geodesic_before: float | None = None
    geodesic_after: float | None = None
    geodesic: dict | None = None  # its settings (kind, rho, order, seed, n)
    seconds: float = 0.0
    device: str = "cpu"
    state: dict = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("state")
        return d


# ---- the objective and its gradient in the orbit's coordinates ----------------------------

def _theta_grad(graph: LossGraph, objective: str, v: Tensor | None) -> Tensor:
    """The objective's gradient in the parameters theta (flat), at the current point, for
    the sharp objectives in the direct form: d(v^T H v) with v fixed (Hellmann-Feynman), a
    third-order pass through the functional model. (`_coordinate_grad` takes the cheaper
    route the group offers; tests check that the two agree.)"""
    if objective == "grad-max":
        return 2 * graph.hvp(graph.grad)
    return graph.third(v)


def _measures(graph: LossGraph, probes: int, seed: int, iterations: int,
              v0: Tensor | None = None) -> tuple:
    """(top eigenvalue, its eigenvector, trace or None). Lanczos from v0 (a warm start: the
    eigenvector at the end of the path) or a seeded random vector; the trace from seeded
    Rademacher probes, the same before and after."""
    import torch

    from rotviz.analysis.lanczos import rademacher
    from rotviz.analysis.loss_graph import top_pair

    cur = graph.cur
    if v0 is None:
        gen = torch.Generator().manual_seed(int(seed))
        v0 = torch.randn(cur.n, generator=gen, dtype=torch.float64).to(cur.dtype)
    top, v = top_pair(graph, v0, iterations, 1e-7)
    tr = None
    if probes:
        gen = torch.Generator().manual_seed(int(seed) + 1)
        zs = [rademacher(cur.n, gen, cur.dtype, cur.device) for _ in range(probes)]
        tr = sum(float(z @ graph.hvp(z)) for z in zs) / probes
    return top, v, tr


def _function_check(loaded: Loaded, test: Split, before, after, device, batch_size) -> dict:
    """The teleported model's logits (probe inputs, relative to the largest |logit|) and its
    test loss (float64, relative) against the original's."""
    import torch

    from rotviz.analysis.hvp import Curvature
    from rotviz.evaluation import Evaluator
    from rotviz.sources.running import forward, probe_inputs

    x = probe_inputs(loaded, 4, 0)
    a, b = (forward(loaded, x, s, every=True).double() for s in (before, after))
    diff = float((a - b).abs().max())
    rel = diff / max(float(a.abs().max()), 1e-30)
    ev = Evaluator(loaded, test, device, batch_size)
    la, lb = (Curvature(ev, s, torch.float64).loss() for s in (before, after))
    loss_rel = abs(lb - la) / max(abs(la), 1e-30)
    return {"max_output_diff": diff, "relative": rel, "tolerance": LOGIT_TOL,
            "what": "the teleported model vs. the original, on seeded probe inputs (its test "
                    f"loss changed by {loss_rel:.1g}, relative)",
            "loss_relative": loss_rel, "loss_tolerance": LOSS_TOL,
            "preserved": rel <= LOGIT_TOL and loss_rel <= LOSS_TOL,
            "loss_before": la, "loss_after": lb}


def teleport(loaded: Loaded, train: Split, test: Split, objective: str = "grad-max",
             group: str = "all", steps: int = 20, trace_probes: int = 10,
             iterations: int = 30, max_condition: float = 30.0, seed: int = 0,
             device="cpu", batch_size: int = 512, progress: Progress | None = None,
             geodesic: str = "average") -> TeleportResult:
    """Teleport `loaded` (its own state) along its symmetry orbit for `steps` steps on the
    objective taken on `train` (all of it: pass the examples wanted), the loss checked on
    `test`. Seeded: the same call gives the same numbers. The result's `state` is the
    teleported model (the checkpoint's dtypes). `geodesic` (average, worst or no): the
    geodesic sharpness before and after, on `train`."""
    import torch

    import rotviz.analysis.orbit as orb
    from rotviz.analysis.loss_graph import LossGraph
    from rotviz.analysis.orbit import Orbit, conditions
    from rotviz.analysis.tangents import ffn_has_scales
    from rotviz.analysis.teleporting import PATH_LANCZOS, _curvature, _point, climb
    from rotviz.errors import RotvizError
    from rotviz.evaluation import Evaluator
    from rotviz.symmetry.view import read_view

    if objective not in OBJECTIVES:
        raise RotvizError(f"--objective {objective}: use one of {', '.join(OBJECTIVES)}")
    t0 = time.perf_counter()
    if group == "all":
        view = read_view(loaded.spec, loaded.config, loaded.state)
        scales = all(ffn_has_scales(b.ffn) for b in view.blocks)
        group = "qk,vo,ffn-scale" if scales else "qk,vo"
    orbit = Orbit.of(loaded, group)
    state0 = loaded.state
    gen = torch.Generator().manual_seed(int(seed))
    ev = Evaluator(loaded, train, device, batch_size)
    start = _curvature(ev, state0)
    v0 = torch.randn(start.n, generator=gen, dtype=torch.float64).to(start.dtype)
    steps_path = min(iterations, PATH_LANCZOS)
    graph0 = LossGraph(start)
    top0, vtop, tr0 = _measures(graph0, trace_probes, seed, iterations)
    here = _point(ev, state0, objective, v0, iterations, graph=graph0, top=(top0, vtop))
    run = climb(loaded, orbit, ev, here, objective, steps, max_condition, v0, steps_path,
                progress)
    element, here, taken = run.element, run.here, run.taken
    path = [{**p, "trace": None} for p in run.path]
    path[0].update(top=top0, trace=tr0)
    top1, _, tr1 = _measures(here.graph, trace_probes, seed, iterations,
                             here.v if here.v is not None else vtop)
    path[-1].update(top=top1, trace=tr1)
    check = _function_check(loaded, test, state0, here.state, device, batch_size)
    geo = _geodesic(loaded, train, (state0, here.state), geodesic, seed, device, batch_size)
    if geo[0] is not None:
        path[0]["geodesic"], path[-1]["geodesic"] = geo[0], geo[1]
    rows = conditions(element) if element else [{} for _ in orbit.bases]
    return TeleportResult(
        loaded.ref, objective, list(orbit.groups), train.n, train.split, test.split,
        train.data, start.n, orbit.dimension(), taken, check["loss_before"],
        check["loss_after"], top0, top1, tr0, tr1, path[0]["grad_norm"], here.grad_norm,
        path[0]["loss"], here.loss, rows, orb.max_condition(element) if element else 1.0,
        path, check, *geo, seconds=time.perf_counter() - t0, device=str(start.device),
        state=dict(here.state))


def _geodesic(loaded: Loaded, train: Split, states: tuple, kind: str, seed: int, device,
              batch_size: int) -> tuple:
    """The geodesic sharpness of each state on the train examples (the same seeded
    directions: the measure, unlike the top eigenvalue and the trace, is one number along
    the orbit), and its settings; (None, None, None) for 'no'."""
    if kind == "no":
        return None, None, None
    from rotviz.analysis.geodesic_sharpness import geodesic_sharpness

    got = [geodesic_sharpness(loaded, st, train, device, kind=kind, seed=seed,
                              batch_size=batch_size) for st in states]
    keep = {k: got[0][k] for k in ("kind", "rho", "order", "seed", "n")}
    return got[0]["value"], got[1]["value"], keep


def _run(ends, ctx: Context, v: dict):
    from rotviz.errors import RotvizError

    train = ctx.split.sibling("train")
    train = train.subset(min(v["examples"], train.n))
    r = teleport(ends.anchor, train, ctx.split, v["objective"], v["group"], v["steps"],
                 v["trace_probes"], v["iterations"], v["max_condition"], v["seed"],
                 ctx.device, v["batch_size"], ctx.progress, v["geodesic"])
    r.model = ends.anchor_ref
    c = r.function_check
    if not c["preserved"]:
        raise RotvizError(
            f"the teleported model's function moved (logits {c['relative']:.2g} relative, "
            f"tolerance {LOGIT_TOL:g}; test loss {c['loss_relative']:.2g}, tolerance "
            f"{LOSS_TOL:g}): nothing written; lower --max-condition")
    return r


def _summary(r, how: str) -> str:
    c = r.function_check
    tr = "" if r.trace_before is None else \
        f"; trace {r.trace_before:.4g} -> {r.trace_after:.4g}"
    if r.geodesic_before is not None:
        tr += f"; geodesic sharpness {r.geodesic_before:.6g} -> {r.geodesic_after:.6g}"
    return (f"teleport ({r.objective}, {','.join(r.group)}) on {r.device}{how}: {r.steps} "
            f"steps; top eigenvalue {r.top_before:.4g} -> {r.top_after:.4g}{tr}; gradient "
            f"norm {r.grad_norm_before:.4g} -> {r.grad_norm_after:.4g} on {r.examples} "
            f"{r.split} examples; {r.test_split} loss {r.loss_before:.6f} -> "
            f"{r.loss_after:.6f} (logits {c['relative']:.2g} relative); largest condition "
            f"number {r.max_condition:.3g}; {r.seconds:.2f} s")


MEASURES = (("grad_norm", "gradient norm"), ("top", "top Hessian eigenvalue"),
            ("trace", "Hessian trace (Hutchinson)"),
            ("geodesic", "geodesic sharpness (invariant)"))


def teleport_figure(d: dict, style: Style | None = None):
    """The orbit as a path: x = teleport step; above, the train loss relative to its start
    (flat: the function does not change); below, the gradient norm, top eigenvalue, trace
    and geodesic sharpness, each relative to its start, on a log axis (the trace, the
    geodesic sharpness and, for grad-max, the top eigenvalue are taken at the two ends
    only)."""
    from plotly.subplots import make_subplots

    from rotviz.plots import style as st

    style = style or Style()
    path = d["path"]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        row_heights=[0.35, 0.65])
    l0 = path[0]["loss"]
    fig.add_scatter(x=[p["step"] for p in path], y=[p["loss"] / l0 - 1 for p in path],
                    mode="lines+markers", name="train loss", row=1, col=1,
                    line={"color": st.color(0)}, marker={"symbol": st.marker(0)})
    for i, (key, label) in enumerate(MEASURES, start=1):
        pts = [p for p in path if p.get(key) is not None]
        if not pts or not pts[0][key]:
            continue
        base = pts[0][key]
        fig.add_scatter(x=[p["step"] for p in pts], y=[p[key] / base for p in pts],
                        mode="lines+markers", name=label, row=2, col=1,
                        line={"color": st.color(i), "dash": st.dash(i)},
                        marker={"symbol": st.marker(i), "size": 8})
    st.finish(fig, f"Teleporting {d['model']} ({d['objective']}, {', '.join(d['group'])}) "
              f"on {d['data']} ({d['split']})", "", "", "measure", style.font_size,
              height=560)
    fig.update_xaxes(title_text="teleport step (accepted steps along the orbit)", row=2,
                     col=1)
    fig.update_yaxes(title_text="loss change (relative)", row=1, col=1)
    fig.update_yaxes(title_text="relative to start (×)", row=2, col=1)
    fig.update_yaxes(type="log", row=2, col=1)  # plotly's ticks: ranges under a decade too
    return fig


def _rows(d: dict) -> list[dict]:
    return [{"step": p["step"], "objective": p["objective"], "train_loss": p["loss"],
             "grad_norm": p["grad_norm"], "top": p["top"], "trace": p["trace"],
             "geodesic": p.get("geodesic")}
            for p in d["path"]]


def _geo_text(d: dict) -> str:
    if d.get("geodesic_before") is None:
        return ""
    return (f", geodesic sharpness {d['geodesic_before']:.5g} → {d['geodesic_after']:.5g} "
            "(the one the orbit cannot move)")


def _caption(d: dict) -> str:
    tr = "" if d.get("trace_before") is None else \
        f", trace {d['trace_before']:.4g} → {d['trace_after']:.4g}"
    return (f"{d['steps']} steps ({d['objective']}): test loss {d['loss_before']:.6f} → "
            f"{d['loss_after']:.6f} (relative change "
            f"{d['function_check']['loss_relative']:.1g}), top eigenvalue "
            f"{d['top_before']:.4g} → {d['top_after']:.4g}{tr}{_geo_text(d)}, gradient norm "
            f"{d['grad_norm_before']:.4g} → {d['grad_norm_after']:.4g}; the largest "
            f"condition number of the element {d['max_condition']:.3g}.")


SECTION = Section(
    "landscape", 60, "5. Teleport along the symmetry orbit",
    "Symmetry teleportation (Zhao et al. 2022, 2024) moves the model along its orbit: per "
    "head Q-K and V-O maps (and FFN unit scales where the FFN allows), group elements that "
    "leave every output, and so the loss, exactly as they were. The gradient norm and the "
    "curvature are not invariant: the steps climb (grad-max, sharp-max) or descend "
    "(sharp-min) them on the train examples, while the loss stays flat. Small defaults: a "
    "CPU Run takes seconds.",
    defaults={"steps": 5, "examples": 32, "trace_probes": 3, "iterations": 15},
    caption=_caption,
    doing=lambda v: f"{v['steps']} teleport steps ({v['objective']})")

TELEPORT = register(Measurement(
    "teleport", "Teleport (symmetry orbit)",
    "move one model along its symmetry orbit (loss unchanged) to raise its gradient norm or "
    "raise or lower its top Hessian eigenvalue; --out writes the teleported model",
    _run, _params, summary=_summary, plot=teleport_figure, rows=_rows, pair=False,
    check=_check, writes_model=True, progress=True,
    refusal="teleporting takes Hessian-vector products of the whole model at every step, "
            "held in memory",
    section=SECTION, order=105))

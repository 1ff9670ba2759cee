"""The teleport step loop (Zhao, Dehmamy, Walters and Yu, NeurIPS 2022; Zhao et al., ICLR
2024): climb or descend an objective along the symmetry orbit of one parameter set, in
rotviz.analysis.orbit's Lie-algebra coordinates. Shared by the records that teleport: one
model once (rotviz.measures.teleport) and a model every k training steps
(rotviz.measures.teleport_train); a record module never imports another, so the loop lives
here, below both.

Each step starts at coordinates X = 0 at the current point theta, takes the objective
f(act(X, theta)) on the evaluator's examples and its gradient in X, and moves along the
normalised gradient by a step eta (ascent for grad-max and sharp-max, descent for
sharp-min), kept only where the objective improved and the accumulated element's condition
number stays under `max_condition` (else eta is halved and the step tried again). The
point is always the start moved by the accumulated element, in float64 and then rounded
once, so no rounding gathers along the path. See rotviz.measures.teleport's docstring for
the objectives and their gradients."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rotviz.analysis.hvp import Curvature
    from rotviz.analysis.loss_graph import LossGraph
    from rotviz.analysis.orbit import Orbit
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

Tensor = torch.Tensor

FIRST_STEP = 0.25  # eta of the first step: the norm of X in Lie-algebra coordinates
MAX_STEP = 2.0
TRIES = 6  # halvings of eta before a step is given up (the path has then converged)
PATH_TOL = 1e-5  # Lanczos's relative residual on the path (warm-started each step)
PATH_LANCZOS = 3  # Lanczos steps at most per path point (warm-started: few are needed)


def _pullback(orbit: Orbit, cur: Curvature, state, w: Tensor) -> dict:
    """df/dX at X = 0 from df/dtheta = w (flat over `cur.names`): Orbit.pullback."""
    return orbit.pullback(state, dict(zip(cur.names, cur.unflat(w), strict=True)))


def _curvature(ev, state) -> Curvature:
    """The loss's curvature at `state`, on the evaluator `ev` made once per run."""
    from rotviz.analysis.hvp import Curvature

    return Curvature(ev, state)


def _coordinate_grad(orbit: Orbit, cur: Curvature, point: _Point, objective: str) -> dict:
    """df/dX at X = 0. grad-max: the action's pullback of 2 H g. sharp: the action
    theta -> g.theta is linear in theta for a fixed element g, say J_g, and L(J_g theta) =
    L(theta) for every theta; differentiating twice, H(g.theta) = J_g^-T H(theta) J_g^-1, so
    with v held fixed v^T H(exp(X).theta) v = (J_exp(-X) v)^T H (J_exp(-X) v), whose
    derivative at 0 is the action's pullback *at v* (v read as a parameter set) of -2 H v:
    one Hessian-vector product instead of a third-order pass (the same numbers to
    rounding: tests/measures/test_teleport.py)."""
    graph = point.graph
    if objective == "grad-max":
        return _pullback(orbit, cur, point.state, 2 * graph.hvp(graph.grad))
    at_v = {k: torch.zeros_like(t) for k, t in point.state.items()}
    at_v |= {n: part.to(point.state[n].dtype)
             for n, part in zip(cur.names, cur.unflat(point.v), strict=True)
             if n in point.state}
    return _pullback(orbit, cur, at_v, -2 * graph.hvp(point.v))


@dataclass
class _Point:
    """One point of the path: its state, gradient, measures, and the eigenvector (sharp
    objectives)."""

    state: dict
    graph: LossGraph
    value: float
    loss: float
    top: float | None = None
    v: Tensor | None = None

    @property
    def grad_norm(self) -> float:
        return float(self.graph.grad.norm())


def _point(ev, state, objective, v0, steps, graph: LossGraph | None = None,
           top: tuple | None = None) -> _Point:
    """The path's point at `state`; `graph` and `top` (the top eigenpair): where the caller
    has them already (the start, whose measures take them), not taken again."""
    from rotviz.analysis.loss_graph import LossGraph, top_pair

    graph = graph or LossGraph(_curvature(ev, state))
    v = None
    if objective != "grad-max":
        top, v = top or top_pair(graph, v0, steps, PATH_TOL)
    else:
        top = None
    value = float(graph.grad @ graph.grad) if objective == "grad-max" else top
    return _Point(state, graph, value, graph.loss, top, v)


@dataclass
class Climb:
    """Where a climb ended: the accumulated element (per block; {} when no step was
    taken), the last point, the accepted steps and the path (one row per point: step,
    objective, loss, grad_norm, top)."""

    element: dict
    here: _Point
    taken: int
    path: list[dict] = field(default_factory=list)


def climb(loaded: Loaded, orbit: Orbit, ev, start: _Point, objective: str, steps: int,
          max_condition: float, v0: Tensor, lanczos_steps: int = PATH_LANCZOS,
          progress: Progress | None = None) -> Climb:
    """Up to `steps` steps along `orbit` from the point `start` (its state, graph and
    value; `ev` the evaluator its loss is taken on) on `objective`, the element kept under
    `max_condition`. Deterministic: no random numbers are drawn (`v0`: the Lanczos start
    of the sharp objectives where the point has no eigenvector yet)."""
    import rotviz.analysis.orbit as orb
    from rotviz.analysis.orbit import act_element, compose

    state0, here = start.state, start
    path = [{"step": 0, "objective": here.value, "loss": here.loss,
             "grad_norm": here.grad_norm, "top": here.top}]
    element: dict = {}
    sign = -1.0 if objective == "sharp-min" else 1.0
    eta, taken = FIRST_STEP, 0
    cur = start.graph.cur
    for k in range(steps):
        if progress is not None:
            progress(k, steps, f"teleport step {k + 1} of {steps}")
        d = _coordinate_grad(orbit, cur, here, objective)
        norm = float(orbit.flat(d).norm())
        if not math.isfinite(norm) or norm == 0.0:
            break
        moved = None
        for _ in range(TRIES):
            x = {key: sign * eta * g / norm for key, g in d.items()}
            trial = compose(element, orbit.transforms(x))
            if orb.max_condition(trial) > max_condition:
                eta /= 2
                continue
            st = act_element(loaded, trial, state0, torch.float64)
            cand = _point(ev, st, objective, here.v if here.v is not None else v0,
                          lanczos_steps)
            if sign * (cand.value - here.value) > 0:
                moved = (trial, cand)
                break
            eta /= 2
        if moved is None:  # no step of any size improves: the path has converged
            break
        element, here = moved
        taken += 1
        eta = min(eta * 2, MAX_STEP)
        path.append({"step": taken, "objective": here.value, "loss": here.loss,
                     "grad_norm": here.grad_norm, "top": here.top})
    return Climb(element, here, taken, path)

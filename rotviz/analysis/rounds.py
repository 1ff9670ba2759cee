"""Weight matching round by round: the distance to the anchor and the barrier after each
round of the residual alternation (rotviz.match.alternating), for its animation.

The matching report keeps the objective (the squared distance between canonical forms) after
every step, but no model of any round. So the alternation runs once more from the source,
with the endpoints' options, and a callback measures each round's matched source as it
comes: its Euclidean distance to the anchor and its barrier on a few points of the path.
Each round's parameters are dropped once measured; only the numbers are kept. Round 0 is the
source as trained; the last round is the endpoints' matched source (`last_round_diff` says
how far apart they are: 0 unless matching kept the source because nothing was lowered).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from rotviz.data.split import Split
from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.limits import POINTS
from rotviz.match.endpoints import HeldEndpoints
from rotviz.types import Progress


@dataclass
class Rounds:
    """Per round of the alternation: distance to the anchor and the path's barrier."""

    alphas: list[float]  # the few points each round's path is evaluated at
    rounds: list[dict]  # phase, round, distance, barrier, loss (per alpha), mid_acc
    match: str
    data: str
    split: str
    n: int
    device: str
    seconds: float
    anchor: str = ""
    source: str = ""
    last_round_diff: float = 0.0  # largest |parameter| difference, last round vs endpoints
    phases: list[int] = field(default_factory=list)  # rounds per phase (the report's)

    def to_dict(self) -> dict:
        return asdict(self)


def why_not_options(options) -> str | None:
    """Why a matching with `options` (None: no matching) has no rounds to replay (one
    line), or None."""
    if options is None or not options.residual:
        return ("rounds follows weight matching's alternation, which only a matching with "
                "the residual map runs: use --match weight (or a SPEC with residual)")
    if options.needs_data:
        return ("rounds replays data-free weight matching, and this matching learns from data "
                f"([{options.label}]): use --match weight")
    return None


def why_not(ends: HeldEndpoints) -> str | None:
    """Why the endpoints have no rounds to show (one line), or None."""
    rep = ends.report
    why = why_not_options(None if rep is None else rep.options)
    if why:
        return why
    if rep.widths:
        return "rounds replays matching in one width, and the source is narrower: match two " \
               "models of one width"
    return None


def rounds_on(ends: HeldEndpoints, split: Split, points: int = 5,
              device: str | torch.device = "cpu", batch_size: int = 512,
              progress: Progress | None = None) -> Rounds:
    """rounds_on(endpoints, split, points=5) -> Rounds

    The endpoints' weight matching run again, round by round: after each round, the matched
    source's distance to the anchor and its barrier on `points` alphas (see module)."""
    from rotviz.analysis.paths import path_curve
    from rotviz.devices import wide_device
    from rotviz.match.distances import distances
    from rotviz.match.pipeline import view_of
    from rotviz.match.residual import match_residual
    from rotviz.symmetry.view import write_state

    why = why_not(ends)
    if why:
        raise RotvizError(why)
    POINTS.check(points)
    t0 = time.perf_counter()
    ev = Evaluator(ends.anchor, split, device, batch_size)
    alphas = np.linspace(0.0, 1.0, points).tolist()
    anchor_params = ev.params(ends.anchor.state)
    wide = wide_device(ev.device)
    va, vs = view_of(ends.anchor, wide), view_of(ends.source, wide)
    out: list[dict] = []

    def measure(phase: int, r: int, view, state) -> None:
        fields = path_curve(ev, anchor_params, ev.params(state), alphas)
        assert fields is not None  # one process
        out.append({"phase": phase, "round": r, "distance": distances(view, va).total,
                    "barrier": fields["barrier"], "loss": fields["loss"],
                    "mid_acc": fields["mid_acc"]})

    measure(0, 0, vs, ends.source.state)
    last: dict[str, torch.Tensor] = {}

    def on_round(phase: int, r: int, matched) -> None:
        view = matched()
        state = {**ends.source.state, **{k: v.to("cpu") for k, v in write_state(view).items()}}
        measure(phase, r, view, state)
        last.clear()
        last.update(state)  # only the latest round's parameters are held

    result = match_residual(va, vs, ends.report.options, progress, on_round)
    diff = max((float((last[k].double() - ends.matched[k].double()).abs().max())
                for k in ends.matched if k in last), default=0.0)
    return Rounds(alphas, out, ends.match, split.data, split.split, split.n, str(ev.device),
                  time.perf_counter() - t0, ends.anchor_ref, ends.source_ref, diff,
                  list(result.report.residual["phase_rounds"]))

"""Weight matching round by round: the distance to the anchor and the barrier after each
round of the residual alternation, drawn and animated.

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
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from rotviz.limits import BATCH_SIZE, POINTS
from rotviz.measures.registry import Context, Measurement, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import torch

    from rotviz.data.split import Split
    from rotviz.match.endpoints import HeldEndpoints
    from rotviz.types import Progress

PARAMS = (
    Param("points", 5, f"alphas on each round's path (default 5: a few, for each of up to "
          f"dozens of rounds; {POINTS.text})", POINTS, label="Points on each round's path",
          widget=(3, 21, 1)),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)


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
    import numpy as np

    from rotviz.analysis.paths import path_curve
    from rotviz.devices import wide_device
    from rotviz.errors import RotvizError
    from rotviz.evaluation import Evaluator
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

    res = ends.report.residual or {}
    # a run its time limit stopped: the same rounds, whatever this replay's clock says (the
    # barriers measured between rounds would count against the limit)
    timed = res.get("ended") == "time"
    result = match_residual(va, vs, ends.report.options, progress, on_round,
                            res["phase_rounds"] if timed else None)
    diff = max((float((last[k].double() - ends.matched[k].double()).abs().max())
                for k in ends.matched if k in last), default=0.0)
    return Rounds(alphas, out, ends.match, split.data, split.split, split.n, str(ev.device),
                  time.perf_counter() - t0, ends.anchor_ref, ends.source_ref, diff,
                  list(result.report.residual["phase_rounds"]))


def _run(ends, ctx: Context, v: dict):
    return rounds_on(ends, ctx.split, v["points"], ctx.device, v["batch_size"], ctx.progress)


def _summary(r, how: str) -> str:
    first, last = r.rounds[0], r.rounds[-1]
    return (f"rounds [{r.match}] on {r.device}{how}: {len(r.rounds) - 1} rounds "
            f"({' + '.join(map(str, r.phases))} by phase); distance {first['distance']:.3f} -> "
            f"{last['distance']:.3f}, barrier {first['barrier']:.4f} -> {last['barrier']:.4f} "
            f"({len(r.alphas)} points on {r.n} {r.split} samples); last round vs matched "
            f"source {r.last_round_diff:.1e}; {r.seconds:.2f} s")


def _rows(d: dict) -> list[dict]:
    return [{"phase": x["phase"], "round": x["round"], "distance": x["distance"],
             "barrier": x["barrier"], "mid_acc": x["mid_acc"]} for x in d["rounds"]]


ROUND = "round (0: the source as trained)"
PATH_ALPHA = "α (0 = anchor, 1 = matched source)"


def _round_labels(rounds: Sequence[Mapping]) -> list[str]:
    return [f"{x['round']}{' (heads)' if x['phase'] else ''}" for x in rounds]


def rounds_figure(d: Mapping, style: Style | None = None):
    """Distance to the anchor and barrier after each round (`Rounds.to_dict()`); `style.log`:
    the distance and the barrier on log axes."""
    from plotly.subplots import make_subplots

    from rotviz.plots import style as look

    font_size = (style or Style()).font_size
    rounds = d["rounds"]
    x = list(range(len(rounds)))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14)
    fig.add_scatter(x=x, y=[r["distance"] for r in rounds], mode="lines+markers",
                    name="distance to the anchor", line={"color": look.color(3), "width": 2.5},
                    marker={"symbol": look.marker(0)}, row=1, col=1)
    fig.add_scatter(x=x, y=[r["barrier"] for r in rounds], mode="lines+markers",
                    name=f"barrier ({len(d['alphas'])} points on the path)",
                    line={"color": look.color(4), "width": 2.5, "dash": "dash"},
                    marker={"symbol": look.marker(1)}, row=1, col=2)
    look.finish(fig, "Weight matching round by round: distance and barrier", ROUND,
                 look.DISTANCE, "", font_size, height=460)
    fig.update_xaxes(title_text=ROUND, row=1, col=2)
    fig.update_yaxes(title_text=look.BARRIER, row=1, col=2)
    fig.update_layout(legend={"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"})
    if style is not None and style.log:
        look.log_axis(fig, "y")
    return fig


def rounds_animation(d: Mapping, font_size: int = 14, width: int = 1000):
    """Weight matching round by round as frames: frame k holds the distance and the barrier
    after rounds 0..k, and round k's loss along the path (round 0's stays, dotted)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from rotviz.plots import style as look
    from rotviz.plots.animate import controls, padded_range
    rounds, alphas = d["rounds"], [float(a) for a in d["alphas"]]
    x = list(range(len(rounds)))
    dist = [float(r["distance"]) for r in rounds]
    bar = [float(r["barrier"]) for r in rounds]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09)
    fig.add_scatter(x=x[:1], y=dist[:1], mode="lines+markers", name="distance to the anchor",
                    line={"color": look.color(3), "width": 2.5},
                    marker={"symbol": look.marker(0), "size": 7}, row=1, col=1)
    fig.add_scatter(x=x[:1], y=bar[:1], mode="lines+markers",
                    name=f"barrier ({len(alphas)} points)",
                    line={"color": look.color(4), "width": 2.5, "dash": "dash"},
                    marker={"symbol": look.marker(1), "size": 7}, row=1, col=2)
    fig.add_scatter(x=alphas, y=rounds[0]["loss"], mode="lines+markers",
                    name="loss on the path, this round", line={"color": look.color(0),
                                                               "width": 2.5},
                    marker={"symbol": look.marker(2), "size": 7}, row=1, col=3)
    fig.add_scatter(x=alphas, y=rounds[0]["loss"], mode="lines",
                    name="loss on the path, source as trained",
                    line={"color": look.GREY, "width": 1.5, "dash": "dot"}, row=1, col=3)
    fig.update_xaxes(range=[-0.5, len(rounds) - 0.5], title_text=ROUND, row=1, col=1)
    fig.update_xaxes(range=[-0.5, len(rounds) - 0.5], title_text=ROUND, row=1, col=2)
    fig.update_xaxes(range=[-0.03, 1.03], title_text=PATH_ALPHA, row=1, col=3)
    fig.update_yaxes(range=padded_range(dist), title_text=look.DISTANCE, row=1, col=1)
    fig.update_yaxes(range=padded_range(bar), title_text=look.BARRIER, row=1, col=2)
    fig.update_yaxes(range=padded_range([v for r in rounds for v in r["loss"]]),
                     title_text=look.LOSS, row=1, col=3)
    fig.frames = [go.Frame(name=str(k), traces=[0, 1, 2], data=[
        go.Scatter(x=x[: k + 1], y=dist[: k + 1]), go.Scatter(x=x[: k + 1], y=bar[: k + 1]),
        go.Scatter(x=alphas, y=rounds[k]["loss"])]) for k in x]
    look.finish(fig, "Weight matching round by round: distance, barrier and the path",
                 ROUND, look.DISTANCE, "", font_size, height=500)
    fig.update_layout(width=width, legend={"orientation": "h", "x": 0, "y": 1.02,
                                           "yanchor": "bottom"},
                      margin={"l": 70, "r": 30, "t": 110, "b": 120})
    controls(fig, _round_labels(rounds), "round ")
    return fig


RECORD = register(Measurement(
    "rounds", "Weight matching round by round",
    "distance and barrier after each round of weight matching's alternation (--match weight)",
    _run, PARAMS, summary=_summary, plot=rounds_figure, rows=_rows, animate=rounds_animation,
    match_default="weight", match_check=why_not_options,
    refusal="it replays the alternation with the pair in memory; run it on models that fit",
    order=180))

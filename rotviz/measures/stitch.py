"""stitch: layer swaps between two models (Bansal et al., NeurIPS 2021; Csiszarik et al.,
2021), before and after matching (docs/function.md).

Hybrid k (k = 0 .. L) runs the anchor's embeddings and its first k blocks, then the matched
source's blocks k .. L-1, its final norm and its head (rotviz.analysis.stitching: a state
dict assembled by tensor name from the architecture data, evaluated on the anchor's module).
Hybrid L is the anchor under the matched source's final norm and head; hybrid 0 is the
matched source under the anchor's embeddings. The same hybrids with the source unmatched
are beside them: without matching the two residual streams are in unrelated bases and the
swap breaks the model; after matching the residual stream (`--match weight`) the halves of
two independently trained models fit together with no stitching layer at all.

With `--match none` the matched source is the source, so `loss` and `loss_unmatched` are
the same list (computed once). `--learn` trains an affine stitching layer (d x d and a
bias, from the identity) at each boundary on the train split and reports its loss beside
the identity stitch's (`--learn`, or `--learn yes`: a yes/no choice is also a switch).

Here: the record, the hybrids in memory (`stitch_on`) and at size (`sized_stitch`: each
hybrid run block by block), and the figure (`stitch_figure`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from rotviz.limits import BATCH_SIZE, LR, SEED, STEPS
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import torch

    from rotviz.data.split import Split
    from rotviz.match.endpoints import HeldEndpoints
    from rotviz.types import Progress

PARAMS = (
    Param("learn", "no", "yes: also train an affine stitching layer (d x d and a bias, from "
          "the identity) at each boundary on the train split (default no)",
          choices=("no", "yes"), label="Also train a stitching layer", essential=True),
    Param("steps", 30, f"Adam steps training each stitching layer (default 30, {STEPS.text})",
          STEPS, label="Training steps", widget=(10, 500, 10), needs=("learn", ("yes",))),
    Param("lr", 0.01, f"Adam learning rate of the stitching layers (default 0.01, {LR.text})",
          LR, label="Learning rate", needs=("learn", ("yes",))),
    Param("seed", 0, "seed of the training batches (default 0)", SEED, label="Seed",
          needs=("learn", ("yes",))),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text}); "
          "training batches are 64 examples", BATCH_SIZE, label="Evaluation batch size"),
)
TRAIN_BATCH = 64


@dataclass
class Stitched:
    """Each hybrid's loss and accuracy, with and without matching (and a learned stitch)."""

    layers: list[int]  # k: the anchor's first k blocks, then the other model's
    loss: list[float]  # with the matched source
    acc: list[float]
    loss_unmatched: list[float]  # with the source as it is (= loss with --match none)
    acc_unmatched: list[float]
    loss_anchor: float
    acc_anchor: float
    loss_source: float  # the matched source's own
    acc_source: float
    loss_source_unmatched: float
    acc_source_unmatched: float
    match: str
    data: str
    split: str
    device: str
    seconds: float
    n: int
    learn: bool = False
    loss_learned: list[float | None] | None = None  # matched source, trained stitch at k
    acc_learned: list[float | None] | None = None
    steps: int = 0
    lr: float = 0.0
    seed: int = 0
    stopped: str = ""  # "steps" or "cancelled" (learn)
    train_loss: list[list[float]] = field(default_factory=list)  # per boundary, per step
    n_train: int = 0
    anchor: str = ""
    source: str = ""
    layers_matched: list[int] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def stitch_on(ends: HeldEndpoints, split: Split, learn: bool = False, steps: int = 30,
              lr: float = 0.01, seed: int = 0, device: str | torch.device = "cpu",
              progress: Progress | None = None, batch_size: int = 512,
              cancel=None, train: Split | None = None) -> Stitched:
    """stitch_on(endpoints, split, learn=False) -> Stitched

    Every hybrid k = 0 .. L of the anchor's first k blocks and the matched source's rest,
    and of the source unmatched, evaluated on `split`; with `learn`, the matched hybrids with
    a stitching layer trained on `train` (default: the split's train sibling)."""
    import time

    from rotviz.analysis.stitching import (
        Parts,
        check_same_shape,
        depth_and_width,
        hybrid_state,
        learned_stitches,
    )
    from rotviz.evaluation import Evaluator

    t0 = time.perf_counter()
    check_same_shape(ends.anchor, ends.source)
    parts = Parts(ends.anchor)
    ev = Evaluator(ends.anchor, split, device, batch_size)
    a = ends.anchor.state
    layers = list(range(parts.depth + 1))
    targets = [ends.matched] if ends.match == "none" else [ends.matched, ends.source.state]
    items = [(t, k) for t in range(len(targets)) for k in layers]
    ends_items = [None, *range(len(targets))]  # the anchor, then each target as it is

    def tick(done: int) -> None:
        if progress:
            progress(done, len(items) + len(ends_items), "hybrids")

    got = ev.evaluate_each(lambda it: ev.params(hybrid_state(parts, a, targets[it[0]], it[1])),
                           items, tick)
    own = []
    for t in ends_items:
        own.append(ev.evaluate(ev.params(a if t is None else targets[t])))
        tick(len(items) + len(own))
    per = [got[t * len(layers):(t + 1) * len(layers)] for t in range(len(targets))]
    un = per[-1]
    out = Stitched(
        layers, [x[0] for x in per[0]], [x[1] for x in per[0]], [x[0] for x in un],
        [x[1] for x in un], own[0][0], own[0][1], own[1][0], own[1][1], own[-1][0], own[-1][1],
        ends.match, split.data, split.split, str(ev.device), 0.0, split.n,
        anchor=ends.anchor_ref, source=ends.source_ref, layers_matched=ends.layers)
    if learn:
        train = train if train is not None else split.sibling("train")
        ev_train = Evaluator(ends.anchor, train, ev.device, batch_size)
        d = depth_and_width(ends.anchor)[1]
        loss, acc, info = learned_stitches(ev, ev_train, parts, a, ends.matched, d, steps, lr,
                                           seed, TRAIN_BATCH, progress, cancel)
        out.learn, out.loss_learned, out.acc_learned = True, loss, acc
        out.steps, out.lr, out.seed, out.stopped = steps, lr, seed, info.stopped
        out.train_loss, out.n_train = info.train_loss, train.n
    out.seconds = time.perf_counter() - t0 + ends.info.seconds
    return out


def sized_stitch(ends, split: Split, device: str | torch.device = "cpu",
                 progress: Progress | None = None, batch_size: int = 512) -> Stitched:
    """`stitch_on` (identity stitches) on streamed endpoints (rotviz.atsize.endpoints:
    checkpoint folders), each hybrid run block by block, each block read from the model it
    comes from as it runs."""
    import time

    from rotviz.analysis.stitching import sized_hybrids
    from rotviz.match.endpoints import MatchInfo

    t0 = time.perf_counter()
    unmatched = ends.matched_path == ends.source_path  # --match none: one target
    refs = [ends.anchor_path, ends.matched_path] + ([] if unmatched else [ends.source_path])
    got, own = sized_hybrids(refs, split, device, batch_size, len(refs) - 1, progress)
    info: MatchInfo = ends.info or MatchInfo("none", 0.0, 0.0, None, 0.0)
    m, u = got[0], got[-1]
    return Stitched(
        list(range(len(m))), [x[0] for x in m], [x[1] for x in m], [x[0] for x in u],
        [x[1] for x in u], own[0][0], own[0][1], own[1][0], own[1][1], own[-1][0], own[-1][1],
        info.match, split.data, split.split, str(device), time.perf_counter() - t0 + info.seconds,
        split.n, anchor=ends.anchor_ref, source=ends.source_ref, layers_matched=ends.layers)


def _run(ends, ctx: Context, v: dict):
    return stitch_on(ends, ctx.split, v["learn"] == "yes", v["steps"], v["lr"], v["seed"],
                     ctx.device, ctx.progress, v["batch_size"], ctx.cancel)


def _at_size(ends, ctx: Context, v: dict):
    return sized_stitch(ends, ctx.split, ctx.device, ctx.progress, v["batch_size"])


def _at_size_check(v: dict) -> None:
    from rotviz.errors import RotvizError

    if v.get("learn") == "yes":
        raise RotvizError("the pair is evaluated block by block (--max-memory), and --learn "
                          "trains a stitch through a model held in memory; raise --max-memory "
                          "or drop --learn")


def _summary(r: Stitched, how: str) -> str:
    worst = max(r.loss)
    worst_u = max(r.loss_unmatched)
    learned = ""
    if r.learn and r.loss_learned:
        done = [x for x in r.loss_learned if x is not None]
        learned = (f"; learned stitch worst {max(done):.4f} ({r.stopped})" if done else
                   f"; learned stitch {r.stopped}")
    return (f"stitch [{r.match}] on {r.device}{how}: {len(r.layers)} hybrids, worst loss "
            f"{worst:.4f} matched, {worst_u:.4f} unmatched (anchor {r.loss_anchor:.4f}, "
            f"source {r.loss_source:.4f}){learned}; {r.n} {r.split} samples in "
            f"{r.seconds:.2f} s")


K_AXIS = "boundary k (anchor's embeddings and blocks 0..k-1, then the source's blocks k..)"


def stitch_figure(d: Mapping, metric: str = "loss", font_size: int = 14,
                  title: str | None = None) -> go.Figure:
    """The loss (or accuracy) of each hybrid against k: one line with the source unmatched,
    one with it matched, one with a learned stitch (when trained); the anchor's and the
    source's own values as dotted reference lines. `d` is `Stitched.to_dict()`."""
    import plotly.graph_objects as go

    from rotviz.plots import style

    key = "loss" if metric == "loss" else "acc"
    ks = [int(k) for k in d["layers"]]
    series = []
    if d["match"] != "none":
        series.append(("source as it is, no stitching layer", d[key + "_unmatched"]))
    series.append((f"matched source ({d['match']}), no stitching layer", d[key]))
    if d.get(key + "_learned") is not None:
        series.append(("matched source, trained affine stitch", d[key + "_learned"]))
    fig = go.Figure()
    for i, (name, ys) in enumerate(series):
        fig.add_scatter(x=ks, y=ys, mode="lines+markers", name=name,
                        line={"color": style.color(i), "dash": style.dash(i), "width": 2.5},
                        marker={"symbol": style.marker(i), "size": 8},
                        hovertemplate="k=%{x}: %{y:.4f}<extra>" + name + "</extra>")
    for j, (who, value) in enumerate((("anchor", d[key + "_anchor"]),
                                      ("source", d[key + "_source"]))):
        fig.add_scatter(x=[ks[0], ks[-1]], y=[value, value], mode="lines",
                        name=f"{who} alone ({value:.3f})",
                        line={"color": style.GREY, "dash": "dot" if j == 0 else "dash",
                              "width": 1.5})
    what = "Loss" if key == "loss" else "Accuracy"
    fig = style.finish(fig, title or f"{what} of the layer swaps on {style.evaluated_on(d)}",
                       K_AXIS, style.LOSS if key == "loss" else style.ACCURACY, "hybrid",
                       font_size)
    fig.update_xaxes(tickmode="array", tickvals=ks)
    fig.update_layout(legend={"orientation": "h", "y": -0.25, "x": 0})
    if key == "acc":
        fig.update_yaxes(range=list(style.ACC_FIXED))
    return fig


def _plot(d: dict, look: Style):
    return stitch_figure(d, "loss", look.font_size)


def _figures(d: dict, look: Style) -> dict:
    return {"loss": stitch_figure(d, "loss", look.font_size),
            "accuracy": stitch_figure(d, "acc", look.font_size)}


def _rows(d: dict) -> list[dict]:
    rows = []
    for i, k in enumerate(d["layers"]):
        row = {"k": k, "loss": d["loss"][i], "acc": d["acc"][i],
               "loss_unmatched": d["loss_unmatched"][i], "acc_unmatched": d["acc_unmatched"][i]}
        if d.get("loss_learned") is not None:
            row.update(loss_learned=d["loss_learned"][i], acc_learned=d["acc_learned"][i])
        rows.append(row)
    return rows


def _caption(d: dict) -> str:
    """The worst and the last hybrid's numbers, and what they say about the teaching point
    (swapping halves with no stitching layer), as measured, not as hoped."""
    worst, worst_u = max(d["loss"]), max(d["loss_unmatched"])
    ends = max(d["loss_anchor"], d["loss_source"])
    text = (f"Worst hybrid: loss {worst:.3f} after matching, {worst_u:.3f} without "
            f"(anchor {d['loss_anchor']:.3f}, source {d['loss_source']:.3f}); the anchor under "
            f"the other's final norm and head (k = {d['layers'][-1]}): {d['loss'][-1]:.3f} "
            f"matched, {d['loss_unmatched'][-1]:.3f} unmatched. ")
    if d["match"] == "none":
        return text + "Without matching the second half reads a stream in another basis."
    if worst <= 2 * ends:
        text += ("After matching the residual stream, the halves of the two independently "
                 "trained models swap with no stitching layer at all.")
    elif all(x < y for x, y in zip(d["loss"], d["loss_unmatched"], strict=True)):
        text += ("Matching the residual stream makes every swap better, but with no "
                 "stitching layer the hybrids stay far from the endpoints here: the two "
                 "streams are not the same up to the map matching found.")
    elif worst < worst_u:
        text += "Matching makes the worst swap better, not every one."
    else:
        text += ("This matching does not map the residual stream (only `residual` or "
                 "`weight` does), so the swaps are no better than without it.")
    if d.get("loss_learned") is not None:
        done = [x for x in d["loss_learned"] if x is not None]
        if done:
            text += f" A trained affine stitch reaches {max(done):.3f} at worst."
    return text


SECTION = Section(
    "function", 20, "Layer swaps",
    "Model stitching (Bansal et al., 2021; Csiszarik et al., 2021): run the anchor's "
    "embeddings and its first *k* blocks, then the other model's remaining blocks, final "
    "norm and head, for every *k*. Without matching the second half reads a residual stream "
    "written in another basis. Matching the stream (`weight` matching: the residual map) "
    "puts the two in one basis, the condition for swapping halves with no stitching layer; "
    "matching only inside the blocks (`seed`) changes no swap. Optionally an affine "
    "stitching layer is trained at each boundary for comparison.",
    caption=_caption, figures=_figures, tabs=("Loss", "Accuracy"),
    doing=lambda v: "matching, then every hybrid" + (" and a stitch per boundary"
                                                     if v.get("learn") == "yes" else ""))

STITCH = register(Measurement(
    "stitch", "Layer swaps",
    "hybrids of the anchor's first k blocks and the matched source's rest (model stitching), "
    "matched against unmatched; --learn trains an affine stitch at each boundary",
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows, section=SECTION,
    at_size=_at_size, at_size_check=_at_size_check,
    at_size_help="matched at size, each hybrid run block by block, each block read from "
                 "the model it comes from (--learn needs the models in memory)",
    at_size_how=" (at size: each hybrid run block by block)", progress=True, order=215))

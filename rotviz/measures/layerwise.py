"""Layer-wise barriers (Adilova et al., ICLR 2024): the barrier when only one group of
tensors (a block, or a module kind) moves from the anchor to the matched source while the
rest stays at the anchor, theta_g(alpha) = lerp(A, S_g, alpha) with S_g the anchor with g's
tensors from the matched source (rotviz.analysis.tensor_groups), and cumulatively, groups
0..i together (the last step is the full path); beside the same toward the source unmatched
(docs/landscape.md). Each barrier is the GLMC barrier of its own path
(rotviz.evaluation.barrier_of): max over alpha of the loss above the straight line between
the path's end losses; >= 0.

Here: the record, the series of paths in memory (`layerwise_on`) and at size
(`sized_layerwise`: the checkpoints held as stored, each point lerp(A, S_g, alpha) built one
block at a time just before the block runs; by kind, a block's canonical views of anchor and
target mixed field by field; buffers stay the anchor's, a tied alias is its owner; the same
series, each distinct point evaluated once, dealt among torchrun's processes), and the
figure (`layerwise_bars`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from rotviz.limits import BATCH_SIZE, POINTS
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import torch

    from rotviz.analysis.tensor_groups import Point
    from rotviz.data.split import Split
    from rotviz.dist import Group
    from rotviz.evaluation import Evaluator
    from rotviz.match.endpoints import HeldEndpoints
    from rotviz.types import Progress

PARAMS = (
    Param("points", 11, f"number of alphas in [0, 1] on each group's path (default 11, "
          f"{POINTS.text})", POINTS, label="Points on each path", widget=(3, 41, 2),
          essential=True),
    Param("by", "block", "the groups interpolated one at a time: block (each block, then "
          "'rest': embeddings, final norm, head) or kind (q, k, v, o, ffn, norms, "
          "embeddings, head) (default block)", choices=("block", "kind"), label="Groups",
          essential=True),
    Param("compare", "yes", "yes: also the same groups toward the source unmatched (twice the "
          "time); no: the matched source only (default yes)", choices=("yes", "no"),
          label="Also without matching"),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)


@dataclass
class Layerwise:
    """Barriers of each group's path, alone and cumulatively, with and without matching."""

    by: str  # block | kind
    alphas: list[float]
    groups: list[str]  # '0', '1', ..., 'rest' | q, k, v, o, ffn, norms, embeddings, head
    barrier: list[float]  # per group, its own path (matched source)
    rise: list[float]  # per group, above the line between the whole models' losses (rise_of)
    loss: list[list[float]]  # per group, the loss at each alpha
    cumulative: list[str]  # step i moves groups 0..i ('0-3', ...); the last is the full path
    cum_barrier: list[float]
    cum_loss: list[list[float]]
    full_barrier: float  # the full path's (= the last cumulative step's)
    loss_anchor: float
    loss_source: float  # the matched source's
    barrier_unmatched: list[float] | None  # the same groups, source unmatched (None: no compare)
    rise_unmatched: list[float] | None
    cum_barrier_unmatched: list[float] | None
    full_barrier_unmatched: float | None
    match: str
    data: str
    split: str
    device: str
    seconds: float
    n: int
    layers: list[int] | None = None
    anchor: str = ""
    source: str = ""
    loss_unmatched: list[list[float]] | None = None
    cum_loss_unmatched: list[list[float]] | None = None
    acc: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def assemble(by: str, alphas: list[float], m: dict, u: dict | None, info, split: Split,
             device: str, seconds: float, layers, anchor: str, source: str) -> Layerwise:
    """The `Layerwise` of the series toward the matched source `m` and the source `u`."""
    return Layerwise(
        by=by, alphas=alphas, groups=m["groups"], barrier=m["barrier"], rise=m["rise"],
        loss=m["loss"],
        cumulative=m["cumulative"], cum_barrier=m["cum_barrier"], cum_loss=m["cum_loss"],
        full_barrier=m["cum_barrier"][-1], loss_anchor=m["loss"][0][0],
        loss_source=m["cum_loss"][-1][-1],
        barrier_unmatched=None if u is None else u["barrier"],
        rise_unmatched=None if u is None else u["rise"],
        cum_barrier_unmatched=None if u is None else u["cum_barrier"],
        full_barrier_unmatched=None if u is None else u["cum_barrier"][-1],
        match=info.match, data=split.data, split=split.split, device=device,
        seconds=seconds + info.seconds, n=split.n, layers=layers, anchor=anchor,
        source=source, loss_unmatched=None if u is None else u["loss"],
        cum_loss_unmatched=None if u is None else u["cum_loss"], acc=m["acc"])


def layerwise_on(ends: HeldEndpoints, split: Split, points: int = 11, by: str = "block",
                 compare: bool = True, device: str | torch.device = "cpu",
                 progress: Progress | None = None, batch_size: int = 512,
                 evaluator: Evaluator | None = None) -> Layerwise:
    """layerwise_on(endpoints, split, points=11, by="block") -> Layerwise

    Each group's barrier when only that group moves from the anchor to the matched source,
    and cumulatively (groups 0..i); with `compare` (and a matched pair) the same toward the
    source unmatched."""
    import time

    import numpy as np
    import torch

    from rotviz.analysis.paths import path_point
    from rotviz.analysis.tensor_groups import BY, GroupStates, series
    from rotviz.errors import RotvizError
    from rotviz.evaluation import Evaluator
    from rotviz.limits import POINTS

    POINTS.check(points)
    if by not in BY:
        raise RotvizError(f"unknown --by '{by}': use one of {', '.join(BY)}")
    t0 = time.perf_counter()
    ev = evaluator or Evaluator(ends.anchor, split, device, batch_size)
    alphas = np.linspace(0.0, 1.0, points).tolist()
    compare = compare and ends.match != "none"
    a = ends.anchor.state
    states = [GroupStates(ends.anchor, a, ends.matched, by)]
    if compare:
        states.append(GroupStates(ends.anchor, a, ends.source.state, by))
    pa = ev.params(a)

    def path(t: int, groups: tuple[str, ...]) -> Point:
        pb = ev.params(states[t].state(groups))
        return lambda al: ev.evaluate(path_point(pa, pb, al))

    def same(g: str) -> bool:
        x, y = (ev.params(s.state([g])) for s in states)
        return all(torch.equal(x[k], y[k]) for k in pa)

    def tick(done: int, total: int, what: str) -> None:
        if progress:
            progress(done, total, f"{by} {what}")

    # the latest path's target, (key, parameters): replaced whole, never edited, so workers
    # evaluating points side by side (Evaluator.evaluate_each) read a consistent pair
    latest: list = [None]

    def point(item: tuple[int, tuple[str, ...], float]) -> dict:
        t, groups, al = item
        last = latest[0]
        if last is None or last[0] != (t, groups):
            last = latest[0] = ((t, groups), ev.params(states[t].state(groups)))
        return path_point(pa, last[1], al)

    found = series(states[0].groups, len(states), alphas, lambda: ev.evaluate(pa), path,
                   same, tick=tick, many=lambda items, done: ev.evaluate_each(point, items,
                                                                              done))
    assert found is not None  # one process
    return assemble(by, alphas, found[0], found[1] if compare else None, ends.info, split,
                    str(ev.device), time.perf_counter() - t0, ends.layers, ends.anchor_ref,
                    ends.source_ref)


@functools.cache
def _groups_held() -> type:
    """`GroupsHeld`, the checkpoints a series holds at size, made at first use: it derives
    from the at-size `Held`, which imports torch, and listing the records must not."""
    import torch

    from rotviz.analysis.paths import path_point
    from rotviz.analysis.tensor_groups import BY, REST, block_mixed, kind_outside, kinds_of
    from rotviz.atsize.blocks import block_tensors, block_view
    from rotviz.atsize.points import Held
    from rotviz.errors import RotvizError
    from rotviz.sources.adapters import source_of
    from rotviz.symmetry.view import read_block

    Tensor = torch.Tensor

    class GroupsHeld(Held):
        """The anchor and its targets (matched source, then the source) held as stored,
        with the groups of `by` and the tensors each moves."""

        def __init__(self, refs: list[str], split: Split, by: str,
                     device: str | torch.device = "cpu", batch_size: int = 512):
            if by not in BY:
                raise RotvizError(f"unknown --by '{by}': use one of {', '.join(BY)}")
            super().__init__(refs, split, device, batch_size)
            self.by = by
            model = self.model = self.models[0]
            module_name = source_of(model.spec).checkpoint_names(self.module, list(self.keys))
            params = {n for n, _ in self.module.named_parameters()}
            self.owner = dict(model.tied)  # alias -> owner (checkpoint names)
            self.moves = {n for n in self.keys
                          if module_name.get(self.owner.get(n, n)) in params
                          and self.tensors[0][n].is_floating_point()}
            self.block_of = {n: k for k, keys in enumerate(model.block_keys) for n in keys}
            prefixes = model.layout.blocks
            if by == "block":
                self.groups = [str(i) for i in range(len(prefixes))] + [REST]

                def group_of(n: str) -> str:
                    n = self.owner.get(n, n)
                    return next((str(i) for i, p in enumerate(prefixes) if n.startswith(p)), REST)
            else:
                meta = model.state
                blocks = [read_block(model.spec, model.dims, model.layout, meta, p)
                          for p in prefixes]
                other = [n for n in model.rest if n not in self.owner
                         and model.checkpoint.entries[n].dtype.is_floating_point]
                self.groups = kinds_of(blocks, other, self.kind)

                def group_of(n: str) -> str:
                    return self.kind(n)
            self.group_of = group_of

        def kind(self, name: str) -> str:
            return kind_outside(name, self.model.layout, self.owner)

        def target_block(self, t: int, chosen: frozenset[str], k: int) -> dict[str, Tensor]:
            """Block k of S: the anchor with the groups `chosen` from target t (float32)."""
            a, b = self.tensors[0], self.tensors[1 + t]
            keys = self.model.block_keys[k]
            if self.by == "block":
                return {n: (b if n in self.moves and self.group_of(n) in chosen else a)[n].float()
                        for n in keys}
            prefix = self.model.layout.blocks[k]
            spec, dims, layout = self.model.spec, self.model.dims, self.model.layout
            va = read_block(spec, dims, layout, {n: a[n].float() for n in keys}, prefix)
            vb = read_block(spec, dims, layout, {n: b[n].float() for n in keys}, prefix)
            view = block_view(self.model, block_mixed(va, vb, set(chosen)), k,
                              {n: torch.float32 for n in keys})
            return block_tensors(view, k, self.model)

        def target_rest(self, t: int, chosen: frozenset[str], names) -> dict[str, Tensor]:
            """The named tensors outside the blocks of S (float32; others as stored)."""
            out = {}
            for n in names:
                key = self.owner.get(n, n)
                a, b = self.tensors[0][key], self.tensors[1 + t][key]
                if not a.is_floating_point():
                    out[n] = a
                else:
                    moved = n in self.moves and self.group_of(n) in chosen
                    out[n] = (b if moved else a).float()
            return out

        def target(self, t: int, chosen: frozenset[str], names) -> dict[str, Tensor]:
            """The named tensors of S, block tensors through their whole block."""
            out: dict[str, Tensor] = {}
            inside = [n for n in names if n in self.block_of]
            for k in dict.fromkeys(self.block_of[n] for n in inside):
                out.update(self.target_block(t, chosen, k))
            out.update(self.target_rest(t, chosen, [n for n in names if n not in self.block_of]))
            return {n: out[n] for n in names}

        def point(self, t: int, chosen: frozenset[str], alpha: float, names) -> dict[str, Tensor]:
            """lerp(A, S, alpha) for the named tensors, as the in-memory path computes it."""
            s = self.target(t, chosen, names)
            out = {}
            for n in names:
                a = self.tensors[0][self.owner.get(n, n)]
                out[n] = a.float() if a.is_floating_point() else a
            return path_point(out, s, alpha)

        def loss_acc(self, rest, provider) -> tuple[float, float]:  # type: ignore[override]
            per, _ = self.run(rest, provider)
            return float(per[0].sum() / per[2].sum()), float(per[1].sum() / per[2].sum())

        def anchor(self) -> tuple[float, float]:
            a, keys = self.tensors[0], self.model.block_keys
            return self.loss_acc(lambda ns: self.target_rest(0, frozenset(), ns),
                                 lambda k: {n: a[n].float() for n in keys[k]})

        def path(self, t: int, groups: tuple[str, ...]) -> Point:
            chosen, keys = frozenset(groups), self.model.block_keys

            def at(alpha: float) -> tuple[float, float]:
                return self.loss_acc(lambda ns: self.point(t, chosen, alpha, ns),
                                     lambda k: self.point(t, chosen, alpha, keys[k]))
            return at

        def same(self, g: str) -> bool:
            """Whether moving `g` toward either target gives bit for bit the same tensors."""
            chosen = frozenset([g])
            for k in range(len(self.model.block_keys)):
                x, y = self.target_block(0, chosen, k), self.target_block(1, chosen, k)
                if not all(torch.equal(x[n], y[n]) for n in x):
                    return False
            x, y = (self.target_rest(t, chosen, self.model.rest) for t in (0, 1))
            return all(torch.equal(x[n], y[n]) for n in x)

    return GroupsHeld


def sized_layerwise(ends, split: Split, points: int = 11, by: str = "block",
                    compare: bool = True, device: str | torch.device = "cpu",
                    progress: Progress | None = None, batch_size: int = 512,
                    group: Group | None = None) -> Layerwise | None:
    """`layerwise_on` on streamed endpoints
    (rotviz.atsize.endpoints: anchor, matched source and source as checkpoint folders), each
    point built block by block. Under torchrun (`group`) the points are shared and rank 0
    returns the result (None elsewhere)."""
    import time

    import numpy as np

    from rotviz.analysis.tensor_groups import BY, series
    from rotviz.dist import SINGLE
    from rotviz.errors import RotvizError
    from rotviz.limits import POINTS
    from rotviz.match.endpoints import MatchInfo

    POINTS.check(points)
    if by not in BY:
        raise RotvizError(f"unknown --by '{by}': use one of {', '.join(BY)}")
    t0 = time.perf_counter()
    compare = compare and ends.matched_path != ends.source_path  # the same on every rank
    refs = [ends.anchor_path, ends.matched_path] + ([ends.source_path] if compare else [])
    held = _groups_held()(refs, split, by, device, batch_size)
    alphas = np.linspace(0.0, 1.0, points).tolist()

    def tick(done: int, total: int, what: str) -> None:
        if progress:
            progress(done, total, f"{by} {what}")

    found = series(held.groups, 2 if compare else 1, alphas, held.anchor, held.path,
                   held.same, group or SINGLE, tick)
    if found is None:
        return None
    info: MatchInfo = ends.info or MatchInfo("none", 0.0, 0.0, None, 0.0)
    return assemble(by, alphas, found[0], found[1] if compare else None, info, split,
                    str(held.device), time.perf_counter() - t0, ends.layers,
                    ends.anchor_ref, ends.source_ref)


def _run(ends, ctx: Context, v: dict):
    return layerwise_on(ends, ctx.split, v["points"], v["by"], v["compare"] == "yes",
                        ctx.device, ctx.progress, v["batch_size"])


def _at_size(ends, ctx: Context, v: dict):
    return sized_layerwise(ends, ctx.split, v["points"], v["by"], v["compare"] == "yes",
                           ctx.device, ctx.progress, v["batch_size"], ctx.group)


def _summary(r, how: str) -> str:
    top = max(range(len(r.groups)), key=lambda i: r.barrier[i])
    unm = "" if r.full_barrier_unmatched is None else \
        f" (unmatched {r.barrier_unmatched[top]:.4f}, full path {r.full_barrier_unmatched:.4f})"
    return (f"layer-wise barriers by {r.by} [{r.match}] on {r.device}{how}: largest "
            f"{r.by} {r.groups[top]} {r.barrier[top]:.4f}{unm}; full path {r.full_barrier:.4f}; "
            f"{len(r.groups)} groups x {len(r.alphas)} points on {r.n} {r.split} samples in "
            f"{r.seconds:.2f} s")


KIND = "module kind (the group of tensors interpolated)"


def layerwise_bars(d: Mapping, font_size: int = 14, title: str | None = None) -> go.Figure:
    """Bars of the barrier when only one group moves (per block or per module kind), matched
    beside unmatched, and the cumulative barrier (groups 0..i moved) as a line per matching.

    `d` is `Layerwise.to_dict()`."""
    import plotly.graph_objects as go

    from rotviz.plots import style

    fig = go.Figure()
    groups = [str(g) for g in d["groups"]]
    matched = style.nice_label(str(d["match"]))
    series = [(f"{matched}: one {d['by']} at a time", d["barrier"], d["cum_barrier"])]
    if d.get("barrier_unmatched") is not None:
        series.insert(0, ("no matching: one " + d["by"] + " at a time", d["barrier_unmatched"],
                          d["cum_barrier_unmatched"]))
    for i, (name, bars, cum) in enumerate(series):
        fig.add_bar(x=groups, y=bars, name=name, marker_color=style.color(i),
                    hovertemplate="%{x}: barrier %{y:.4f}<extra>" + name + "</extra>")
        cname = name.replace(f"one {d['by']} at a time", f"{d['by']}s 0..i together")
        fig.add_scatter(x=groups, y=cum, mode="lines+markers", name=cname,
                        line={"color": style.color(i), "dash": style.dash(i + 1), "width": 2},
                        marker={"symbol": style.marker(i), "size": 7},
                        hovertemplate="up to %{x}: barrier %{y:.4f}<extra>" + cname + "</extra>")
    fig.update_layout(barmode="group")
    x = style.LAYER if d["by"] == "block" else KIND
    return style.finish(fig, title or f"Layer-wise barriers: one {d['by']} interpolated, the "
                        "rest at the anchor", x, style.BARRIER, "path", font_size)


def _plot(d: dict, look: Style):
    return layerwise_bars(d, font_size=look.font_size)


def _rows(d: dict) -> list[dict]:
    rows = []
    for i, g in enumerate(d["groups"]):
        row = {"by": d["by"], "group": g, "barrier": d["barrier"][i], "rise": d["rise"][i],
               "cumulative": d["cumulative"][i], "cum_barrier": d["cum_barrier"][i]}
        if d.get("barrier_unmatched") is not None:
            row.update(barrier_unmatched=d["barrier_unmatched"][i],
                       rise_unmatched=d["rise_unmatched"][i],
                       cum_barrier_unmatched=d["cum_barrier_unmatched"][i])
        rows.append(row)
    return rows


SECTION = Section(
    "landscape", 40, "3. Which layers make the barrier",
    "Adilova et al. (2024): move one block (or one kind of module) from A to B' while the "
    "rest stays at A, and measure the barrier of that path alone. Beside it, the same "
    "without matching, and the cumulative path (block after block), whose last bar is the "
    "full straight line.",
    defaults={"points": 5}, doing=lambda v: "matching, then one group at a time")

LAYERWISE = register(Measurement(
    "layerwise", "Layer-wise barriers",
    "barrier when one block or module kind moves to the matched source, the rest at the anchor",
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows, at_size=_at_size,
    at_size_help="matched at size and each group's path evaluated with the anchor, "
                 "the matched source and the source held as stored, each point "
    "built block by block", section=SECTION, order=90))

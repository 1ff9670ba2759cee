"""Training trajectories on the loss surface (Li et al., NeurIPS 2018, Fig. 9): the
optimiser's path drawn on the plane of the top two principal directions of a series'
checkpoints, over the loss surface of that plane (docs/landscape.md, "trajectory").

- The offsets theta_i - theta_final of every checkpoint from the final one (A's final), over
  the model's floating parameters, flattened, in float64. An uncentred SVD of the offsets
  (rows) gives the two directions and each one's explained variance s_k^2 / sum s^2. Signs:
  the earliest checkpoint of A has a coordinate >= 0 on each axis (the path runs to the
  origin from the upper right), so a run's plane is the same whoever computes it.
- Each checkpoint's coordinates on the plane (least squares, so also right when `--norm
  filter` rescales the directions filter-wise and they are no longer orthonormal), its
  distance off the plane, its own loss and the surface's loss at its projection: where the
  two differ, the path leaves the plane (loss-landscape issues #1 and #18).
- The surface: a grid of the plane around the path, evaluated as the plane record evaluates
  its grid (rotviz.analysis.planes.plane_grid, Evaluator.evaluate_each).
- With a second series B: B's final checkpoint is matched onto A's final, and the one group
  element found moves every checkpoint of B (rotviz.match.lineage.move_state). The PCA is of
  both runs' checkpoints (offsets from A's final): once with B as it is (the unmatched
  plane), once with B moved (the matched plane); each plane draws both paths.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from rotviz.confine import ANYWHERE, Confined
from rotviz.errors import RotvizError
from rotviz.limits import BATCH_SIZE, GRID, MARGIN
from rotviz.measures.registry import Context, Inputs, Measurement, Section, register
from rotviz.measures.training import SERIES_HELP, Series, read_series, specs_of
from rotviz.params import Param
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import torch

    from rotviz.data.split import Split
    from rotviz.evaluation import Evaluator
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

MIN_CHECKPOINTS = 3
NORMS = ("none", "filter")

PARAMS = (
    Param("with", "", "a second series of the same architecture, drawn on the same plane "
          "unmatched and matched onto the first by --match (default none)", metavar="SERIES_B",
          label="Series B"),
    Param("grid", 21, f"surface points per axis (default 21, {GRID.text})", GRID,
          label="Surface grid (points per side)", widget=(5, 31, 1), essential=True),
    Param("margin", 0.25, "margin around the path, as a fraction of its span (default 0.25, "
          f"{MARGIN.text})", MARGIN, label="Margin (fraction of the span)"),
    Param("norm", "none", "the plane's directions as PCA gives them (none), or each rescaled "
          "filter-wise to the final weights' filter norms (filter, Li et al.; biases and gains "
          "then leave the plane) (default none)", choices=NORMS, label="Direction normalisation",
          essential=True),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)

AT_SIZE = ("it holds every checkpoint of both series in memory; run it on checkpoints that "
           "fit")


# ---- the inputs ---------------------------------------------------------------------------------


def series_of(ref: str, confined: Confined = ANYWHERE) -> Series:
    """Series `ref` (rotviz.measures.training.read_series), refused in one line when it
    holds fewer than three checkpoints (two points span no plane worth drawing)."""
    s = read_series(ref, confined)
    if len(s.steps) < MIN_CHECKPOINTS:
        raise RotvizError(f"series '{ref}' holds {len(s.steps)} checkpoint(s) (steps "
                          f"{', '.join(map(str, s.steps))}); a trajectory needs at least "
                          f"{MIN_CHECKPOINTS}: save more checkpoints")
    return s


@dataclass(frozen=True)
class Runs:
    """What `rotviz trajectory` draws: series A, B when given as a second reference (the
    app), the one matching (its label; "none") and whether a matching was asked for."""

    a: Series
    b: Series | None
    spec: str
    asked: bool
    confined: Confined = ANYWHERE

    @classmethod
    def read(cls, refs: Sequence[str], specs: Sequence[str] | None = None,
             confined: Confined = ANYWHERE) -> Runs:
        labels = [s for s in specs_of(specs or ("none",)) if s != "none"]
        if len(labels) > 1:
            raise RotvizError(f"trajectory moves B by one matching, got {', '.join(labels)}: "
                              "give one --match")
        b = series_of(refs[1], confined) if len(refs) > 1 and refs[1] else None
        return cls(series_of(refs[0], confined), b, labels[0] if labels else "none",
                   specs is not None and bool(labels), confined)

    def first_pair(self):
        final = self.a.steps[max(self.a.steps)]
        return final, final

    def second(self, with_ref: str) -> Series | None:
        """Series B: the second reference, or --with."""
        return self.b or (series_of(with_ref, self.confined) if with_ref else None)


def _check(runs: Runs, values: dict, named: set[str]) -> None:
    """Before any model loads: B given once, a matching only with B, B's checkpoints."""
    if "with" in named and not values["with"].strip():
        raise RotvizError("--with is empty: give series B (a folder of checkpoint-<step>/, "
                          "zoo:NAME or ORG/NAME), or drop --with")
    if runs.b is not None and values["with"]:
        raise RotvizError("series B is given twice (a second reference and --with): give it "
                          "once")
    if runs.asked and runs.b is None and not values["with"]:
        raise RotvizError(f"--match {runs.spec} needs --with SERIES_B (it moves B's "
                          "checkpoints onto A's final): add it, or drop --match")
    runs.second(values["with"])


# ---- the plane ----------------------------------------------------------------------------------


@dataclass
class Path:
    """One series' checkpoints on a plane."""

    steps: list[int]
    coordinates: list[list[float]]  # [x, y] of each checkpoint's projection
    off_plane: list[float]  # |offset - projection|
    projection_norm: list[float]  # |projection| (Euclidean, parameter units)
    offset_norm: list[float]  # |theta_i - theta_final(A)|
    loss: list[float]  # the checkpoint's own loss
    acc: list[float]
    surface_loss: list[float]  # the surface's loss at its projection
    surface_acc: list[float]


@dataclass
class PlaneOf:
    """One plane: its directions' explained variance, the surface and the paths on it."""

    name: str  # "A" (one series), "unmatched" or "matched"
    explained_variance: list[float]  # s_k^2 / sum s^2 of the top two directions
    direction_norms: list[float]  # |d1|, |d2| (1 unless --norm filter)
    xs: list[float]
    ys: list[float]
    surface: list[list[float]]  # surface[iy][ix] at (xs[ix], ys[iy])
    surface_acc: list[list[float]]
    paths: dict[str, Path]


@dataclass
class Trajectory:
    series_a: str
    series_b: str | None
    match: str
    norm: str
    grid: int
    margin: float
    planes: list[PlaneOf]
    data: str
    split: str
    n: int
    device: str
    seconds: float
    max_output_diff: float | None = None  # B's final moved, against B's final
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Run:
    """A series' checkpoints, as offsets from A's final, with their states and own losses."""

    name: str
    steps: list[int]
    offsets: torch.Tensor  # (checkpoints, P) float64
    own: list[tuple[float, float]]


def _loaded(series: Series, final: Loaded | None, confined: Confined) -> list[Loaded]:
    """Every checkpoint, checked to share the architecture of `final` (default its own last)."""
    from rotviz.sources.loading import load_model
    from rotviz.sources.pairs import check_compatible

    models = [load_model(p, confined=confined) for p in series.steps.values()]
    ref = final or models[-1]
    for step, m in zip(series.steps, models, strict=True):
        try:
            check_compatible(ref, m)
        except RotvizError as e:
            raise RotvizError(f"checkpoint at step {step} of '{series.ref}' is another "
                              f"architecture than '{ref.ref}': {e}") from None
    return models


def names_of(final: Loaded) -> list[str]:
    """The floating parameters the PCA moves (tied weights: their owner only)."""
    return [n for n, p in final.model.named_parameters() if p.is_floating_point()]


def flat_offset(state, final, names: Sequence[str]):
    """theta - theta_final over `names`, flattened, float64, on the CPU."""
    import torch

    return torch.cat([(state[n].detach().cpu().double() - final[n].detach().cpu().double())
                      .reshape(-1) for n in names])


def _run_of(name: str, steps, states, final: Loaded, names, ev: Evaluator) -> Run:
    import torch

    offsets = torch.stack([flat_offset(s, final.state, names) for s in states])
    own = ev.evaluate_each(lambda s: ev.params({**final.state, **s}), states)  # side by side
    return Run(name, list(steps), offsets, own)


def directions_of(offsets, final, names: Sequence[str], norm: str = "none",
                  sign_row: int = 0):
    """The top two right singular vectors of `offsets` (rows), signed so that row
    `sign_row` has coordinates >= 0, filter-normalised with `norm` filter; and the explained
    variance of each. One line when the offsets span less than a plane."""
    import torch

    from rotviz.analysis.directions import normalise

    _, s, vh = torch.linalg.svd(offsets, full_matrices=False)
    total = float((s ** 2).sum())
    if len(s) < 2 or total == 0.0 or float(s[1]) <= 1e-12 * float(s[0]):
        raise RotvizError("the checkpoints' offsets from the final one span less than a plane "
                          "(the checkpoints are equal or on one line): draw a series that moves")
    d = vh[:2].clone()
    d *= torch.where(d @ offsets[sign_row] < 0, -1.0, 1.0)[:, None]
    if norm == "filter":
        rows, at = [], 0
        for n in names:
            w = final[n].detach().cpu().double()
            k = w.numel()
            rows.append(torch.stack([normalise(d[i, at:at + k].reshape(w.shape), w, "filter")
                                     .reshape(-1) for i in range(2)]))
            at += k
        d = torch.cat(rows, dim=1)
    return d, [float(v) ** 2 / total for v in s[:2]]


def project(offsets, d):
    """Least-squares coordinates of each row on the plane of `d`'s rows, the projections
    and what is left off the plane."""
    import torch

    coords = torch.linalg.solve(d @ d.T, d @ offsets.T).T
    proj = coords @ d
    return coords, proj, offsets - proj


def node_state(final, d, names: Sequence[str], x: float, y: float) -> dict:
    """theta_final + x d1 + y d2 over `names` (in float64, then each tensor's dtype); the
    final's other tensors as they are."""
    out, at = dict(final), 0
    for n in names:
        w = final[n]
        k = w.numel()
        moved = w.detach().cpu().double().reshape(-1) + x * d[0, at:at + k] + y * d[1, at:at + k]
        out[n] = moved.reshape(w.shape).to(w.dtype)
        at += k
    return out


def _plane(name: str, runs: list[Run], final: Loaded, names, norm: str, grid: int,
           margin: float, ev: Evaluator, progress: Progress | None) -> PlaneOf:
    import numpy as np
    import torch

    from rotviz.analysis.planes import grid_axis, plane_grid

    x_all = torch.cat([r.offsets for r in runs])
    d, explained = directions_of(x_all, final.state, names, norm)
    found = {r.name: project(r.offsets, d) for r in runs}
    pts = {f"{r.name}:{i}": (float(c[0]), float(c[1]))
           for r in runs for i, c in enumerate(found[r.name][0])}
    xy = np.array(list(pts.values()))
    lo, hi = xy.min(axis=0), xy.max(axis=0)
    span = float(max(hi - lo))
    xs = grid_axis(lo[0] - margin * span, hi[0] + margin * span, grid)
    ys = grid_axis(lo[1] - margin * span, hi[1] + margin * span, grid)

    def node(p: tuple[float, float]):
        return ev.params(node_state(final.state, d, names, *p))

    loss, acc, _, _ = plane_grid(
        lambda x, y: ev.evaluate(node((x, y))), lambda k: (0.0, 0.0), {}, xs, ys, progress,
        each=lambda nodes, done: ev.evaluate_each(node, nodes, done))
    # the surface under each checkpoint, exactly (not interpolated), side by side too
    under = dict(zip(pts, ev.evaluate_each(node, list(pts.values())), strict=True))
    p_loss, p_acc = ({k: v[j] for k, v in under.items()} for j in (0, 1))
    paths = {}
    for r in runs:
        coords, proj, rest = found[r.name]
        keys = [f"{r.name}:{i}" for i in range(len(r.steps))]
        paths[r.name] = Path(
            r.steps, coords.tolist(), torch.linalg.vector_norm(rest, dim=1).tolist(),
            torch.linalg.vector_norm(proj, dim=1).tolist(),
            torch.linalg.vector_norm(r.offsets, dim=1).tolist(), [o[0] for o in r.own],
            [o[1] for o in r.own], [p_loss[k] for k in keys], [p_acc[k] for k in keys])
    return PlaneOf(name, explained, torch.linalg.vector_norm(d, dim=1).tolist(), xs.tolist(),
                   ys.tolist(), loss.tolist(), acc.tolist(), paths)


def trajectory(runs: Runs, split: Split, grid: int = 21, margin: float = 0.25,
               norm: str = "none", device: str | torch.device = "cpu", batch_size: int = 512,
               with_ref: str = "", progress: Progress | None = None,
               cancel: Callable[[], bool] | None = None,
               time_limit: float | None = None) -> Trajectory:
    """trajectory(Runs.read(["zoo:vit-digits-run-a"]), split) -> Trajectory

    Series A's path on the plane of the top two principal directions of its checkpoints'
    offsets from its final one, over that plane's loss surface (module docstring); with
    series B (`runs.b` or `with_ref`), both on the plane of both runs' offsets, B unmatched
    and, with a matching, B moved by the element that matches its final onto A's
    (`time_limit`: seconds that matching's alternation may take)."""
    from rotviz.evaluation import Evaluator
    from rotviz.match.endpoints import as_options
    from rotviz.match.lineage import element_of_matched, move_state
    from rotviz.match.options import with_time_limit
    from rotviz.match.pipeline import match_models

    GRID.check(grid)
    MARGIN.check(margin)
    if norm not in NORMS:
        raise RotvizError(f"unknown --norm '{norm}': use one of {', '.join(NORMS)}")
    t0 = time.perf_counter()
    b_series = runs.second(with_ref)
    a_models = _loaded(runs.a, None, runs.confined)
    final = a_models[-1]
    names = names_of(final)
    ev = Evaluator(final, split, device, batch_size)
    a = _run_of("A", runs.a.steps, [m.state for m in a_models], final, names, ev)
    out = Trajectory(runs.a.ref, None, "none", norm, grid, float(margin), [], split.data,
                     split.split, split.n, str(ev.device), 0.0)
    if b_series is None:
        out.planes.append(_plane("A", [a], final, names, norm, grid, margin, ev, progress))
    else:
        b_models = _loaded(b_series, final, runs.confined)
        out.series_b, out.match = b_series.ref, runs.spec
        b = _run_of("B", b_series.steps, [m.state for m in b_models], final, names, ev)
        out.planes.append(_plane("unmatched", [a, b], final, names, norm, grid, margin, ev,
                                 progress))
        if runs.spec != "none" and not (cancel and cancel()):
            matched = match_models(final, b_models[-1],
                                   with_time_limit(as_options(runs.spec), time_limit),
                                   ev.device, data=split)
            if not matched.preserved:
                raise RotvizError(f"matching [{runs.spec}]: {matched.failure}; please report "
                                  "this as a bug")
            element = element_of_matched(matched)
            out.max_output_diff = matched.report.max_output_diff
            moved = [move_state(element, m) for m in b_models]
            bm = _run_of("B", b_series.steps, moved, final, names, ev)
            out.planes.append(_plane("matched", [a, bm], final, names, norm, grid, margin, ev,
                                     progress))
    out.seconds = time.perf_counter() - t0
    return out


def _run(runs: Runs, ctx: Context, v: dict) -> Trajectory:
    return trajectory(runs, ctx.split, v["grid"], v["margin"], v["norm"], ctx.device,
                      v["batch_size"], v["with"], ctx.progress, ctx.cancel, ctx.time_limit)


def _summary(r: Trajectory, how: str) -> str:
    parts = []
    for p in r.planes:
        off = max(max(q.off_plane) for q in p.paths.values())
        gap = max(abs(a - b) for q in p.paths.values()
                  for a, b in zip(q.loss, q.surface_loss, strict=True))
        parts.append(f"{p.name} plane: PC1 {100 * p.explained_variance[0]:.1f}%, PC2 "
                     f"{100 * p.explained_variance[1]:.1f}%, off the plane up to {off:.3f}, "
                     f"own loss vs surface up to {gap:.3f}")
    with_b = f" with '{r.series_b}' [{r.match}]" if r.series_b else ""
    return (f"trajectory of '{r.series_a}'{with_b} on {r.device}{how}: " + "; ".join(parts)
            + f"; {r.grid}x{r.grid} surface on {r.n} {r.split} samples in {r.seconds:.2f} s")


def rows(d: dict) -> list[dict]:
    """One row per plane, series and checkpoint."""
    return [{"plane": p["name"], "series": s, "step": step, "x": q["coordinates"][i][0],
             "y": q["coordinates"][i][1], "off_plane": q["off_plane"][i], "loss": q["loss"][i],
             "surface_loss": q["surface_loss"][i], "acc": q["acc"][i]}
            for p in d["planes"] for s, q in p["paths"].items()
            for i, step in enumerate(q["steps"])]


def trajectory_figure(d: dict, style: Style | None = None):
    """The surface of each plane (contours, one colour scale) with the paths on it: A and B
    in palette colours, B dashed on the unmatched plane, each checkpoint labelled by step."""
    import numpy as np
    from plotly.subplots import make_subplots

    from rotviz.plots import style as st

    look = style or Style()
    planes = d["planes"]
    z_all = np.concatenate([np.asarray(p["surface"], float).ravel() for p in planes])
    lo, hi = float(np.nanmin(z_all)), float(np.nanpercentile(z_all, 95))
    if look.colour_range is not None:
        lo, hi = map(float, look.colour_range)
    fig = make_subplots(1, len(planes), horizontal_spacing=0.12, subplot_titles=[
        {"A": "", "unmatched": "B as it is (unmatched)",
         "matched": f"B matched ({st.nice_label(d['match'])})"}[p["name"]] for p in planes])
    for j, p in enumerate(planes):
        fig.add_contour(
            x=p["xs"], y=p["ys"], z=p["surface"], colorscale=st.SEQUENTIAL, zmin=lo, zmax=hi,
            showscale=j == 0, colorbar={"title": {"text": "test loss (nats)", "side": "right"}},
            contours={"coloring": "heatmap", "showlabels": True}, name="test loss",
            hovertemplate="(%{x:.2f}, %{y:.2f}): loss %{z:.3f}<extra></extra>", row=1, col=j + 1)
        for i, (s, q) in enumerate(p["paths"].items()):
            name = f"{s}: {d['series_a'] if s == 'A' else d['series_b']}"
            dashed = s == "B" and p["name"] == "unmatched"
            xy = np.asarray(q["coordinates"])
            fig.add_scatter(
                x=xy[:, 0].tolist(), y=xy[:, 1].tolist(), mode="lines+markers+text",
                text=[str(t) for t in q["steps"]], textposition="top center",
                name=name + (" (unmatched)" if dashed else " (matched)"
                             if s == "B" and p["name"] == "matched" else ""),
                legendgroup=f"{s}{dashed}",
                showlegend=j == 0 or dashed or p["name"] == "matched" and s == "B",
                line={"color": st.color(i), "dash": "dash" if dashed else "solid", "width": 2.5},
                marker={"symbol": st.marker(i), "size": 9, "color": st.color(i),
                        "line": {"color": "white", "width": 1}},
                textfont={"color": "white", "size": look.font_size - 2},
                customdata=np.stack([q["loss"], q["surface_loss"], q["off_plane"]], axis=1)
                .tolist(),
                hovertemplate=(f"{s} step %{{text}}: own loss %{{customdata[0]:.3f}}, surface "
                               "%{customdata[1]:.3f}, off the plane %{customdata[2]:.3f}"
                               f"<extra>{name}</extra>"), row=1, col=j + 1)
        ev = p["explained_variance"]
        fig.update_xaxes(title_text=f"PC1 ({100 * ev[0]:.1f}% of variance)", row=1, col=j + 1)
        fig.update_yaxes(title_text=f"PC2 ({100 * ev[1]:.1f}% of variance)", row=1, col=j + 1)
    norm = " (filter-normalised)" if d["norm"] == "filter" else ""
    fig = st.finish(fig, f"Training trajectories on the loss surface{norm} "
                    f"({st.evaluated_on(d)})",
                    fig.layout.xaxis.title.text, fig.layout.yaxis.title.text, "series",
                    look.font_size, height=560)
    if len(planes) > 1:
        fig.update_layout(width=1100)
    fig.update_layout(legend={"orientation": "h", "y": -0.2, "x": 0})
    return fig


def _caption(d: dict) -> str:
    parts = []
    for p in d["planes"]:
        off = max(max(q["off_plane"]) for q in p["paths"].values())
        gap = max(abs(a - b) for q in p["paths"].values()
                  for a, b in zip(q["loss"], q["surface_loss"], strict=True))
        parts.append(f"{p['name']}: the two directions explain "
                     f"{100 * sum(p['explained_variance']):.1f}% of the offsets; checkpoints "
                     f"lie up to {off:.2f} off the plane, where their own loss differs from "
                     f"the surface under them by up to {gap:.3f} nats")
    return "; ".join(parts) + "."


SECTION = Section(
    "training", 40, "4. Training trajectories on the loss surface",
    "Li et al. (2018), Fig. 9: the checkpoints' offsets from the final one, their top two "
    "principal directions, and the test loss on that plane with the path drawn on it. A "
    "checkpoint off the plane has its own loss, not the surface's under it: hover a point "
    "for both. With series B, its checkpoints are moved by the one group element that "
    "matches B's final onto A's (the page's matching), and both runs are drawn on the plane "
    "of both: unmatched (dashed) and matched.",
    defaults={"grid": 11}, hidden=("with",), caption=_caption,
    doing=lambda v: f"{v['grid']} x {v['grid']} surface per plane")

TRAJECTORY = register(Measurement(
    "trajectory", "Training trajectory",
    "a series' path on the loss surface of its checkpoints' top two principal directions "
    "(with a second series: unmatched and matched)",
    _run, PARAMS, summary=_summary, plot=trajectory_figure, rows=rows, refusal=AT_SIZE,
    inputs=Inputs((("series_a", "the " + SERIES_HELP + "; at least three checkpoints"),),
                  Runs.read, default_specs=("none",), one_spec=True, check=_check),
    progress=True, section=SECTION, order=145))

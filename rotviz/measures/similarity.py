"""similarity: how alike the anchor's and the source's representations are, layer against
layer, before and after matching (CKA, Kornblith et al. 2019; the layer x layer heat map of
Nguyen, Raghu and Kornblith 2021; the shape metrics of Williams et al. 2021): the record, its
computation (`similarity_on`) and its figure.

Matching moves the source inside its symmetry class. A matching that keeps the residual
stream (seed, ffn, attn) leaves every hidden state as it was; one that maps the stream
(a residual permutation or rotation) moves each hidden state by that orthogonal map, which
linear CKA and the Procrustes distance do not see. So the matrix of A against B' equals that
of A against B while the parameter distance falls: the weights move, the function does not.

The ladder in function space: for each layer on the diagonal, the distance between the two
models' representations modulo permutations, modulo rotations and modulo invertible linear
maps (rotviz.analysis.shape_metrics.LADDER), the counterpart of the weight-space ladder.
The maths: rotviz.analysis.shape_metrics; the hidden states: rotviz.analysis.representations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rotviz.analysis.representations import TOKENS
from rotviz.analysis.shape_metrics import LADDER, METRICS, SIGMA, SIMILARITIES
from rotviz.limits import BATCH_SIZE, Bound
from rotviz.measures.barrier import match_label
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    import plotly.graph_objects as go
    import torch

    from rotviz.data.split import Split
    from rotviz.types import Progress

METRIC_HELP = {
    "cka": "linear CKA, biased HSIC (1 = alike up to rotation and scale)",
    "cka-unbiased": "linear CKA, unbiased HSIC (Nguyen et al. 2021)",
    "cka-rbf": "CKA of RBF kernels, bandwidth --sigma x the median distance",
    "procrustes": "angular Procrustes shape distance, radians (0 = alike up to rotation)",
    "permutation": "angular shape distance modulo permutations, radians",
}
PARAMS = (
    Param("metric", "cka", "how two layers' representations are compared: "
          + "; ".join(f"{k}: {v}" for k, v in METRIC_HELP.items()), choices=tuple(METRICS),
          essential=True),
    Param("tokens", "mean", "each example as one row: mean (its non-padding tokens averaged), "
          "cls (its first token: models with a class token or pooler only), or all (every "
          "non-padding token a row)", choices=TOKENS, essential=True),
    Param("sigma", SIGMA, "cka-rbf: the kernel's bandwidth as a fraction of the median "
          "distance between examples (default 0.5)", Bound("--sigma", 0.01, 100.0, integer=False),
          needs=("metric", ("cka-rbf",))),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text}); the "
          "result does not depend on it", BATCH_SIZE),
)


class Similarity(dict):
    """The result: a dict (the JSON as written)."""

    def to_dict(self) -> dict:
        return dict(self)


def layer_names(n: int) -> list[str]:
    """The L + 1 representations: the embeddings' output, then each block's output."""
    return ["embeddings"] + [f"block {k}" for k in range(n - 1)]


def matrix(metric: str, xs: list, ys: list, sigma: float = SIGMA) -> list[list[float]]:
    """metric(xs[i], ys[j]) for every pair of layers (rows: xs). Linear CKA is computed from
    each layer's centred, normalised Gram (n <= width) or covariance once, not per pair."""
    from rotviz.analysis.shape_metrics import compare, linear_cka

    if metric != "cka":
        return [[compare(metric, x, y, sigma) for y in ys] for x in xs]
    import torch

    from rotviz.analysis.shape_metrics import centred

    xs, ys = [centred(x) for x in xs], [centred(y) for y in ys]
    n = xs[0].shape[0]
    if all(t.shape[1] >= n for t in xs + ys):  # Gram matrices: n x n each
        gx = [x @ x.T for x in xs]
        gy = [y @ y.T for y in ys]
        gx = [g / g.norm() if g.norm() > 0 else g for g in gx]
        gy = [g / g.norm() if g.norm() > 0 else g for g in gy]
        return [[float(torch.sum(a * b)) for b in gy] for a in gx]
    return [[linear_cka(x, y) for y in ys] for x in xs]


def ladder(xs: list, ys: list) -> list[dict]:
    """For each diagonal pair (layer k of both), the distance modulo each group."""
    names = layer_names(len(xs))
    return [{"layer": names[k], **{g: f(xs[k], ys[k]) for g, f in LADDER}}
            for k in range(min(len(xs), len(ys)))]


def similarity_on(ends, split: Split, metric: str = "cka", tokens: str = "mean",
                  sigma: float = SIGMA, device: str | torch.device = "cpu",
                  progress: Progress | None = None, batch_size: int = 512) -> Similarity:
    """similarity_on(endpoints, split, metric="cka", tokens="mean") -> Similarity

    `metric` between every layer of the anchor (rows) and of the source (columns), on the
    whole split; with a matching, also against the matched source, and the ladder of shape
    distances on the diagonal."""
    import time

    from rotviz.analysis.representations import check_tokens, hidden_states
    from rotviz.errors import RotvizError
    from rotviz.evaluation import Evaluator

    if metric not in METRICS:
        raise RotvizError(f"unknown --metric '{metric}': use one of {', '.join(METRICS)}")
    check_tokens(ends.anchor.spec, tokens)
    check_tokens(ends.source.spec, tokens)
    t0 = time.perf_counter()
    matched = ends.match != "none"
    total = 3 if matched else 2

    def tick(k: int, what: str) -> None:
        if progress:
            progress(k, total + 1, what)

    ev_a = Evaluator(ends.anchor, split, device, batch_size)
    ev_b = Evaluator(ends.source, split, device, batch_size)
    tick(0, "hidden states of the anchor")
    xa = hidden_states(ev_a, ev_a.params(ends.anchor.state), tokens)
    tick(1, "hidden states of the source")
    xb = hidden_states(ev_b, ev_b.params(ends.source.state), tokens)
    out = Similarity(
        metric=metric, tokens=tokens, n=int(xa[0].shape[0]), n_examples=split.n,
        layers_anchor=layer_names(len(xa)), layers_source=layer_names(len(xb)),
        match=match_label(ends.match, ends.layers), anchor=ends.anchor_ref,
        source=ends.source_ref, data=split.data, split=split.split, device=str(ev_a.device))
    if metric == "cka-rbf":
        out["sigma"] = sigma
    tick(total - 1 if matched else total, "comparing layers")
    out["matrix"] = matrix(metric, xa, xb, sigma)
    out["ladder"] = ladder(xa, xb)
    if matched:
        tick(2, "hidden states of the matched source")
        xm = hidden_states(ev_b, ev_b.params(ends.matched), tokens)
        _matched_part(out, metric, xa, xm, sigma, ends.info)
    out["seconds"] = time.perf_counter() - t0
    tick(total + 1, "done")
    return out


def sized_similarity(ends, split: Split, metric: str = "cka", tokens: str = "mean",
                     sigma: float = SIGMA, device: str | torch.device = "cpu",
                     progress: Progress | None = None, batch_size: int = 512) -> Similarity:
    """`similarity_on` on streamed endpoints (rotviz.atsize.endpoints: checkpoint folders):
    each model's hidden states gathered with one block in memory at a time."""
    import time

    from rotviz.analysis.representations import check_tokens, sized_hidden_states
    from rotviz.errors import RotvizError
    from rotviz.match.endpoints import MatchInfo

    if metric not in METRICS:
        raise RotvizError(f"unknown --metric '{metric}': use one of {', '.join(METRICS)}")
    check_tokens(ends.anchor.spec, tokens)
    t0 = time.perf_counter()
    info: MatchInfo = ends.info or MatchInfo("none", 0.0, 0.0, None, 0.0)
    matched = info.match != "none" and ends.matched_path != ends.source_path
    paths = [ends.anchor_path, ends.source_path] + ([ends.matched_path] if matched else [])
    reps = []
    for k, path in enumerate(paths):
        if progress:
            progress(k, len(paths) + 1, "hidden states, block by block")
        reps.append(sized_hidden_states(path, split, tokens, device, batch_size))
    xa, xb = reps[0], reps[1]
    out = Similarity(
        metric=metric, tokens=tokens, n=int(xa[0].shape[0]), n_examples=split.n,
        layers_anchor=layer_names(len(xa)), layers_source=layer_names(len(xb)),
        match=match_label(info.match, ends.layers), anchor=ends.anchor_ref,
        source=ends.source_ref, data=split.data, split=split.split, device=str(device))
    if metric == "cka-rbf":
        out["sigma"] = sigma
    out["matrix"] = matrix(metric, xa, xb, sigma)
    out["ladder"] = ladder(xa, xb)
    if matched:
        _matched_part(out, metric, xa, reps[2], sigma, info)
    out["seconds"] = time.perf_counter() - t0
    return out


def _matched_part(out: Similarity, metric: str, xa: list, xm: list, sigma: float,
                  info) -> None:
    """What a matching adds: A against B', the change, the parameter distances."""
    out["matrix_matched"] = matrix(metric, xa, xm, sigma)
    out["ladder_matched"] = ladder(xa, xm)
    out["max_change"] = max(abs(p - q) for r, s in zip(out["matrix"], out["matrix_matched"],
                                                       strict=True)
                            for p, q in zip(r, s, strict=True))
    out.update(distance_before=info.distance_before, distance_after=info.distance_after,
               max_output_diff=info.max_output_diff)
    if info.before.get("per_layer"):
        out["distance_per_layer_before"] = dict(info.before["per_layer"])
        out["distance_per_layer_after"] = dict(info.after.get("per_layer") or {})


def _at_size(ends, ctx: Context, v: dict) -> Similarity:
    return sized_similarity(ends, ctx.split, v["metric"], v["tokens"], v["sigma"], ctx.device,
                            ctx.progress, v["batch_size"])


def _run(ends, ctx: Context, v: dict) -> Similarity:
    return similarity_on(ends, ctx.split, v["metric"], v["tokens"], v["sigma"], ctx.device,
                         ctx.progress, v["batch_size"])


def _diagonal(m: list[list[float]]) -> list[float]:
    return [m[k][k] for k in range(min(len(m), len(m[0]) if m else 0))]


def _summary(d, how: str) -> str:
    diag = _diagonal(d["matrix"])
    text = (f"similarity {d['metric']} ({d['tokens']} tokens) [{d['match']}]{how}: "
            f"{len(d['layers_anchor'])} x {len(d['layers_source'])} layers on {d['n']} rows; "
            f"diagonal {min(diag):.4f} to {max(diag):.4f}")
    if "matrix_matched" in d:
        text += (f"; after matching the largest change is {d['max_change']:.2e} while the "
                 f"parameter distance went {d['distance_before']:.4f} -> "
                 f"{d['distance_after']:.4f}")
    return text


def _rows(d: dict) -> list[dict]:
    rows = []
    for i, a in enumerate(d["layers_anchor"]):
        for j, b in enumerate(d["layers_source"]):
            row = {"anchor_layer": a, "source_layer": b, "value": d["matrix"][i][j]}
            if "matrix_matched" in d:
                row["value_matched"] = d["matrix_matched"][i][j]
            rows.append(row)
    return rows


def _scale(d: dict) -> tuple[float, float, str]:
    """One colour range for both heat maps, and its title."""
    import math

    if d["metric"] in SIMILARITIES:
        return 0.0, 1.0, f"{d['metric']} (1 = alike)"
    return 0.0, math.pi / 2, f"{d['metric']} distance (radians)"


def similarity_figure(d: dict, font_size: int = 14) -> go.Figure:
    """Top: heat maps of A vs B and A vs B' on one colour scale (its bar beside them).
    Bottom: the per-layer parameter distance before and after matching, and the ladder of
    shape distances on the diagonal (their legend beside them). A panel the result lacks
    (no matching, no per-layer distances) leaves its neighbour the whole row."""
    from plotly.subplots import make_subplots

    from rotviz.plots import style

    maps = [("A vs B (source as trained)", d["matrix"])]
    if "matrix_matched" in d:
        maps.append((f"A vs B' (matched: {d['match']})", d["matrix_matched"]))
    distances = bool(d.get("distance_per_layer_before"))
    top = [{}, {}] if len(maps) == 2 else [{"colspan": 2}, None]
    bottom = [{}, {}] if distances else [{"colspan": 2}, None]
    titles = [t for t, _ in maps] + (["parameter distance per layer"] if distances else []) \
        + ["function-space ladder (diagonal layer pairs)"]
    fig = make_subplots(rows=2, cols=2, specs=[top, bottom], subplot_titles=titles,
                        horizontal_spacing=0.12, vertical_spacing=0.2)
    lo, hi, cbar = _scale(d)
    for col, (_, m) in enumerate(maps, start=1):
        fig.add_heatmap(z=m, x=d["layers_source"], y=d["layers_anchor"], coloraxis="coloraxis",
                        hovertemplate="A %{y}, B %{x}: %{z:.4f}<extra></extra>", row=1, col=col)
        fig.update_xaxes(title_text="source layer", row=1, col=col)
        fig.update_yaxes(title_text="anchor layer" if col == 1 else None, row=1, col=col)
    if distances:
        for i, key in enumerate(("before", "after")):
            per = d[f"distance_per_layer_{key}"]
            fig.add_bar(x=[str(k) for k in per], y=list(per.values()),
                        name=f"parameter distance, {key} matching",
                        marker_color=style.color(i * 3),
                        marker_pattern_shape="" if i == 0 else "/", row=2, col=1)
        fig.update_xaxes(title_text="block ('rest': embeddings, final norm, head)", row=2,
                         col=1)
        fig.update_yaxes(title_text=style.DISTANCE, row=2, col=1)
    col = 2 if distances else 1
    steps = d.get("ladder_matched") or d["ladder"]
    for i, (group, _) in enumerate(LADDER):
        fig.add_scatter(x=[s["layer"] for s in steps], y=[s[group] for s in steps],
                        mode="lines+markers", name=f"shape distance modulo {group}",
                        line={"color": style.color(i + 1), "dash": style.dash(i)},
                        marker={"symbol": style.marker(i)}, row=2, col=col)
    fig.update_xaxes(title_text="layer (both models)", row=2, col=col)
    fig.update_yaxes(title_text="shape distance (radians)", row=2, col=col)
    title = (f"Representations layer by layer ({d['metric']}, {d['tokens']} tokens, "
             f"{d['n']} rows): matching moves the weights, not the function")
    style.finish(fig, title, "source layer", "anchor layer", "bottom panels", font_size,
                 height=860)
    fig.update_layout(
        coloraxis={"colorscale": style.SEQUENTIAL, "cmin": lo, "cmax": hi,
                   "colorbar": {"title": {"text": cbar, "side": "right"}, "x": 1.02,
                                "y": 1.0, "yanchor": "top", "len": 0.42}},
        barmode="group", margin={"l": 90, "r": 40, "t": 90, "b": 70},
        legend={"x": 1.02, "y": 0.42, "yanchor": "top", "xanchor": "left"})
    return fig


def _plot(d: dict, look: Style):
    return similarity_figure(d, font_size=look.font_size)


def _caption(d: dict) -> str:
    if "matrix_matched" not in d:
        return (f"{d['metric']} between every pair of layers on {d['n']} rows; choose a "
                "matching to compare B' as well.")
    return (f"Matching changes the weights, not the representations: the parameter distance "
            f"fell from {d['distance_before']:.2f} to {d['distance_after']:.2f} while no "
            f"entry of the {d['metric']} matrix moved by more than {d['max_change']:.1e}.")


SECTION = Section(
    "function", 10, "1. Representations: what matching leaves alone",
    "Compare every layer of the anchor A with every layer of the source B by their hidden "
    "states on the same examples (CKA, Kornblith et al. 2019), before and after matching. "
    "The weights move a long way; the heat maps do not change. On the right, the distance "
    "between the representations of each layer modulo permutations, rotations and linear "
    "maps: the symmetry ladder in function space.",
    caption=_caption, doing=lambda v: f"hidden states, then {v['metric']} per layer pair")

SIMILARITY = register(Measurement(
    "similarity", "Representation similarity",
    "CKA or shape distance between every layer of the anchor and the source, before and "
    "after matching", _run, PARAMS, summary=_summary, plot=_plot, rows=_rows,
    at_size=_at_size, at_size_help="each model's hidden states gathered block by block (one "
    "block's weights in memory at a time), then compared in memory",
    at_size_how=" (at size: hidden states gathered block by block)",
    section=SECTION, order=95))

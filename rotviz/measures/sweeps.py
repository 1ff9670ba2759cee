"""Layer sweeps (the seed paper's Figure 6): match one layer at a time, and the last k layers
for k = 1..L, with the pair's matching; for each, the distance, the barrier on a short path
and the loss and accuracy of the simple average (alpha = 0.5)."""

from __future__ import annotations

from rotviz.limits import BATCH_SIZE, POINTS
from rotviz.measures.registry import Context, Measurement, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style

PARAMS = (
    Param("points", 11, f"points on each path (default 11, {POINTS.text})", POINTS,
          label="Points on each path", widget=(3, 21, 2)),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.ablations import layer_sweeps

    return layer_sweeps(ends.anchor, ends.source, ctx.split, ends.match, v["points"],
                        ctx.device, ctx.progress, v["batch_size"])


def _summary(s, how: str) -> str:
    best = min(range(s.n_layers), key=lambda i: s.single[i].mid_loss)
    return (f"layer sweeps [{s.match}]{how}: merged loss {s.none.mid_loss:.4f} unmatched, "
            f"{s.all.mid_loss:.4f} all layers matched, {s.single[best].mid_loss:.4f} matching "
            f"only layer {best} (the best single layer); {s.seconds:.2f} s")


def _rows(d: dict) -> list[dict]:
    out = [{"matched": "none", **{k: d["none"][k] for k in ("distance", "barrier", "mid_loss",
                                                             "mid_acc")}},
           {"matched": "all", **{k: d["all"][k] for k in ("distance", "barrier", "mid_loss",
                                                           "mid_acc")}}]
    for kind in ("single", "tail"):
        for p in d[kind]:
            out.append({"matched": f"{kind} {','.join(map(str, p['layers']))}",
                        **{k: p[k] for k in ("distance", "barrier", "mid_loss", "mid_acc")}})
    return out


def _match_check(options) -> str | None:
    """Sweeps vary which layers are matched: with no matching every row is the unmatched
    pair, and its "best single layer" would mean nothing."""
    if options is None:
        return ("sweeps varies which layers are matched, and --match none matches none: "
                "give a matching, e.g. --match seed")
    return None


def _plot(d: dict, style: Style):
    from rotviz.plots.sweeps import layer_sweeps

    return layer_sweeps(d)


SWEEPS = register(Measurement(
    "sweeps", "Layer sweeps (which layers to match)",
    "the merge when one layer, or the last k layers, are matched (the seed paper's Figure 6)",
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows, match_check=_match_check,
    refusal="layer sweeps match the pair once per layer subset, in memory", order=70))

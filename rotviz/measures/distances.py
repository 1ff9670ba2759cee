"""Distances: how far the source is from the anchor before and after matching, in total,
per layer and per kind of weight (what matching minimises; docs/solvers.md)."""

from __future__ import annotations

from rotviz.measures.barrier import match_label
from rotviz.measures.registry import Context, Measurement, register
from rotviz.plots.figure_style import Style


class _Result(dict):
    def to_dict(self) -> dict:
        return dict(self)


def _run(ends, ctx: Context, v: dict) -> _Result:
    """What matching did, from the endpoints (held or streamed alike): nothing to compute."""
    i = ends.info
    return _Result(match=i.match, layers=ends.layers, anchor=ends.anchor_ref,
                   source=ends.source_ref, distance_before=i.distance_before,
                   distance_after=i.distance_after, max_output_diff=i.max_output_diff,
                   before=i.before, after=i.after, match_seconds=i.seconds)


def _summary(d, how: str) -> str:
    return (f"distances [{match_label(d['match'], d['layers'])}]{how}: {d['distance_before']:.4f}"
            f" -> {d['distance_after']:.4f} (Euclidean, parameter units); max output "
            f"difference {d['max_output_diff'] or 0.0:.2e}")


def _rows(d: dict) -> list[dict]:
    """The total first (by `total`, part `all`), then per layer and per kind."""
    out = [{"by": "total", "part": "all", "before": d["before"]["total"],
            "after": d["after"]["total"]}]
    for by in ("per_layer", "per_kind"):
        for k, before in d["before"].get(by, {}).items():
            out.append({"by": by.removeprefix("per_"), "part": k, "before": before,
                        "after": d["after"].get(by, {}).get(k)})
    return out


def _plot(d: dict, style: Style):
    from rotviz.plots.distances import distance_bars

    return distance_bars(d["before"]["per_layer"], d["after"]["per_layer"])


DISTANCES = register(Measurement(
    "distances", "Distances", "distance to the anchor before and after matching, per layer "
    "and per kind of weight", _run, summary=_summary, plot=_plot, rows=_rows, at_size=_run,
    data=False, narrower=True, order=50))

"""Spectra: per layer and head, the singular values of the Q-K and V-O cross matrices, the
angles of the rotations matching applied, and the invariant circuit spectra (W_Q^T W_K,
W_O W_V) of anchor, source and matched source, which matching must leave unchanged."""

from __future__ import annotations

from rotviz.measures.registry import Context, Measurement, register
from rotviz.plots.figure_style import Style


def _run(ends, ctx: Context, v: dict):
    from rotviz.analysis.spectra import spectra
    from rotviz.match.pipeline import view_of
    from rotviz.symmetry.view import read_view

    a, b = ends.anchor, ends.source
    mv = None if ends.match == "none" else read_view(b.spec, b.config, ends.matched)
    return spectra(view_of(a), view_of(b), mv, ends.layers)


def _summary(s, how: str) -> str:
    change = "" if s.max_circuit_change is None else \
        f"; largest circuit change after matching {s.max_circuit_change:.2e} (relative)"
    return (f"spectra{how}: {len(s.layers)} layers x {s.n_heads} heads of {s.d_head} "
            f"dimensions{change}")


def _rows(d: dict) -> list[dict]:
    return [{"layer": lay["layer"], "head": h, "qk_trace": lay["qk_trace"][h],
             "vo_trace": lay["vo_trace"][h], "qk_det": lay["qk_det"][h],
             "vo_det": lay["vo_det"][h]}
            for lay in d["layers"] for h in range(len(lay["qk_trace"]))]


def _plot(d: dict, style: Style):
    from rotviz.plots.spectra import angle_overview

    return angle_overview(d["layers"], "qk")


SPECTRA = register(Measurement(
    "spectra", "Spectra", "cross-matrix and invariant circuit spectra per layer and head",
    _run, summary=_summary, plot=_plot, rows=_rows, data=False, narrower=True,
    refusal="spectra read every layer's attention of three models in memory", order=60))

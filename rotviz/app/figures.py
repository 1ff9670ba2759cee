"""The app's figures beyond each record's own, each drawn in the page's `Style`.

A record draws its results (`Measurement.plot(result, style)`, and a section's `figures`
for the runs of one section, one per matching). A page also draws figures of its own: a
slice beside its gauge-fixed twin, the bend on the A/B/B' plane, the matching's views (the
Match and Spectra pages: distances, the alternation, the cross-matrix spectra) and the Learn
page's demo. They are here, so that the pages (rotviz/ui/) draw every figure through a
record or this module and never reach into rotviz.plots; with the words the figures and
tables share (a matching's label, a score's name and help). Plotly is imported inside each
function, as the records do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rotviz.plots.figure_style import Style


def preload() -> None:
    """Import what every figure imports (plotly and rotviz's look), ahead of the first page
    that draws one (rotviz/ui/boot.py's start-up thread)."""
    import rotviz.plots.style  # noqa: F401


# ---- words ---------------------------------------------------------------------------------


def nice_label(spec: str) -> str:
    """A matching SPEC in words, as the figures' legends say it."""
    from rotviz.plots.style import nice_label as words

    return words(spec)


def metric_label(key: str) -> str:
    """A score's short name (macro-F1)."""
    from rotviz.plots.style import metric_label as words

    return words(key)


def metric_help(key: str) -> str:
    """What a score measures, in one line."""
    from rotviz.plots.style import metric_help as words

    return words(key)



def distance_words() -> str:
    """What a distance between two models is, with its unit."""
    from rotviz.plots.style import DISTANCE

    return DISTANCE


def curve_name(kind: str) -> str:
    """A trained path's kind in words (a Bezier curve, a polygonal chain)."""
    from rotviz.measures.bend import KIND_NAMES

    return KIND_NAMES.get(kind, kind)


# ---- several results in one figure ----------------------------------------------------------




def bend_on_plane(plane: Mapping, bend: Mapping, style: Style) -> Any:
    """The A/B/B' plane with the trained curve's projection and its bend drawn on it."""
    from rotviz.measures.bend import bend_on_plane as overlay
    from rotviz.measures.plane import plane_figure as loss_plane

    fig = loss_plane(plane["xs"], plane["ys"], plane["loss"], plane["points"], style.font_size)
    return overlay(fig, bend)


def slice_panels(slices: Sequence[Mapping], titles: Sequence[str], title: str,
                 style: Style) -> Any:
    """Several 2D slices side by side on one colour scale (a plane and its gauge-fixed twin)."""
    from rotviz.plots.surface import slice_panels as draw

    return draw(slices, titles, log=style.log, font_size=style.font_size, title=title)




# ---- the matching's own views (Match, Spectra) ----------------------------------------------


def distance_bars(before: Mapping, after: Mapping, by: str, style: Style) -> Any:
    from rotviz.measures.distances import distance_bars as draw

    return draw(before, after, by, style.font_size)


def ablation_bars(rows: Sequence[Mapping], style: Style) -> Any:
    from rotviz.measures.distances import ablation_bars as draw

    return draw(rows, style.font_size)


def objective_history(rows: Sequence[Mapping], style: Style) -> Any:
    from rotviz.plots.matching import objective_history as draw

    return draw(rows, style.font_size)


def round_history(rows: Sequence[Mapping], style: Style) -> Any:
    from rotviz.plots.matching import round_history as draw

    return draw(rows, style.font_size)


def angle_spectrum(series: Mapping[str, Sequence[float]], style: Style,
                   title: str | None = None) -> Any:
    from rotviz.plots.matching import angle_spectrum as draw

    return draw(series, style.font_size) if title is None else draw(series, style.font_size,
                                                                      title)


def ffn_correlation(before: Sequence[float], after: Sequence[float],
                    layers: Sequence[int] | None, style: Style) -> Any:
    from rotviz.plots.matching import ffn_correlation as draw

    return draw(before, after, layers, style.font_size)


def learn_history(rows: Sequence[Mapping], best_step: int | None, style: Style) -> Any:
    from rotviz.plots.matching import learn_history as draw

    return draw(rows, best_step, style.font_size)


def singular_values(layer: Mapping, style: Style) -> Any:
    from rotviz.measures.spectra import singular_values as draw

    return draw(layer, style.font_size)


def rotation_angles(layer: Mapping, style: Style) -> Any:
    from rotviz.measures.spectra import rotation_angles as draw

    return draw(layer, style.font_size)


def angle_overview(layers: Sequence[Mapping], kind: str, style: Style) -> Any:
    from rotviz.measures.spectra import angle_overview as draw

    return draw(layers, kind, style.font_size)


def circuit_spectra(series: Mapping[str, Sequence[float]], title: str, style: Style) -> Any:
    from rotviz.measures.spectra import circuit_spectra as draw

    return draw(series, title, style.font_size)


# ---- the Learn page's demo ------------------------------------------------------------------


def weight_heatmaps(mats: Mapping[str, Any], title: str, style: Style) -> Any:
    from rotviz.plots.learn import weight_heatmaps as draw

    return draw(mats, title, style.font_size)


def stage_distances(stages: Sequence[tuple[str, float]], style: Style,
                    title: str | None = None) -> Any:
    from rotviz.plots.learn import stage_distances as draw

    return draw(stages, style.font_size) if title is None else draw(stages, style.font_size,
                                                                      title)


def logit_scatter(original: Any, transformed: Any, style: Style, what: str) -> Any:
    from rotviz.plots.learn import logit_scatter as draw

    return draw(original, transformed, style.font_size, what)

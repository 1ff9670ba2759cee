"""How the host wants a record's figure drawn: the one argument `Measurement.plot` takes
besides the result.

A page compares figures side by side (one accuracy range for all its panels, one colour
scale for its planes), a teacher enlarges the fonts for a projector, a researcher asks for
a log axis: the host says so here, and every record's figure reads it. Kept free of plotly
so that listing the records stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Style:
    """What the page asks of a figure. The defaults draw it as the CLI's --figure does."""

    font_size: int = 14
    log: bool = False  # a log scale on the axis the record says can take one
    fixed_accuracy: bool = False  # accuracy on the whole 0-1 scale, not the data's span
    # one accuracy range shared by the page's panels ((lo, hi)); None: the figure's own
    accuracy_range: tuple[float, float] | None = None
    # one colour range shared by the page's heat maps and contours; None: the figure's own
    colour_range: tuple[float, float] | None = None

    def accuracy_axis(self) -> list[float] | None:
        """The range an accuracy axis gets: the one the page's panels share, the whole 0-1
        scale (`fixed_accuracy`), or None: the figure follows its own data
        (rotviz.plots.style.acc_range)."""
        if self.accuracy_range is not None:
            return list(self.accuracy_range)
        if self.fixed_accuracy:
            from rotviz.plots.style import ACC_FIXED

            return list(ACC_FIXED)
        return None

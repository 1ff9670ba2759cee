"""Moving a source's lineage: its fine-tunes moved by the element that matched the source.

Two fine-tunes of two independently trained bases sit in two basins that symmetry separates.
Matching the bases finds the group element that moves one base next to the other; applying
that element, unchanged, to the moved base's fine-tunes brings them next to the other base's
fine-tunes without matching them again (the lineage experiment, docs/symmetries.md). Every
moved model is checked like a matched one: same logits on probe inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rotviz.errors import RotvizError
from rotviz.match.pipeline import (
    Matched,
    check_failure,
    record_stored_check,
    view_of,
)
from rotviz.sources.loading import HALF, Loaded, check_finite
from rotviz.sources.pairs import check_compatible
from rotviz.sources.running import max_output_diff, stored_output_diff
from rotviz.symmetry.element import Element, apply_element
from rotviz.symmetry.view import write_state

Tensor = torch.Tensor


@dataclass
class Moved:
    """A model moved by a matching's element: its new state and its function check (the
    same numbers a MatchReport holds for the matched source)."""

    ref: str
    state: dict[str, Tensor]
    max_output_diff: float | None = None
    stored_dtype: str | None = None
    stored_output_diff: float | None = None
    stored_tolerance: float | None = None

    @property
    def failure(self) -> str | None:
        """What the function check found, in one line; None when the function is kept."""
        return check_failure(self, f"'{self.ref}' moved")

    def to_dict(self) -> dict:
        return {"model": self.ref, "max_output_diff": self.max_output_diff,
                "stored_dtype": self.stored_dtype,
                "stored_output_diff": self.stored_output_diff,
                "stored_tolerance": self.stored_tolerance}


def check_lineage(source: Loaded, other: Loaded) -> None:
    """`other` can take the source's element: the same family, sizes, tensor names and
    shapes (and the same reading of inputs). One line otherwise."""
    try:
        check_compatible(source, other)
    except RotvizError as e:
        raise RotvizError(f"'{other.ref}' cannot be moved with the element found for "
                          f"'{source.ref}': {e}") from None


def element_of_matched(matched: Matched) -> Element:
    """The element of a matching, or one line where it has none to reuse."""
    if matched.element is None:
        raise RotvizError(
            f"matching [{matched.report.options.label}] leaves no single element to move "
            "other models with (learned matching tunes its maps on the pair itself); "
            "match without learned")
    return matched.element


def move_state(element: Element, other: Loaded,
               device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """move_state(matched.element, finetune) -> state dict

    `other`'s parameters moved by `element` (new tensors on the CPU; `other` is not
    modified), with `other`'s own names, layouts and dtypes. For the app and merging, which
    hold models in memory; no function check (`move_model` runs it)."""
    moved = apply_element(view_of(other, device), element.to(device))
    return {k: v.to("cpu") for k, v in write_state(moved).items()}


def move_model(matched: Matched, source: Loaded, other: Loaded,
               device: torch.device | str = "cpu") -> Moved:
    """Move `other`, a model of `source`'s lineage, by the element that matched `source`,
    and check on probe inputs that its function is kept (in float32, and for a half
    checkpoint in its dtype too). Refuses, in one line, a model of other shapes."""
    element = element_of_matched(matched)
    check_lineage(source, other)
    state = move_state(element, other, device)
    check_finite(state, f"{other.ref} moved")
    out = Moved(other.ref, state, max_output_diff(other, other.state, state))
    dtype = other.stored_dtype
    if dtype in HALF:
        record_stored_check(out, dtype, *stored_output_diff(other, state))
    return out

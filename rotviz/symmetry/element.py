"""A whole group element, as matching finds it, to apply again to other models.

Matching moves a source onto an anchor by one element of the symmetry group: per-block maps
(FFN permutations and scales, head permutations, Q-K and V-O maps: rotviz.symmetry.actions)
and, with residual matching, one map Q of the residual stream (rotviz.symmetry.residual).
Other models of the source's lineage (its fine-tunes: the same architecture, weights near
the source's) can be moved by the very same element, so that they sit next to the anchor's
own lineage as the source does (the lineage experiment, docs/symmetries.md).

The per-block maps act on the hidden units and the head dimensions, Q on the stream: the two
commute, so the element is (per-block maps, Q) in any order. Q is a symmetry only of a
model in its canonical form (norm gains folded into their readers; for LayerNorm, writers
centred). Applied to a model, the element therefore takes the model's own gauge out
(`canonicalise`), applies the maps, and puts in the anchor's gauge (`restore`), exactly what
matching did to the source; the gauge is part of the parametrisation, not of the function,
so the function is kept whatever the model's own norm gains are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rotviz.errors import RotvizError
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import LayerTransform, apply
from rotviz.symmetry.view import ModelView

Tensor = torch.Tensor


@dataclass(frozen=True)
class Element:
    """One group element of a whole model: `transforms` per block (blocks not named: the
    identity), the residual map `residual` (d, d) or None, and with it `gauge`, the anchor's
    norm gains and writer means that the moved model is written in."""

    transforms: Mapping[int, LayerTransform]
    residual: Tensor | None = None
    gauge: rs.Gauge | None = None

    def __post_init__(self) -> None:
        if self.residual is not None and self.gauge is None:
            raise RotvizError("a residual map needs the anchor's gauge (rotviz.symmetry."
                              "residual.canonicalise(anchor)[1]); pass gauge=")

    def to(self, device: torch.device | str) -> Element:
        """The same element with every tensor on `device` (new tensors; this one is kept)."""

        def mv(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        transforms = {i: LayerTransform(mv(t.perm), mv(t.qk), mv(t.vo), mv(t.heads),
                                        mv(t.ffn_scale)) for i, t in self.transforms.items()}
        gauge = None if self.gauge is None else rs.Gauge(
            {k: v.to(device) for k, v in self.gauge.gains.items()},
            {k: v.to(device) for k, v in self.gauge.means.items()})
        return Element(transforms, mv(self.residual), gauge)


def check_fits(view: ModelView, element: Element) -> None:
    """Refuse, in one line, an element made for a model of other sizes than `view`'s."""
    n = len(view.blocks)
    far = sorted(i for i in element.transforms if not 0 <= i < n)
    if far:
        raise RotvizError(f"the element moves block {far[0]}, but this model has {n} blocks; "
                          "apply it to a model shaped like the source it was found for")
    dims = view.dims
    for i, t in element.transforms.items():
        sizes = (("FFN permutation", t.perm, (dims.d_ffn,)),
                 ("FFN scales", t.ffn_scale, (dims.d_ffn,)),
                 ("head permutation", t.heads, (dims.n_heads,)),
                 ("Q-K maps", t.qk, (dims.n_kv_heads, dims.d_head, dims.d_head)),
                 ("V-O maps", t.vo, (dims.n_kv_heads, dims.d_head, dims.d_head)))
        for what, x, shape in sizes:
            if x is not None and tuple(x.shape) != shape:
                raise RotvizError(f"block {i}'s {what} have shape {tuple(x.shape)}, but this "
                                  f"model needs {shape}; apply the element to a model shaped "
                                  "like the source it was found for")


def apply_element(view: ModelView, element: Element) -> ModelView:
    """The model of `view` moved by `element`: new tensors, `view` untouched. With a
    residual map the model is canonicalised first and put into the anchor's gauge after
    (see module), as matching did to the source."""
    check_fits(view, element)
    if element.residual is None:
        return apply(view, element.transforms)
    canonical, _ = rs.canonicalise(view)
    moved = apply(canonical, element.transforms)
    moved = rs.apply_residual(moved, element.residual.to(moved.blocks[0].attn.wq.device))
    return rs.restore(moved, element.gauge)

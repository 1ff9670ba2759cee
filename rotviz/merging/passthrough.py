"""Passthrough (mergekit's `passthrough` with `slices`; "frankenmerges"): a new model stacked
from layer ranges of the two models, its blocks copied, not combined, so it may be deeper or
shallower than either.

`--slices a:0-4,b:2-6` builds the anchor's blocks 0-3 and then the source's blocks 2-5 (six
blocks; ranges half-open, as mergekit's `layer_range`; read in rotviz.merging.slices, stacked
with the model's own config in rotviz.sources.stacking). The source is
the matched source, as in every rotviz merge: its blocks are taken in the anchor's basis, so
a stream that matching rotated (`--match` with residual) reads the same coordinates in the
source's blocks as in the anchor's; matching that moves only hidden units and heads leaves
each block's function as it was and changes nothing here. Without --slices the anchor's
blocks below the middle and the source's from it are stacked (the depth kept).

The tensors outside the blocks: with `--passthrough-ends anchor` (the default) the anchor's
embeddings, final norm and head; with `slices`, mergekit 0.1.5's rule: the embeddings of the
first slice's model and the final norm and head of the last slice's (mergekit's plan takes
its `pre_weights` from the first slice and its `post_weights` from the last). Both say the
same where the slices start and end with the anchor's blocks. The weight is not used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rotviz.merging.registry import Built, Mergekit, MergeMethod, register
from rotviz.merging.slices import check_depths, halves, parse, plan
from rotviz.params import Param
from rotviz.sources.stacking import depth_of, own_config, stack, stacked_config

if TYPE_CHECKING:
    import torch

    from rotviz.merging.registry import MergeJob

    Tensor = torch.Tensor

SLICES = Param("slices", "", "the blocks of the new model, in order, as "
               "MODEL:START-STOP ranges (a: the anchor, b: the source; STOP not included, as "
               "mergekit's layer_range), e.g. a:0-4,b:2-6; default: the anchor's blocks "
               "below the middle, the source's from it", label="Passthrough: slices (e.g. "
               "a:0-4,b:2-6)", metavar="SLICES")
ENDS = Param("passthrough_ends", "anchor", "where the embeddings, final norm and "
             "head come from: anchor, or slices (mergekit's: the first slice's model's "
             "embeddings, the last slice's final norm and head) (default anchor)",
             choices=("anchor", "slices"), label="Passthrough: embeddings and head from")


def _assemble(job: MergeJob, states: Sequence[Mapping[str, Tensor]]) -> Built:
    spec = job.loaded.spec
    depths = [depth_of(spec, s) for s in states]
    text = str(job.params["slices"]).strip()
    slices = parse(text, len(states)) if text else halves(depths[0])
    check_depths(slices, depths)
    blocks = plan(slices)
    first, last = (blocks[0][0], blocks[-1][0]) if job.params["passthrough_ends"] == "slices" \
        else (0, 0)
    state = stack(spec, states, blocks, first, last)
    config = stacked_config(spec, [job.loaded.config] * len(states), blocks)
    return Built(state, own_config(spec, config, job.loaded.config), blocks)


def _check(values: Mapping[str, object]) -> None:
    """The form of --slices (letters, empty ranges), before any model is read; the ranges
    against the models' depths are checked once they are."""
    if str(values.get("slices") or "").strip():
        parse(str(values["slices"]))


PASSTHROUGH = register(MergeMethod(
    "passthrough", "Passthrough (layer stacking)",
    "a new model stacked from layer ranges of the two (--slices a:0-4,b:2-6), blocks copied, "
    "not combined; the depth may change (mergekit's passthrough; frankenmerges)",
    assemble=_assemble, check=_check, params=(SLICES, ENDS), max_models=2,
    extra=("slices", "passthrough_ends"), weighted=False,  # blocks are copied, not weighed
    mergekit=Mergekit("passthrough", weight=None, slices="slices", ends="passthrough_ends"),
    order=990))

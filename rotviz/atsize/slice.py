"""The slice record at size (rotviz.measures.slice): slices around one model larger than
memory, each grid point built block by block.

`rotviz.analysis.loss_grid.slice_at` holds the model, its directions and each grid point in
memory. Here the checkpoint is held as stored on the device with its directions beside it
(in the stored dtype, as the loaded model would hold them: 3x the checkpoint's bytes for a
plane, 2x for a line), and each point theta + x d1 + y d2 is never made whole: every
block's weights are built in float32 just before the block runs and dropped after it
(rotviz.atsize.points.Held). The directions are exactly the in-memory ones: each tensor's
draw is seeded from the seed and the tensor's parameter name
(rotviz.analysis.directions.tensor_directions), and its normalisation (filter, layer, none;
biases zeroed or kept) reads that tensor alone, so nothing needs the whole model. Only
random directions run at size: Hessian eigenvectors need gradients of the whole model.
"""

from __future__ import annotations

import math
import os
import time

import torch

from rotviz.analysis.directions import tensor_directions
from rotviz.analysis.loss_grid import Grid, Slice, check_choices
from rotviz.atsize.points import Held
from rotviz.data.split import Split
from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.limits import GRID, SEED, SPAN
from rotviz.sources.adapters import source_of
from rotviz.types import Progress

Tensor = torch.Tensor


class SliceHeld(Held):
    """One checkpoint held as stored, with `dims` random directions of its parameters."""

    def __init__(self, ref: str | os.PathLike, split: Split, dims: int, seed: int,
                 norm: str, keep_1d: bool, device: str | torch.device = "cpu",
                 batch_size: int = 512):
        super().__init__([ref], split, device, batch_size)
        model = self.models[0]
        module_name = source_of(model.spec).checkpoint_names(self.module, list(self.keys))
        params = {n for n, _ in self.module.named_parameters()}  # tied: the owner only
        self.owner = {alias: owner for alias, owner in model.tied if alias in self.keys}
        self.directions: list[dict[str, Tensor]] = [{} for _ in range(dims)]
        for n in self.keys:  # buffers, tied aliases and zeroed 1-D tensors hold no direction
            w = self.tensors[0][n]
            if n in self.owner or module_name.get(n) not in params \
                    or not w.is_floating_point() or (w.dim() <= 1 and not keep_1d):
                continue
            for d, t in zip(self.directions,
                            tensor_directions(module_name[n], w, dims, seed, norm, keep_1d),
                            strict=True):
                d[n] = t
        self.held_bytes += sum(t.numel() * t.element_size()
                               for d in self.directions for t in d.values())

    def at(self, x: float, y: float, names) -> dict[str, Tensor]:
        """The named tensors of theta + x d1 (+ y d2) in float32, as `slice_at` sums them; a
        tied alias is its owner's tensor, the centre the weights themselves."""
        out = {}
        for n in names:
            key = self.owner.get(n, n)
            w = self.tensors[0][key]
            ds = [d.get(key) for d in self.directions]
            if not w.is_floating_point() or ds[0] is None or (x == 0.0 and y == 0.0):
                out[n] = w if not w.is_floating_point() else w.float()
            elif len(ds) == 1:
                out[n] = w.float() + x * ds[0].float()
            else:
                out[n] = w.float() + x * ds[0].float() + y * ds[1].float()
        return out

    def loss_acc_at(self, x: float, y: float) -> tuple[float, float]:
        keys = self.models[0].block_keys
        per, _ = self.run(lambda ns: self.at(x, y, ns), lambda k: self.at(x, y, keys[k]))
        return float(per[0].sum() / per[2].sum()), float(per[1].sum() / per[2].sum())

    def norms(self) -> tuple[list[float], float | None]:
        """|d1| (, |d2|) and, for two directions, their cosine (float64 sums)."""
        sq = [sum(float(torch.sum(t.double() ** 2)) for t in d.values())
              for d in self.directions]
        norms = [math.sqrt(s) for s in sq]
        if len(norms) < 2 or norms[0] <= 0 or norms[1] <= 0:
            return norms, None
        d1, d2 = self.directions
        inner = sum(float(torch.sum(d1[k].double() * d2[k].double())) for k in d1)
        return norms, inner / (norms[0] * norms[1])


def sized_slice(ref: str | os.PathLike, split: Split, dims: int = 2, norm: str = "filter",
                keep_1d: bool = False, grid: int = 21, span: float = 1.0, seed: int = 0,
                device: str | torch.device = "cpu", progress: Progress | None = None,
                batch_size: int = 512, group: Group = SINGLE, name: str | None = None
                ) -> Slice | None:
    """`rotviz.analysis.loss_grid.slice_at` with random directions around the model in the
    checkpoint folder `ref` (called `name` in the result), each grid point built block by
    block. Under torchrun (`group`) the grid points are shared and rank 0 returns the slice
    (None elsewhere)."""
    check_choices(norm, "random", dims)
    GRID.check(grid)
    SPAN.check(span)
    SEED.check(seed)
    t0 = time.perf_counter()
    held = SliceHeld(ref, split, dims, seed, norm, keep_1d, device, batch_size)
    g = Grid.of(dims, grid, span)
    todo = [g.xy(cell) for cell in g.cells]
    todo.append((0.0, 0.0))  # the centre, reported on its own as slice_at does
    found = group.each(len(todo), lambda j: held.loss_acc_at(*todo[j]), progress,
                       lambda n, total, j: f"grid point {n} of {total}")
    if found is None:
        return None
    loss, acc = g.fill(found[j] for j in range(len(g.cells)))
    centre_loss, centre_acc = found[len(g.cells)]
    norms, cos = held.norms()
    return Slice(
        dims=dims, xs=g.xs, ys=g.ys, loss=loss, acc=acc, centre_loss=centre_loss,
        centre_acc=centre_acc, directions="random", norm=norm,
        keep_1d=keep_1d, grid=grid, span=float(span), seed=seed, data=split.data,
        split=split.split, device=str(held.device), seconds=time.perf_counter() - t0,
        n=split.n, model=str(ref) if name is None else name, direction_norms=norms,
        cosine=cos)


def refuse_directions(directions: str) -> None:
    """One line when `directions` cannot be drawn block by block (only random ones can)."""
    if directions != "random":
        raise RotvizError(f"--directions {directions} are built from the whole model in "
                          "memory (its Hessian, its tangents or a second model); at size "
                          "(--max-memory) a slice takes random directions: drop --directions "
                          "or raise --max-memory")


def check_at_size(v: dict) -> None:
    """One line for the slice's values that need the model in memory (before any loading):
    any directions but random ones, any centre but the model, `unit` normalisation."""
    refuse_directions(v["directions"])
    if v["around"] != "anchor":
        raise RotvizError(f"--around {v['around']} needs the pair in memory; at size a slice "
                          "is taken around the model itself (--around anchor)")
    if v["norm"] == "unit":
        raise RotvizError("--norm unit groups each head's and FFN unit's rows across tensors, "
                          "which needs the model in memory; at size use --norm filter, layer "
                          "or none")


def slice_at_size(ends, ctx, v: dict) -> Slice | None:
    """The slice record's at-size run: `sized_slice` on the streamed anchor with the record's
    values (`ctx`: the record's Context)."""
    return sized_slice(ends.anchor_path, ctx.split, v["dims"], v["norm"], v["biases"] == "keep",
                       v["grid"], v["span"], v["seed"], ctx.device, ctx.progress,
                       v["batch_size"], ctx.group or SINGLE, name=ends.anchor_ref)

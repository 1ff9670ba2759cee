"""Layer-wise barriers of a pair larger than memory, each point built block by block.

`rotviz.analysis.layerwise.layerwise_on` holds the anchor, the matched source and the source
in memory, and builds S_g (the anchor with group g's tensors from a target) whole for each
path. Here the three checkpoints are held as stored on the device (two without the unmatched
comparison; rotviz.atsize.points.Held) and each point lerp(A, S_g, alpha) is built one block
at a time, just before the block runs: by block, a tensor comes from the target when its
block (or 'rest') is in the group; by kind, the block's canonical views of the anchor and the
target are mixed field by field and written back (a fused Q/K/V projection split into its
parts, as in memory), and a tensor outside the blocks moves with its kind. Tensors that are
not parameters of the module (buffers) stay the anchor's; a tied alias is its owner. The
series (which paths, each distinct point evaluated once, the points dealt among torchrun's
processes) is the in-memory one: rotviz.analysis.layerwise.series.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from rotviz.analysis.layerwise import (
    BY,
    REST,
    Layerwise,
    Point,
    assemble,
    block_mixed,
    kind_outside,
    kinds_of,
    series,
)
from rotviz.atsize.blocks import block_tensors, block_view
from rotviz.atsize.points import Held
from rotviz.data.split import Split
from rotviz.dist import SINGLE, Group
from rotviz.errors import RotvizError
from rotviz.limits import POINTS
from rotviz.match.endpoints import MatchInfo
from rotviz.sources.adapters import source_of
from rotviz.symmetry.view import read_block
from rotviz.types import Progress

Tensor = torch.Tensor


class GroupsHeld(Held):
    """The anchor and its targets (matched source, then the source) held as stored, with the
    groups of `by` and the tensors each moves."""

    def __init__(self, refs: list[str], split: Split, by: str,
                 device: str | torch.device = "cpu", batch_size: int = 512):
        if by not in BY:
            raise RotvizError(f"unknown --by '{by}': use one of {', '.join(BY)}")
        super().__init__(refs, split, device, batch_size)
        self.by = by
        model = self.model = self.models[0]
        module_name = source_of(model.spec).checkpoint_names(self.module, list(self.keys))
        params = {n for n, _ in self.module.named_parameters()}
        self.owner = dict(model.tied)  # alias -> owner (checkpoint names)
        self.moves = {n for n in self.keys
                      if module_name.get(self.owner.get(n, n)) in params
                      and self.tensors[0][n].is_floating_point()}
        self.block_of = {n: k for k, keys in enumerate(model.block_keys) for n in keys}
        prefixes = model.layout.blocks
        if by == "block":
            self.groups = [str(i) for i in range(len(prefixes))] + [REST]

            def group_of(n: str) -> str:
                n = self.owner.get(n, n)
                return next((str(i) for i, p in enumerate(prefixes) if n.startswith(p)), REST)
        else:
            meta = model.state
            blocks = [read_block(model.spec, model.dims, model.layout, meta, p)
                      for p in prefixes]
            other = [n for n in model.rest if n not in self.owner
                     and model.checkpoint.entries[n].dtype.is_floating_point]
            self.groups = kinds_of(blocks, other, self.kind)

            def group_of(n: str) -> str:
                return self.kind(n)
        self.group_of = group_of

    def kind(self, name: str) -> str:
        return kind_outside(name, self.model.layout, self.owner)

    def target_block(self, t: int, chosen: frozenset[str], k: int) -> dict[str, Tensor]:
        """Block k of S: the anchor with the groups `chosen` from target t (float32)."""
        a, b = self.tensors[0], self.tensors[1 + t]
        keys = self.model.block_keys[k]
        if self.by == "block":
            return {n: (b if n in self.moves and self.group_of(n) in chosen else a)[n].float()
                    for n in keys}
        prefix = self.model.layout.blocks[k]
        spec, dims, layout = self.model.spec, self.model.dims, self.model.layout
        va = read_block(spec, dims, layout, {n: a[n].float() for n in keys}, prefix)
        vb = read_block(spec, dims, layout, {n: b[n].float() for n in keys}, prefix)
        view = block_view(self.model, block_mixed(va, vb, set(chosen)), k,
                          {n: torch.float32 for n in keys})
        return block_tensors(view, k, self.model)

    def target_rest(self, t: int, chosen: frozenset[str], names) -> dict[str, Tensor]:
        """The named tensors outside the blocks of S (float32; others as stored)."""
        out = {}
        for n in names:
            key = self.owner.get(n, n)
            a, b = self.tensors[0][key], self.tensors[1 + t][key]
            if not a.is_floating_point():
                out[n] = a
            else:
                moved = n in self.moves and self.group_of(n) in chosen
                out[n] = (b if moved else a).float()
        return out

    def target(self, t: int, chosen: frozenset[str], names) -> dict[str, Tensor]:
        """The named tensors of S, block tensors through their whole block."""
        out: dict[str, Tensor] = {}
        inside = [n for n in names if n in self.block_of]
        for k in dict.fromkeys(self.block_of[n] for n in inside):
            out.update(self.target_block(t, chosen, k))
        out.update(self.target_rest(t, chosen, [n for n in names if n not in self.block_of]))
        return {n: out[n] for n in names}

    def point(self, t: int, chosen: frozenset[str], alpha: float, names) -> dict[str, Tensor]:
        """lerp(A, S, alpha) for the named tensors, as the in-memory path computes it."""
        s = self.target(t, chosen, names)
        out = {}
        for n in names:
            a = self.tensors[0][self.owner.get(n, n)]
            out[n] = torch.lerp(a.float(), s[n], alpha) if a.is_floating_point() else a
        return out

    def loss_acc(self, rest, provider) -> tuple[float, float]:  # type: ignore[override]
        per, _ = self.run(rest, provider)
        return float(per[0].sum() / per[2].sum()), float(per[1].sum() / per[2].sum())

    def anchor(self) -> tuple[float, float]:
        a, keys = self.tensors[0], self.model.block_keys
        return self.loss_acc(lambda ns: self.target_rest(0, frozenset(), ns),
                             lambda k: {n: a[n].float() for n in keys[k]})

    def path(self, t: int, groups: tuple[str, ...]) -> Point:
        chosen, keys = frozenset(groups), self.model.block_keys

        def at(alpha: float) -> tuple[float, float]:
            return self.loss_acc(lambda ns: self.point(t, chosen, alpha, ns),
                                 lambda k: self.point(t, chosen, alpha, keys[k]))
        return at

    def same(self, g: str) -> bool:
        """Whether moving `g` toward either target gives bit for bit the same tensors."""
        chosen = frozenset([g])
        for k in range(len(self.model.block_keys)):
            x, y = self.target_block(0, chosen, k), self.target_block(1, chosen, k)
            if not all(torch.equal(x[n], y[n]) for n in x):
                return False
        x, y = (self.target_rest(t, chosen, self.model.rest) for t in (0, 1))
        return all(torch.equal(x[n], y[n]) for n in x)


def sized_layerwise(ends, split: Split, points: int = 11, by: str = "block",
                    compare: bool = True, device: str | torch.device = "cpu",
                    progress: Progress | None = None, batch_size: int = 512,
                    group: Group = SINGLE) -> Layerwise | None:
    """`rotviz.analysis.layerwise.layerwise_on` on streamed endpoints
    (rotviz.atsize.endpoints: anchor, matched source and source as checkpoint folders), each
    point built block by block. Under torchrun (`group`) the points are shared and rank 0
    returns the result (None elsewhere)."""
    POINTS.check(points)
    if by not in BY:
        raise RotvizError(f"unknown --by '{by}': use one of {', '.join(BY)}")
    t0 = time.perf_counter()
    compare = compare and ends.matched_path != ends.source_path  # the same on every rank
    refs = [ends.anchor_path, ends.matched_path] + ([ends.source_path] if compare else [])
    held = GroupsHeld(refs, split, by, device, batch_size)
    alphas = np.linspace(0.0, 1.0, points).tolist()

    def tick(done: int, total: int, what: str) -> None:
        if progress:
            progress(done, total, f"{by} {what}")

    found = series(held.groups, 2 if compare else 1, alphas, held.anchor, held.path,
                   held.same, group, tick)
    if found is None:
        return None
    info: MatchInfo = ends.info or MatchInfo("none", 0.0, 0.0, None, 0.0)
    return assemble(by, alphas, found[0], found[1] if compare else None, info, split,
                    str(held.device), time.perf_counter() - t0, ends.layers,
                    ends.anchor_ref, ends.source_ref)


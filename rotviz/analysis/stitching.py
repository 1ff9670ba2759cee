"""Layer swaps (model stitching): hybrids of two models of one architecture, and an affine
stitching layer trained at a boundary between their halves.

Hybrid k (k = 0 .. L) runs the anchor's embeddings and its first k blocks, then the other
model's blocks k .. L-1, its final norm and its head. It is a state dict assembled by tensor
name from the two state dicts, where each name's place comes from the architecture data
(rotviz.arch through the resolved `Layout`): the tensors under block i's prefix belong to
block i; the stream's writers (embedding tables, position and class tokens, patch
projections) and the embedding norms that sit on the stream (post-norm models) are the
front; the final norm, the readers (head, pooler) and any other floating tensor outside the
blocks are the back. A tied alias (GPT-2's head, which is its word embedding) follows its
owner: the front's, the anchor's. Tensors that are not floating (position ids) are the
anchor's. Nothing is special-cased by family.

An affine stitch T(x) = x W^T + b (W = I, b = 0 at the start, so the untrained stitch is
hybrid k exactly) sits on the residual stream at boundary k: on the input of block k
(a forward pre-hook), or for k = L on the output of the last block. It is hooked onto a copy
of the evaluator's module (rotviz.sources.running.module_copy), so the caller's models are
never touched, and trained with Adam on a split (the train split), the hybrid's own
parameters fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from rotviz.errors import RotvizError
from rotviz.evaluation import Evaluator
from rotviz.sources.loading import Loaded
from rotviz.symmetry.view import Layout, resolve_layout
from rotviz.types import Progress

Tensor = torch.Tensor
FRONT, BACK = "front", "back"


def depth_and_width(loaded: Loaded) -> tuple[int, int]:
    """(blocks, stream width) of a model, from its architecture data."""
    from rotviz.arch.spec import config_value

    blocks = len(resolve_layout(loaded.spec, loaded.state).blocks)
    return blocks, int(config_value(loaded.config, loaded.spec.d_model_key, 0))


def check_same_shape(anchor: Loaded, source: Loaded) -> None:
    """One line when the two models cannot be cut and joined: other depths or widths."""
    (la, da), (ls, ds) = depth_and_width(anchor), depth_and_width(source)
    if la != ls:
        raise RotvizError(f"the models have different depths ({la} vs {ls} blocks); stitch "
                          "swaps blocks between two models of one depth")
    if da != ds:
        raise RotvizError(f"the models have different widths ({da} vs {ds}); stitch joins "
                          "two residual streams of one width")


class Parts:
    """Where each tensor of a model lives for a swap: block i, the front or the back."""

    def __init__(self, anchor: Loaded):
        self._set(resolve_layout(anchor.spec, anchor.state), anchor.spec.tied)

    @classmethod
    def of(cls, layout: Layout, tied) -> Parts:
        """The parts of a model read at size (its resolved layout and live ties)."""
        out = cls.__new__(cls)
        out._set(layout, tied)
        return out

    def _set(self, layout: Layout, tied) -> None:
        self.layout = layout
        self.depth = len(layout.blocks)
        self.owner = dict(tied)  # alias -> owner (full names)

    def from_other(self, name: str, k: int) -> bool:
        """Whether hybrid k takes the floating tensor `name` from the other model."""
        p = self.part(name)
        return p == BACK or (isinstance(p, int) and p >= k)

    def part(self, name: str) -> int | str:
        """Block index, FRONT or BACK of the tensor `name`."""
        lay = self.layout
        name = self.owner.get(name, name)
        for i, prefix in enumerate(lay.blocks):
            if name.startswith(prefix):
                return i
        module = name.rsplit(".", 1)[0]
        if name in lay.writers or module in lay.writers or module in lay.stream_norms:
            return FRONT
        return BACK


def hybrid_state(parts: Parts, a: Mapping[str, Tensor], b: Mapping[str, Tensor], k: int
                 ) -> dict[str, Tensor]:
    """Hybrid k: the anchor's (`a`) front and blocks 0..k-1, `b`'s blocks k..L-1 and back
    (tensors shared, never copied or modified). k = L is the anchor with `b`'s back; k = 0 is
    `b` with the anchor's front."""
    if not 0 <= k <= parts.depth:
        raise RotvizError(f"no boundary {k}: use 0 .. {parts.depth}")

    return {n: (b[n] if t.is_floating_point() and parts.from_other(n, k) else t)
            for n, t in a.items()}


def sized_hybrids(refs: list[str], split, device, batch_size: int, targets: int,
                  progress: Progress | None = None) -> tuple[list[list[tuple[float, float]]],
                                                             list[tuple[float, float]]]:
    """The hybrids at size: `refs` are the anchor's folder, then the `targets` others' (the
    matched source, then the source), opened headers only (rotviz.atsize.points.Opened);
    each hybrid runs block by block, each block read from the model it comes from just
    before it runs, nothing held between hybrids. Returns (loss, acc) per target per k, and
    of each model on its own (the anchor, then each target)."""
    from rotviz.atsize.points import Opened

    op = Opened(refs, split, device, batch_size)
    model = op.models[0]
    parts = Parts.of(model.layout, model.tied)
    keys = model.block_keys
    floating = {n: model.checkpoint.entries[n].dtype.is_floating_point for n in model.rest}
    total, done = targets * (parts.depth + 1) + targets + 1, [0]

    def hybrid(t: int, k: int, alone: bool = False) -> tuple[float, float]:
        """Target t (a model index, 0 = the anchor alone) after the anchor's front and k
        blocks; `alone`: target t's front too (the model on its own)."""
        def source(n: str) -> int:
            take = floating.get(n, True) and (alone or parts.from_other(n, k))
            return t if take else 0

        def rest(names) -> dict[str, Tensor]:
            out: dict[str, Tensor] = {}
            for i in dict.fromkeys((0, t)):
                mine = [n for n in names if source(n) == i]
                if mine:
                    out.update(op.read(i, mine))
            return out

        per, _ = op.run(rest, lambda b: op.read(0 if b < k else t, keys[b]))
        done[0] += 1
        if progress:
            progress(done[0], total, "hybrids at size")
        return float(per[0].sum() / per[2].sum()), float(per[1].sum() / per[2].sum())

    got = [[hybrid(t, k) for k in range(parts.depth + 1)] for t in range(1, targets + 1)]
    own = [hybrid(0, 0)] + [hybrid(t, 0, alone=True) for t in range(1, targets + 1)]
    return got, own


# ---- the stitching layer --------------------------------------------------------------------


class Stitch(torch.nn.Module):
    """x -> x W^T + b on the last (stream) dimension; starts at the identity."""

    def __init__(self, d: int, device: torch.device):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.eye(d, device=device))
        self.bias = torch.nn.Parameter(torch.zeros(d, device=device))

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.linear(x.float(), self.weight, self.bias).to(x.dtype)


def _apply_first(value, stitch: Stitch):
    """`value` (a block's hidden states, or a tuple whose first item they are) stitched."""
    if isinstance(value, Tensor):
        return stitch(value)
    if isinstance(value, tuple) and value and isinstance(value[0], Tensor):
        return (stitch(value[0]), *value[1:])
    raise RotvizError("stitch cannot find the hidden states a block passes on; this "
                      "architecture has no stitching layer yet")


def stitched(ev: Evaluator, parts: Parts, k: int, stitch: Stitch) -> Evaluator:
    """A twin of `ev` (its own copy of the module) whose stream passes through `stitch` at
    boundary k: before block k, or after the last block for k = L."""
    twin = ev.twin()
    prefixes = parts.layout.blocks
    name = prefixes[min(k, parts.depth - 1)].rstrip(".")
    try:
        block = twin.module.get_submodule(name)
    except AttributeError:
        raise RotvizError(f"stitch cannot find block module '{name}' in the model; this "
                          "architecture has no stitching layer yet") from None
    if k < parts.depth:
        def pre(module, args, kwargs):
            if args:
                return (_apply_first(args[0], stitch), *args[1:]), kwargs
            if "hidden_states" in kwargs:
                return args, {**kwargs, "hidden_states": stitch(kwargs["hidden_states"])}
            raise RotvizError("stitch cannot find the hidden states a block reads")
        block.register_forward_pre_hook(pre, with_kwargs=True)
    else:
        block.register_forward_hook(lambda module, args, out: _apply_first(out, stitch))
    return twin


@dataclass
class StitchTraining:
    """What training the stitches did."""

    steps: list[int] = field(default_factory=list)  # per boundary trained
    train_loss: list[list[float]] = field(default_factory=list)  # per boundary, per step
    stopped: str = "steps"  # "steps" or "cancelled"


def train_stitch(ev: Evaluator, parts: Parts, params: Mapping[str, Tensor], k: int, d: int,
                 steps: int, lr: float, seed: int, batch_size: int,
                 tick: Callable[[int, float], None] | None = None,
                 cancel: Callable[[], bool] | None = None) -> tuple[Stitch, list[float], bool]:
    """Train the stitch at boundary k of the hybrid `params` on `ev`'s split: Adam on W and b
    only, batches drawn without replacement from a generator seeded with `seed` (torch's
    global seed untouched), so two calls give the same stitch. Returns the stitch, the loss
    at each step and whether `cancel()` stopped it."""
    from rotviz.data.inputs import cat_inputs, map_inputs
    from rotviz.match.learned import _train_loss

    stitch = Stitch(d, ev.device)
    twin = stitched(ev, parts, k, stitch)
    fixed = {n: t.detach() for n, t in params.items()}
    optim = torch.optim.Adam(stitch.parameters(), lr=lr)
    gen = np.random.default_rng(seed)
    xs = cat_inputs([x for x, _ in ev.batches])
    ys = torch.cat([y for _, y in ev.batches])
    n = len(ys)
    size = min(batch_size, n)
    history: list[float] = []
    for step in range(1, steps + 1):
        if cancel is not None and cancel():
            return stitch, history, True
        pick = torch.as_tensor(gen.choice(n, size=size, replace=False)).to(ys.device)
        loss = _train_loss(twin, fixed, map_inputs(xs, lambda v, i=pick: v[i]), ys[pick])
        optim.zero_grad()
        loss.backward()
        optim.step()
        history.append(float(loss.detach()))
        if tick:
            tick(step, history[-1])
    return stitch, history, False


def learned_stitches(ev: Evaluator, ev_train: Evaluator, parts: Parts,
                     a: Mapping[str, Tensor], b: Mapping[str, Tensor], d: int, steps: int,
                     lr: float, seed: int, batch_size: int, progress: Progress | None = None,
                     cancel: Callable[[], bool] | None = None
                     ) -> tuple[list[float | None], list[float | None], StitchTraining]:
    """(loss, acc) on `ev`'s split of hybrid k with a stitch trained on `ev_train`'s, for
    each boundary k = 0 .. L; None for the boundaries a cancel left untrained."""
    info = StitchTraining()
    total = (parts.depth + 1) * steps
    losses: list[float | None] = []
    accs: list[float | None] = []
    for k in range(parts.depth + 1):
        def tick(step: int, value: float, k: int = k) -> None:
            if progress:
                progress(k * steps + step, total,
                         f"stitch at boundary {k}, step {step}: loss {value:.3f}")
        with torch.enable_grad():
            stitch, history, stopped = train_stitch(
                ev_train, parts, ev_train.params(hybrid_state(parts, a, b, k)), k, d, steps,
                lr, seed, batch_size, tick, cancel)
        if stopped:
            info.stopped = "cancelled"
            break
        info.steps.append(len(history))
        info.train_loss.append(history)
        stitch.requires_grad_(False)
        loss, acc = stitched(ev, parts, k, stitch).evaluate(
            ev.params(hybrid_state(parts, a, b, k)))
        losses.append(loss)
        accs.append(acc)
    missing = parts.depth + 1 - len(losses)
    return losses + [None] * missing, accs + [None] * missing, info

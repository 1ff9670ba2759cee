"""A source whose FFN is narrower than the anchor's (all else equal): embedded into the
anchor's width by a rectangular assignment, then matched as any pair is.

Why an embedding and not a permutation: with d_ff_s < d_ff_a units there is no bijection
between the two FFNs, but the anchor's architecture can hold the source's function exactly. In
each layer every source unit goes to a distinct anchor unit ("slot") by a rectangular linear
assignment on the cost the square FFN permutation maximises (Eq. 7,
`rotviz.match.layer_solvers.ffn_cost`, here d_ff_s x d_ff_a). The embedded source then has the
anchor's shapes:

- a matched slot holds its source unit: in row, bias, gate row and bias, out column, together;
- a free slot (d_ff_a - d_ff_s per layer) has out-weights zero, so it adds nothing: the
  embedded source computes exactly the narrow source's function. Its in-side (in row, bias,
  gate row and bias) is the anchor's own for that slot. No output sees it (its out column is
  zero), and it makes a merge keep the anchor's unit as it is, scaled at its output only:
  with the simple average at weight w the free unit writes (1 - w) of what the anchor's unit
  writes (docs/symmetries.md, "A narrower FFN").

The other maps (attention, rescale, heads, the residual stream) and the square FFN
permutation then run on (anchor, embedded source) unchanged: every one of them is a symmetry of
the embedded model as of any model of the anchor's architecture. Activation and learned
matching (which run the source's own module on data) and streaming are refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch

from rotviz.arch import config_value
from rotviz.errors import RotvizError
from rotviz.groups import inject
from rotviz.match.layer_solvers import ffn_cost
from rotviz.sources.loading import HALF, Loaded
from rotviz.sources.pairs import check_compatible, check_same_reading
from rotviz.sources.running import forward, logit_change, probe_inputs, stored_module, stored_state
from rotviz.symmetry.view import FFN, ModelView, read_view, resolve_layout

Tensor = torch.Tensor

FFN_ROLES = ("ffn_in", "ffn_gate", "ffn_out")


def ffn_tensor_names(spec, state: Mapping[str, Tensor]) -> set[str]:
    """The names of every FFN weight and bias of a state dict (its shapes may be meta)."""
    layout = resolve_layout(spec, state)
    return {f"{block}{layout.roles[role]}.{kind}" for block in layout.blocks
            for role in FFN_ROLES if role in layout.roles for kind in ("weight", "bias")}


def differs_only_in_ffn(a, b) -> bool:
    """Whether two models (Loaded, or streamed models with meta states) have one family, one
    config shape (layers, hidden size, heads, activation) and one set of tensor names, and
    differ in the shape of FFN tensors only: a pair of different FFN widths."""
    if a.spec.family != b.spec.family or set(a.state) != set(b.state):
        return False
    for keys in (a.spec.n_layers_key, a.spec.d_model_key, a.spec.n_heads_key,
                 a.spec.activation_key):
        if config_value(a.config, keys) != config_value(b.config, keys):
            return False
    differ = {k for k in a.state if a.state[k].shape != b.state[k].shape}
    return bool(differ) and differ <= ffn_tensor_names(a.spec, a.state)


def ffn_widths(view: ModelView) -> list[int]:
    """The number of FFN units of each block."""
    return [blk.ffn.w_in.shape[0] for blk in view.blocks]


def check_pair(anchor: Loaded, source: Loaded, heads: bool = False) -> bool:
    """`check_compatible`, except for a source whose FFN is narrower than the anchor's in some
    layers (and nowhere wider), all else equal: True for such a pair (it is embedded before
    matching), False for a pair of one architecture. A wider source is refused in one line.
    `heads`: a pair of one body under different heads is let through (matching only)."""
    if not differs_only_in_ffn(anchor, source):
        check_compatible(anchor, source, heads)
        return False
    wa = ffn_widths(read_view(anchor.spec, anchor.config, anchor.state))
    ws = ffn_widths(read_view(source.spec, source.config, source.state))
    wider = [i for i, (s, a) in enumerate(zip(ws, wa, strict=True)) if s > a]
    if wider:
        i = wider[0]
        raise RotvizError(
            f"the models differ in FFN width only, and the source's is wider than the "
            f"anchor's (layer {i}: {ws[i]} units vs {wa[i]}): a narrower model is embedded "
            "into a wider one, not the reverse; swap ANCHOR and SOURCE")
    check_same_reading(anchor, source)
    return True


def refuse_narrower(why: str, fix: str) -> None:
    """One line for what a narrower source cannot do: `why` it cannot, and the `fix`."""
    raise RotvizError(f"the source's FFN is narrower than the anchor's, and {why}; {fix}")


@dataclass(frozen=True)
class Embedding:
    """Where each layer's source units went: `slots[i][j]` is the anchor slot of source unit
    j in block i; `widths[i]` is (source units, anchor units)."""

    slots: tuple[Tensor, ...]
    widths: tuple[tuple[int, int], ...]

    def free(self, i: int) -> Tensor:
        """The anchor slots of block i that no source unit took (sorted)."""
        taken = torch.zeros(self.widths[i][1], dtype=torch.bool)
        taken[self.slots[i].cpu()] = True
        return torch.nonzero(~taken).flatten()

    def to_dict(self) -> dict:
        return {"source_units": [s for s, _ in self.widths],
                "anchor_units": [a for _, a in self.widths],
                "slots": [s.tolist() for s in self.slots]}


def embed_ffn(anchor: FFN, source: FFN, slots: Tensor) -> FFN:
    """The source FFN in the anchor's width: source unit j in slot slots[j] (in row, bias,
    gate row and bias, out column); every other slot with the anchor's in-side and a zero
    out column. New tensors; neither FFN is modified."""
    slots = slots.to(source.w_in.device)

    def rows(a: Tensor | None, s: Tensor | None) -> Tensor | None:
        if s is None:
            return None
        out = a.detach().to(s).clone()
        out[slots] = s
        return out

    w_out = source.w_out.new_zeros(source.w_out.shape[0], anchor.w_out.shape[1])
    w_out[:, slots] = source.w_out
    return replace(source, w_in=rows(anchor.w_in, source.w_in), b_in=rows(anchor.b_in, source.b_in),
                   w_out=w_out, w_gate=rows(anchor.w_gate, source.w_gate),
                   b_gate=rows(anchor.b_gate, source.b_gate))


def embed(anchor: ModelView, source: ModelView) -> tuple[ModelView, Embedding]:
    """The narrower `source` embedded into `anchor`'s FFN width, every layer (the layers a
    match leaves alone too: the result must have the anchor's shapes), and where each unit
    went. The views are not modified."""
    blocks, slots, widths = [], [], []
    for i, (ba, bs) in enumerate(zip(anchor.blocks, source.blocks, strict=True)):
        s = inject(ffn_cost(anchor, source, i))
        blocks.append(replace(bs, ffn=embed_ffn(ba.ffn, bs.ffn, s)))
        slots.append(s)
        widths.append((bs.ffn.w_in.shape[0], ba.ffn.w_in.shape[0]))
    view = replace(source, dims=replace(source.dims, d_ffn=anchor.dims.d_ffn),
                   blocks=tuple(blocks))
    return view, Embedding(tuple(slots), tuple(widths))


def output_diff(anchor: Loaded, source: Loaded, state: Mapping[str, Tensor]) -> float:
    """The largest logit difference between the narrow source and `state` (anchor's shapes)
    run on the anchor's module, on the source's probe inputs (float32)."""
    x = probe_inputs(source)
    ys, ye = forward(source, x, every=True), forward(anchor, x, state, every=True)
    return float((ys.double() - ye.double()).abs().max())


def stored_output_diff(anchor: Loaded, source: Loaded, state: Mapping[str, Tensor]
                       ) -> tuple[torch.dtype, float, float] | None:
    """For a half checkpoint pair (both stored in one half dtype): the narrow source and
    `state`, each rounded to that dtype and run in it, the largest logit difference and the
    source's largest |logit| (the check's scale). None when the pair is not half."""
    dtype = source.stored_dtype
    if dtype not in HALF or anchor.stored_dtype != dtype:
        return None
    x = {k: v.to(dtype) if v.is_floating_point() else v
         for k, v in probe_inputs(source).items()}
    ys = forward(replace(source, model=stored_module(source)), x, every=True)
    ye = forward(replace(anchor, model=stored_module(anchor)), x, stored_state(anchor, state),
                 every=True)
    return dtype, *logit_change(ys, ye)

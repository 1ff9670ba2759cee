"""The hidden states of a model on a split, layer by layer, as whole representations.

A model's representations are its residual stream at L + 1 places: the embeddings' output
(the input of the first block) and each block's output, as transformers' `output_hidden_states`
lists them. They are read by hooks on the blocks the architecture data names
(`rotviz.symmetry.view.resolve_layout`), so every family and weight source (transformers,
timm) is read the same way and no family is special-cased. (transformers applies a decoder's
final norm to its last hidden state, GPT-2's `ln_f`; the hooks give the stream itself.)

Per example the positions become one row (`mean`: the non-padding tokens averaged under the
attention mask; `cls`: the first token) or many (`all`: every non-padding token stacked). For
an image model the tokens are its patches and its class token. Rows of every batch are
gathered in float64 and concatenated, so a statistic of the whole split is computed once,
never averaged over batches.

In a LayerNorm family each hidden state is read modulo the all-ones direction (each token's
mean over the features removed): every reader of the stream reads it through a LayerNorm,
which discards that direction, so it carries nothing of the function. rotviz's canonical
forms centre the stream's writers and its residual maps fix the all-ones vector, so a matched
source's stream is the source's, centred and rotated: without this, a matching that keeps
the function would seem to change the representations (by 1e-3 in CKA on the zoo's pair).
RMSNorm families (no centring) keep the stream as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from rotviz.errors import RotvizError

if TYPE_CHECKING:
    from torch import Tensor

    from rotviz.arch.spec import ArchSpec
    from rotviz.evaluation import Evaluator

TOKENS = ("mean", "cls", "all")


def first_token_convention(spec: ArchSpec) -> bool:
    """Whether the family reads a summary of the input at its first position: a class token
    among the stream's writers (ViT) or a pooler among its readers (BERT, RoBERTa, DeBERTa),
    both of which attend in both directions. A causal decoder (GPT-2, Llama, ...) has neither:
    its first token has seen only itself."""
    return any(w.split(".")[-1] == "cls_token" for w in spec.writers) or \
        any("pooler" in r for r in spec.readers)


def check_tokens(spec: ArchSpec, tokens: str) -> None:
    """Refuse, in one line, a way of reading tokens the family has no convention for."""
    if tokens not in TOKENS:
        raise RotvizError(f"unknown --tokens '{tokens}': use one of {', '.join(TOKENS)}")
    if tokens == "cls" and not first_token_convention(spec):
        raise RotvizError(f"--tokens cls: a {spec.family} model has no first-token summary "
                          "(no class token or pooler; its first token sees only itself); "
                          "use --tokens mean or all")


def centres(spec: ArchSpec) -> bool:
    """Whether the stream is read modulo the all-ones direction (LayerNorm families)."""
    return spec.norm_kind == "layernorm"


def pool(h: Tensor, mask: Tensor | None, tokens: str, centre: bool = False) -> Tensor:
    """(batch, positions, d) hidden states as rows (float64) per `tokens`; `centre`: each
    token's mean over the features removed first."""
    h = h.double()
    if centre:
        h = h - h.mean(-1, keepdim=True)
    if h.dim() == 2:  # no positions: one row per example already
        return h
    if tokens == "cls":
        return h[:, 0]
    if tokens == "all":
        from rotviz.data.inputs import without_padding

        return without_padding(h, mask).reshape(-1, h.shape[-1])
    if mask is None:
        return h.mean(1)
    m = mask.to(h.device, h.dtype)
    return (h * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp_min(1)


def block_output(out):
    """A block's output: the hidden states (the first item of a tuple)."""
    return out[0] if isinstance(out, tuple | list) else out


def hidden_states(ev: Evaluator, params: Mapping[str, Tensor], tokens: str = "mean",
                  private: bool = False) -> list[Tensor]:
    """The L + 1 representations (float64, on the CPU) of the parameter set `params` run on
    `ev`'s module over its whole split: embeddings' output, then each block's output.
    `private`: the evaluator's module is this caller's alone (at size, where it runs block by
    block under the runner's hooks), so the hooks go on it, not on a copy."""
    import torch

    from rotviz.data.inputs import token_mask
    from rotviz.symmetry.view import resolve_layout

    check_tokens(ev.loaded.spec, tokens)
    # hooks on a module of our own: another thread may run the evaluator's
    own = ev if private else ev.twin()
    module = own.module
    prefixes = resolve_layout(ev.loaded.spec, module.state_dict()).blocks
    if not prefixes:
        raise RotvizError(f"{ev.loaded.ref}: no transformer blocks found; similarity compares "
                          "the hidden states of blocks")
    blocks = [module.get_submodule(p.rstrip(".")) for p in prefixes]
    parts: list[list[Tensor]] = [[] for _ in range(len(blocks) + 1)]
    mask: list[Tensor | None] = [None]
    centre = centres(ev.loaded.spec)

    def keep(k: int, h: Tensor) -> None:
        parts[k].append(pool(h.detach(), mask[0], tokens, centre).cpu())

    def before(_m, args, kwargs):
        keep(0, args[0] if args else kwargs["hidden_states"])

    hooks = [blocks[0].register_forward_pre_hook(before, with_kwargs=True)]
    hooks += [b.register_forward_hook(lambda _m, _a, out, k=k: keep(k + 1, block_output(out)))
              for k, b in enumerate(blocks)]
    try:
        with torch.inference_mode():
            for x, _ in own.batches:
                mask[0] = token_mask(x)
                own.logits(params, x)
    finally:
        for h in hooks:
            h.remove()
    return [torch.cat(p) for p in parts]


def sized_hidden_states(ref: str, split, tokens: str = "mean", device="cpu",
                        batch_size: int = 512) -> list[Tensor]:
    """`hidden_states` of the model folder `ref` at size: its module on meta, each block's
    weights read just before it runs and dropped after (rotviz.atsize.points.Opened), so
    memory holds one block, the tensors outside the blocks and the pooled rows."""
    from rotviz.atsize.points import Opened
    from rotviz.memory import release

    op = Opened([ref], split, device, batch_size)
    model = op.models[0]
    check_tokens(model.spec, tokens)
    runner = model.runner(op.module, lambda names: op.read(0, names),
                          lambda k: op.read(0, model.block_keys[k]))
    try:
        return hidden_states(op.ev, {}, tokens, private=True)
    finally:
        runner.close()
        release()

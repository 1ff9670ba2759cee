"""Old-format buffers: tensors that checkpoints saved by older transformers versions hold and
today's model classes do not.

Position ids (now non-persistent buffers), per-layer rotary frequencies (now one per model),
causal masks and their fill values (now computed) were once saved with the weights. transformers
still loads such checkpoints, passing over those tensors; rotviz reads past the same ones, so
that a checkpoint loads here when it loads there, and is written back as today's transformers
writes it (without them). Everything else a module does not hold is still refused.

Which names a class reads past is taken from the installed classes wherever they say it: the
`_keys_to_ignore_on_load_unexpected` patterns of the module and its submodules (aggregated as
`PreTrainedModel.post_init` does), the patterns that
`PreTrainedModel._adjust_missing_and_unexpected_keys` adds (rotary `inv_freq`, `position_ids`),
and the module's non-persistent buffers. What the classes leave unsaid is data in the family's
file (`ArchSpec.legacy_buffers`). A name the class lists itself is read past whatever its shape,
as transformers does (DeBERTa lists `position_embeddings`, a table its module does not have when
`position_biased_input` is off). A name known otherwise (a non-persistent buffer's, the added
patterns', the family file's) is not enough: such a tensor is read past only when it is shaped
like a buffer (`buffer_like`), so that a weight under a matching name is refused rather than
silently dropped. Nothing here imports transformers: the lite loader (rotviz.sources.plain_torch)
asks too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from types import SimpleNamespace

from torch import nn

from rotviz.arch.spec import ArchSpec, config_value

Shape = Sequence[int]

# What transformers' `_adjust_missing_and_unexpected_keys` adds to the class's patterns (5.x),
# each only where the module has such a buffer: used where that method cannot be called (an
# older transformers, whose method takes other arguments, or a module of
# rotviz.sources.plain_torch).
_ADDED = ((r"rotary_emb\.inv_freq", "rotary_emb.inv_freq"),
          (r"(^|\.)position_ids$", "position_ids"))


def read_past(module: nn.Module, spec: ArchSpec, config: Mapping,
              tensors: Mapping[str, Shape | None] | Iterable[str]) -> set[str]:
    """The names among `tensors` (the checkpoint's tensors under the module's names, with
    their shapes) that `module`'s class reads past on load: names the module does not hold,
    that the class ignores (see the module's docstring), shaped like a buffer (`buffer_like`).

    A shape of None, or names given without shapes, are judged by name alone: for callers
    whose tensors were judged with their shapes before (rotviz.sources.hf filters what
    transformers reports after rotviz.atsize.runtime.check_fits has checked the headers)."""
    shapes = dict(tensors) if isinstance(tensors, Mapping) else dict.fromkeys(tensors)
    if not shapes:  # a load transformers found nothing unexpected in: the common case
        return set()
    own = set(module.state_dict())
    extra = [n for n in shapes if n not in own]
    if not extra:
        return set()
    # the class's own list, whatever the shape: transformers drops those names from every
    # load (DeBERTa's unused position table, GPT-2's masks), and the module holds nothing
    # they could feed
    listed = [re.compile(p) for p in _class_patterns(module)]
    out = {n for n in extra if any(p.search(n) for p in listed)}
    buffers = {n for n, _ in module.named_buffers()} - own  # non-persistent: never saved now
    patterns = [re.compile(p) for p in spec.legacy_buffers]
    named = {n for n in extra if n not in out and (n in buffers or any(p.search(n)
                                                                       for p in patterns))}
    named |= _transformers_ignores(module, [n for n in extra if n not in out | named])
    bound = _bound(spec, config)
    return out | {n for n in named if shapes[n] is None or buffer_like(shapes[n], bound)}


def buffer_like(shape: Shape, bound: int) -> bool:
    """Whether a tensor of `shape` is shaped like a buffer older versions saved: a single
    value (a mask's fill value), a vector of at most `bound` entries (position ids, rotary
    frequencies) or a causal mask `(1, 1, s, s)` over at most `bound` positions. A weight
    matrix is none of these."""
    dims = [int(x) for x in shape]
    long = [x for x in dims if x > 1]
    if len(long) <= 1:
        return not long or long[0] <= bound
    return len(dims) == 4 and dims[:2] == [1, 1] and dims[2] == dims[3] <= bound


def _bound(spec: ArchSpec, config: Mapping) -> int:
    """The longest side a read-past buffer may have: the model's positions or its width,
    whichever is larger (position ids and masks run over the positions, frequencies over
    part of a head)."""
    sides = [config_value(config, ("n_positions", "max_position_embeddings", "n_ctx")),
             config_value(config, spec.d_model_key)]
    return max([1, *(s for s in sides if isinstance(s, int) and not isinstance(s, bool))])


def _class_patterns(module: nn.Module) -> set[str]:
    """`_keys_to_ignore_on_load_unexpected` of the module and every submodule, as post_init
    gathers them into the top model (gathered here too, so that a module built otherwise, or
    a lite module that mirrors a class's list, is read alike)."""
    out: set[str] = set()
    for sub in module.modules():
        keys = getattr(sub, "_keys_to_ignore_on_load_unexpected", None)
        if isinstance(keys, (list, tuple, set, frozenset)):
            out |= {k for k in keys if isinstance(k, str)}
    return out


def _transformers_ignores(module: nn.Module, names: list[str]) -> set[str]:
    """The names transformers' `_adjust_missing_and_unexpected_keys` would drop from a load's
    unexpected keys, asked of the method itself on a stand-in report; where it cannot be
    asked, the patterns it adds in 5.x (`_ADDED`)."""
    if not names:
        return set()
    adjust = getattr(module, "_adjust_missing_and_unexpected_keys", None)
    if callable(adjust):
        info = SimpleNamespace(missing_keys=set(), unexpected_keys=set(names))
        try:
            adjust(info)
        except (TypeError, AttributeError, ValueError, re.error):
            pass  # another signature (transformers 4.x): the patterns below
        else:
            left = info.unexpected_keys
            if isinstance(left, (set, frozenset, list, tuple)):
                return set(names) - set(left)
    held = [n for n, _ in module.named_buffers()]
    patterns = [re.compile(p) for p, leaf in _ADDED if any(n.endswith(leaf) for n in held)]
    return {n for n in names if any(p.search(n) for p in patterns)}

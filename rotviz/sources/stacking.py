"""A model of another depth built from blocks: a family's block tensors renamed between
depths, and the model's own config.

A transformer's blocks are numbered in its tensor names (`vit.encoder.layer.3.`); a model of
N blocks is a config saying N, the tensors outside the blocks (embeddings, final norm, head)
and one set of block tensors per block, each named relative to its block. Blocks are found
by the family's own naming (`ArchSpec.roots` and `ArchSpec.block`, e.g. `model.layers.{i}.`
or `transformer.h.{i}.`), never by one family's names: a tensor is a block's when its name
is a root, the block template with a number, and the rest (`block_of`).

Two ways in, one result:
- state dicts (`stack`): block i of the new model is block j of model m, renamed; what
  passthrough (rotviz.merging.passthrough, layer ranges of two models) builds;
- a model (`block_state`, `stacked`): a list of blocks in names relative to a block written
  back as a new model (`Loaded`) of the template's class; what depth merging
  (rotviz.analysis.depths) builds its collapsed, expanded and grown models with.

Either way the model's config is `stacked_config`: the first model's with every depth key of
the family (`n_layers_key`) set to the new depth, and every per-layer list (a list named for
layers, one entry per block, as Gemma2's `layer_types`: sliding or full attention) rebuilt
from the lists of the models the blocks came from, so that each block keeps the attention it
was trained with. A stacked `Loaded` holds that config as its own; a writer writes it in
place of the folder's config.json where the two describe other blocks (`own_config`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rotviz.arch.spec import config_value
from rotviz.errors import RotvizError

if TYPE_CHECKING:
    import torch

    from rotviz.arch.spec import ArchSpec
    from rotviz.sources.loading import Loaded

    Tensor = torch.Tensor


# ---- blocks by tensor name (state dicts) ----------------------------------------------------

def _templates(spec: ArchSpec) -> list[re.Pattern]:
    pats = []
    for root in spec.roots:
        for block in spec.block:
            head, _, tail = block.partition("{i}")
            pats.append(re.compile(rf"^({re.escape(root + head)})(\d+)({re.escape(tail)}.*)$"))
    return pats


def block_of(spec: ArchSpec, name: str) -> tuple[str, int, str] | None:
    """(the prefix before the index, the block's index, the rest) of a block's tensor name,
    by the family's block naming; None for a tensor outside the blocks."""
    for pat in _templates(spec):
        found = pat.match(name)
        if found is not None:
            return found.group(1), int(found.group(2)), found.group(3)
    return None


def at_block(spec: ArchSpec, name: str, index: int) -> str:
    """`name`, a block's tensor name or a block's prefix, as block `index` names it. The one
    renaming between depths (`stack`, `stacked` and the checks of both): through the
    family's block naming (`block_of`), so a root or a tail holding a number of its own
    (`.0.`) is never taken for the block's index."""
    b = block_of(spec, name)
    if b is None:
        raise ValueError(f"'{name}' is no tensor of a {spec.family} block")
    return f"{b[0]}{index}{b[2]}"


def depth_of(spec: ArchSpec, state: Mapping[str, Any]) -> int:
    """The number of blocks a state dict holds (by its tensor names)."""
    found = {b[1] for b in (block_of(spec, k) for k in state) if b is not None}
    return max(found) + 1 if found else 0


def stack(spec: ArchSpec, states: Sequence[Mapping[str, Tensor]],
          blocks: Sequence[tuple[int, int]], first: int = 0, last: int = 0
          ) -> dict[str, Tensor]:
    """The state dict of a model whose block i is block `blocks[i][1]` of model
    `blocks[i][0]`, renamed to index i. The tensors outside the blocks come from model
    `first` where they come before the blocks in the module's order (embeddings) and from
    model `last` after them (final norm, head). The tensors are the inputs' own (not
    copied): never modify them."""
    names = list(states[first])
    inside = [block_of(spec, k) for k in names]
    start = next((i for i, b in enumerate(inside) if b is not None), len(names))
    out: dict[str, Tensor] = {}
    for k in names[:start]:
        out[k] = states[first][k]
    for j, (model, index) in enumerate(blocks):
        for k in states[model]:
            b = block_of(spec, k)
            if b is not None and b[1] == index:
                out[at_block(spec, k, j)] = states[model][k]
    for k, b in zip(names[start:], inside[start:], strict=True):
        if b is None:
            out[k] = states[last][k]
    return out


# ---- the config of a stacked model ---------------------------------------------------------

def config_depth(spec: ArchSpec, config: Mapping[str, Any]) -> int:
    """The depth a config names (0 where it names none)."""
    return int(config_value(config, spec.n_layers_key, 0) or 0)


def _per_layer(holder: Mapping[str, Any], n: int) -> dict[str, list]:
    """The config's per-layer lists: named for layers, one entry per block of `n`."""
    return {k: v for k, v in holder.items()
            if "layer" in k and isinstance(v, list) and len(v) == n}


def stacked_config(spec: ArchSpec, configs: Sequence[Mapping[str, Any]],
                   blocks: Sequence[tuple[int, int]], ends: int = 0) -> dict[str, Any]:
    """The config of the stacked model: model `ends`'s, its depth keys set to len(blocks)
    and its per-layer lists rebuilt from the models the blocks came from (block i from
    block `blocks[i][1]` of model `blocks[i][0]`)."""
    config = copy.deepcopy(dict(configs[ends]))
    old = [config_depth(spec, c) for c in configs]
    for holder in (config, config.get("model_args") or {}):
        for key in spec.n_layers_key:
            if key in holder and holder[key] is not None:
                holder[key] = len(blocks)
        for key in _per_layer(holder, old[ends]):
            if all(isinstance(c.get(key), list) and len(c[key]) == d
                   for c, d in zip(configs, old, strict=True)):
                holder[key] = [configs[m][key][i] for m, i in blocks]
    return config


def own_config(spec: ArchSpec, config: Mapping[str, Any], folder: Mapping[str, Any]
               ) -> dict[str, Any] | None:
    """`config` where a writer must write it in place of its folder's config.json `folder`:
    the two name other depths, or other per-layer lists (a stacked model; blocks reordered
    at one depth keep their own attention); None where the folder's describes the model."""
    n = config_depth(spec, config)
    if n != config_depth(spec, folder):
        return dict(config)
    for mine, theirs in ((config, folder),
                         (config.get("model_args") or {}, folder.get("model_args") or {})):
        lists = _per_layer(mine, n)
        if any(k in theirs and theirs[k] != v for k, v in lists.items()):
            return dict(config)
    return None


# ---- a model from blocks -------------------------------------------------------------------


def block_prefixes(model: Loaded) -> tuple[str, ...]:
    """The full prefix of each block of `model`, in order (`vit.encoder.layer.0.`, ...)."""
    from rotviz.symmetry.view import resolve_layout

    return resolve_layout(model.spec, model.state).blocks


def depth(model: Loaded) -> int:
    """The number of transformer blocks `model` holds."""
    return len(block_prefixes(model))


def block_state(model: Loaded, i: int) -> dict[str, Tensor]:
    """Block i's tensors, named relative to the block (shared with the model: never modify)."""
    prefix = block_prefixes(model)[i]
    return {k[len(prefix):]: v for k, v in model.state.items() if k.startswith(prefix)}


def outside_blocks(model: Loaded) -> dict[str, Tensor]:
    """The tensors outside every block: embeddings, final norm, head (shared: never modify)."""
    prefixes = block_prefixes(model)
    return {k: v for k, v in model.state.items() if not k.startswith(prefixes)}


def _module(template: Loaded, config: dict):
    """An empty module of `template`'s kind (plain torch where it is one, else its weight
    source's class) for `config`."""
    from rotviz.sources.adapters import source_of

    if type(template.model).__module__ == "rotviz.sources.plain_torch":
        from rotviz.sources.plain_torch import lite_module

        module = lite_module(config)
        if module is not None:
            return module
    return source_of(template.spec).build(config, template.spec)[0]


def stacked(template: Loaded, blocks: Sequence[Mapping[str, Tensor]], ref: str,
            outside: Mapping[str, Tensor] | None = None,
            origins: Sequence[int] | None = None) -> Loaded:
    """A new model of `len(blocks)` blocks: block i holds `blocks[i]` (names relative to a
    block, as `block_state` gives them), the tensors outside the blocks are `outside`
    (default the template's). It is of the template's class, dtype and device, and its
    config is its own (`stacked_config`): block i's per-layer settings are those of the
    template's block `origins[i]`, the block it was made from (default: block i, the last
    beyond the template's depth). Every tensor is a new copy, so neither the template nor
    the blocks given are shared with it. `ref` names it in reports."""
    prefixes = block_prefixes(template)
    if not prefixes:
        raise RotvizError(f"{template.ref}: no transformer blocks found")
    first = prefixes[0]
    if block_of(template.spec, first) is None:
        raise RotvizError(f"{template.ref}: blocks are not numbered as rotviz expects "
                          f"('{first}')")
    n = len(prefixes)
    if config_value(template.config, template.spec.n_layers_key) is None:
        raise RotvizError(f"the {template.spec.family} config names no depth "
                          f"({template.spec.n_layers_key[0]}): rotviz cannot build a model of "
                          "another depth from it")
    made_from = list(origins) if origins is not None else \
        [min(i, n - 1) for i in range(len(blocks))]
    if len(made_from) != len(blocks) or not all(0 <= o < n for o in made_from):
        raise RotvizError(f"{ref}: {len(blocks)} blocks need as many origins among the "
                          f"template's {n} blocks, got {made_from}")
    config = stacked_config(template.spec, [template.config], [(0, o) for o in made_from])
    state = dict(outside or outside_blocks(template))
    want = set(block_state(template, 0))
    for i, b in enumerate(blocks):
        if set(b) != want:
            raise RotvizError(f"block {i} of the stacked model holds other tensors than the "
                              f"template's blocks: {sorted(set(b) ^ want)[:3]}")
        prefix = at_block(template.spec, first, i)  # block i of the new model
        state.update({prefix + k: v for k, v in b.items()})
    return model_of(template, state, ref, config)


def model_of(template: Loaded, state: Mapping[str, Tensor], ref: str,
             config: Mapping[str, Any] | None = None) -> Loaded:
    """A new model of `template`'s kind, dtype and device holding `state` (full tensor
    names; copied in, so the inputs are left alone), of its own `config` (the template's
    where None): a model built from blocks (`stacked`, passthrough's merge), evaluated,
    checked and written as what transformers or timm would load. Each tensor is written
    back in the checkpoint dtype of the template's tensor of its kind (a block beyond the
    template's depth: that of its block 0)."""
    from rotviz.sources.loading import Loaded

    cfg = dict(template.config if config is None else config)
    held = next((v for v in template.state.values() if v.is_floating_point()),
                next(iter(template.state.values())))
    module = _module(template, cfg).to(device=held.device, dtype=held.dtype)
    missing, unexpected = module.load_state_dict(dict(state), strict=False)
    if unexpected or set(missing) - _tied_names(template):
        raise RotvizError(f"the model built from blocks does not fit its config: missing "
                          f"{sorted(set(missing) - _tied_names(template))[:3]}, unexpected "
                          f"{sorted(unexpected)[:3]}")
    if hasattr(module, "tie_weights"):
        module.tie_weights()
    elif hasattr(module, "tie"):
        module.tie()
    module.eval()
    module.requires_grad_(False)
    own = dict(module.state_dict())
    stored = {k: template.stored_dtypes[_as_block_0(template, k)] for k in own
              if _as_block_0(template, k) in template.stored_dtypes}
    return Loaded(ref, template.path, cfg, template.spec, module, own, stored)


def _as_block_0(template: Loaded, name: str) -> str:
    """A tensor name as the template's block 0 names it (a name outside the blocks: itself)."""
    return name if block_of(template.spec, name) is None else at_block(template.spec, name, 0)


def _tied_names(template: Loaded) -> set[str]:
    """Names the template's class ties to another tensor (absent from a state it loads)."""
    return {alias for alias, _ in template.spec.tied} | \
        set(getattr(template.model, "TIED", {}) or {})

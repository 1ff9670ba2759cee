"""A model of another depth built from blocks: a family's block tensors renamed between depths.

A transformer's blocks are numbered in its tensor names (`vit.encoder.layer.3.`); a model of
N blocks is a config saying N, the tensors outside the blocks (embeddings, final norm, head)
and one set of block tensors per block, each named relative to its block. `block_state`
reads one block in those relative names and `stacked` writes a list of them back as a new
model (`Loaded`) of the template's class, with the tensors outside the blocks taken from the
template. Depth merging (rotviz.analysis.depths) builds its collapsed and expanded models
here; a frankenmerge (layer ranges of several models) needs nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rotviz.arch.spec import config_value, with_depth
from rotviz.errors import RotvizError

if TYPE_CHECKING:
    import torch

    from rotviz.sources.loading import Loaded

    Tensor = torch.Tensor


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
            outside: Mapping[str, Tensor] | None = None) -> Loaded:
    """A new model of `len(blocks)` blocks: block i holds `blocks[i]` (names relative to a
    block, as `block_state` gives them), the tensors outside the blocks are `outside`
    (default the template's). It is of the template's class, config (its depth changed),
    dtype and device; every tensor is a new copy, so neither the template nor the blocks
    given are shared with it. `ref` names it in reports."""
    from rotviz.sources.loading import Loaded

    prefixes = block_prefixes(template)
    if not prefixes:
        raise RotvizError(f"{template.ref}: no transformer blocks found")
    first = prefixes[0]
    # the template's block prefix with its index replaced: block i of the new model
    head, _, tail = first.rpartition(".0.")
    if not head:
        raise RotvizError(f"{template.ref}: blocks are not numbered as rotviz expects "
                          f"('{first}')")
    config = with_depth(template.config, template.spec, len(blocks))
    state = {k: v.detach().clone() for k, v in (outside or outside_blocks(template)).items()}
    want = set(block_state(template, 0))
    for i, b in enumerate(blocks):
        if set(b) != want:
            raise RotvizError(f"block {i} of the stacked model holds other tensors than the "
                              f"template's blocks: {sorted(set(b) ^ want)[:3]}")
        state.update({f"{head}.{i}.{tail}{k}": v.detach().clone() for k, v in b.items()})
    module = _module(template, config)
    dtype = next(iter(template.state.values())).dtype
    device = next(iter(template.state.values())).device
    module = module.to(device=device, dtype=dtype)
    missing, unexpected = module.load_state_dict(state, strict=False)
    if unexpected or set(missing) - _tied_names(template):
        raise RotvizError(f"the stacked model's tensors do not fit its class: missing "
                          f"{sorted(set(missing))[:3]}, unexpected {sorted(unexpected)[:3]}")
    if hasattr(module, "tie_weights"):
        module.tie_weights()
    elif hasattr(module, "tie"):
        module.tie()
    module.eval()
    module.requires_grad_(False)
    # written back in the template's checkpoint dtype (none recorded: float32 as held)
    stored = {k: template.stored_dtype for k, v in module.state_dict().items()
              if v.is_floating_point()} if template.stored_dtypes else {}
    return Loaded(ref, template.path, config, template.spec, module,
                  dict(module.state_dict()), stored)


def _tied_names(template: Loaded) -> set[str]:
    """Names the template's class ties to another tensor (absent from a state it loads)."""
    return {alias for alias, _ in template.spec.tied} | \
        set(getattr(template.model, "TIED", {}) or {})


def keep_depth(model: Loaded, folder: Path) -> None:
    """The config.json just written into `folder` for `model` says the model's own depth:
    writers re-read the checkpoint's config (transformers' own files), which for a model
    stacked here from a template of another depth names the template's."""
    import json

    f = Path(folder) / "config.json"
    n = config_value(model.config, model.spec.n_layers_key)
    if n is None or not f.is_file():
        return
    written = json.loads(f.read_text())
    if config_value(written, model.spec.n_layers_key) != n:
        f.write_text(json.dumps(with_depth(written, model.spec, n), indent=2, sort_keys=True)
                     + "\n")

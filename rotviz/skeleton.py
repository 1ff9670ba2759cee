"""Running a model whose blocks are loaded only while they run.

A streamed match (rotviz.match.streaming) must still prove that it preserved the function,
on a model that may not fit in memory. The module is built with its parameters on the meta
device (no memory; buffers such as rotary frequencies are computed as usual), everything
outside the blocks is loaded from the checkpoint, and each block gets its parameters from a
provider just before it runs and gives them back just after, through forward hooks. Nothing
here knows a family: the block prefixes of the family's `ArchSpec` name the modules, and the
source adapter (rotviz.sources) builds and calls the module as for a loaded model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from rotviz.arch import ArchSpec
from rotviz.errors import RotvizError
from rotviz.sources import call, source_of

Tensor = torch.Tensor

# provider(block number) -> that block's tensors under their full names
Provider = Callable[[int], Mapping[str, Tensor]]


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device: shapes and dtypes, no
    memory, no initialisation cost. Buffers are made as usual (they are small and some, like
    rotary frequencies, are computed, not loaded)."""
    register = nn.Module.register_parameter

    def on_meta(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.data.to("meta"), requires_grad=param.requires_grad)
        register(self, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def build_meta(spec: ArchSpec, config: dict, dtype: torch.dtype = torch.float32
               ) -> tuple[nn.Module, dict]:
    """The module of `config` with parameters on meta, and the full config; built as the
    source's loader builds a checkpoint stored in `dtype`, its floating buffers then float32
    (as rotviz holds a loaded model)."""
    source = source_of(spec)
    with parameters_on_meta(), source.build_dtype(dtype):
        module, full = source.build(config, spec)
    for name, t in list(module.named_buffers()):
        if t.is_floating_point() and t.dtype != torch.float32:
            _set(module, name, t.to(torch.float32))
    module.eval()
    module.requires_grad_(False)
    return module, full


def _set(module: nn.Module, name: str, value: Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    sub = module.get_submodule(owner) if owner else module
    if leaf in sub._parameters:
        sub._parameters[leaf] = value if isinstance(value, nn.Parameter) else nn.Parameter(
            value, requires_grad=False)
    else:
        sub._buffers[leaf] = value


def _params(module: nn.Module) -> dict[str, Tensor]:
    """Parameters and persistent buffers by full name (what a checkpoint holds)."""
    return dict(module.state_dict(keep_vars=True))


class BlockStreamed:
    """A module whose block parameters come from a provider while each block runs.

    Tensors are named as in the checkpoint: `names` maps those names to the module's (the
    source's loader may rename). `rest` gives the tensors outside the blocks; with `tie`, an
    output head the checkpoint leaves out takes the embedding it is tied to. `prefixes`
    are the module's block prefixes. Construct, then `logits(inputs)`."""

    def __init__(self, module: nn.Module, spec: ArchSpec, prefixes: tuple[str, ...],
                 rest: Mapping[str, Tensor], provider: Provider, names: Mapping[str, str],
                 tie: bool = True) -> None:
        self.module, self.spec = module, spec
        self.provider, self.names = provider, names
        params = _params(module)
        rest = {names[n]: t for n, t in rest.items() if n in names}
        inside = {n for n in params if any(n.startswith(p) for p in prefixes)}
        missing = []
        for n, t in params.items():
            if n in rest and not (n in inside and t.device.type == "meta"):
                _set(module, n, rest[n].detach())  # block parameters wait for their block
            elif n not in inside and t.device.type == "meta":
                missing.append(n)
        ties = dict(spec.tied)
        hf_ties = getattr(module, "_tied_weights_keys", None)
        if isinstance(hf_ties, dict):
            ties.update(hf_ties)
        params = _params(module)
        for alias in list(missing):
            owner = params.get(ties.get(alias, ""))
            if tie and owner is not None and owner.device.type != "meta":
                _set(module, alias, owner)
                missing.remove(alias)
        if missing:
            raise RotvizError(f"the checkpoint lacks {missing[:3]}, which the model needs; "
                              "re-save the model with save_pretrained")
        self.inside_rest = {n: t for n, t in rest.items() if n in inside}
        self.metas: list[dict[str, Tensor]] = []
        self.hooks: list = []
        for k, prefix in enumerate(prefixes):
            block = module.get_submodule(prefix.rstrip("."))
            self.metas.append({n: t for n, t in _params(block).items()
                               if t.device.type == "meta"})
            self.hooks.append(block.register_forward_pre_hook(self._loader(k, block, prefix)))
            self.hooks.append(block.register_forward_hook(self._unloader(k, block)))

    def _loader(self, k: int, block: nn.Module, prefix: str):
        def hook(_module, _args):
            given = {self.names[n]: t for n, t in self.provider(k).items()}
            given.update(self.inside_rest)
            local = {n[len(prefix):]: t for n, t in given.items() if n.startswith(prefix)}
            lacking = [n for n in self.metas[k] if n not in local]
            if lacking:
                raise RotvizError(f"block {prefix.rstrip('.')} lacks {lacking[:3]} in the "
                                  "checkpoint; re-save the model with save_pretrained")
            for n, t in local.items():
                if n in self.metas[k]:
                    _set(block, n, t.detach())
        return hook
    def _unloader(self, k: int, block: nn.Module):
        def hook(_module, _args, _output):
            for n, t in self.metas[k].items():
                _set(block, n, t)
        return hook

    def close(self) -> None:
        """Drop the hooks (they hold this object: a cycle the collector would free late) and
        the tensors outside the blocks."""
        for h in self.hooks:
            h.remove()
        self.hooks.clear()
        self.module = self.inside_rest = None  # type: ignore[assignment]

    def logits(self, inputs: Mapping[str, Tensor]) -> Tensor:
        with torch.no_grad():
            return call(self.spec, self.module, None, inputs)

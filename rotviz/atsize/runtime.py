"""Running a model whose blocks are loaded only while they run.

A match at size (rotviz.match.at_size) must still prove that it preserved the function,
on a model that may not fit in memory. The module is built with its parameters on the meta
device (no memory; buffers such as rotary frequencies are computed as usual), everything
outside the blocks is loaded from the checkpoint, and each block gets its parameters from a
provider just before it runs and gives them back just after, through forward hooks. Nothing
here knows a family: the block prefixes of the family's `ArchSpec` name the modules, and the
source adapter (rotviz.sources) builds and calls the module as for a loaded model.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from rotviz.arch import ArchSpec
from rotviz.errors import RotvizError
from rotviz.sources.adapters import call, source_of
from rotviz.sources.legacy import read_past

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

    # The models' weight initialisation (transformers' post_init) draws random numbers into
    # every parameter; on meta tensors torch runs each draw through its Python reference
    # kernels, a quarter of a small streamed match's CPU time, for tensors that hold no values.
    # Skipped on meta tensors only; real ones (buffers) are initialised as before.
    # (a torch without one of these private helpers initialises as it does)
    inits = {name: getattr(nn.init, name) for name in _INITS if hasattr(nn.init, name)}

    def skipping(name: str) -> Callable:
        def init(tensor: Tensor, *args, **kwargs) -> Tensor:
            return tensor if tensor.is_meta else inits[name](tensor, *args, **kwargs)
        return init

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    for name in inits:
        setattr(nn.init, name, skipping(name))
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]
        for name, f in inits.items():
            setattr(nn.init, name, f)


# torch.nn.init's helpers behind its public functions, looked up when those are called
_INITS = ("_no_grad_normal_", "_no_grad_uniform_", "_no_grad_trunc_normal_")


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


# Tensors outside the blocks with at least this many elements (a 32k x 512 embedding and up)
# are loaded only while their module runs, like blocks: in float32 a LLaMA-1B's embedding and
# output head are 1 GB each.
LARGE = 1 << 24

# rest(names) -> those checkpoint tensors, read now
Reader = Callable[[list[str]], Mapping[str, Tensor]]


class BlockStreamed:
    """A module whose block parameters come from a provider while each block runs, and whose
    large tensors outside the blocks (embeddings, output heads) are read while their module
    runs (with `stream_rest`).

    Tensors are named as in the checkpoint: `names` maps those names to the module's (the
    source's loader may rename). `rest` reads the tensors outside the blocks; with `tie`, an
    output head the checkpoint leaves out takes the embedding it is tied to. `prefixes`
    are the module's block prefixes. Construct, then `logits(inputs)`; `close()` after."""

    def __init__(self, module: nn.Module, spec: ArchSpec, prefixes: tuple[str, ...],
                 rest: Reader, rest_names: Mapping[str, int], provider: Provider,
                 names: Mapping[str, str], tie: bool = True, stream_rest: bool = True) -> None:
        self.module, self.spec = module, spec
        self.provider, self.names, self.rest = provider, names, rest
        params = _params(module)
        source_of_name = {names[n]: n for n in rest_names if n in names}  # module -> file
        inside = {n for n in params if any(n.startswith(p) for p in prefixes)}
        ties = dict(spec.tied)
        hf_ties = getattr(module, "_tied_weights_keys", None)
        if isinstance(hf_ties, dict):
            ties.update(hf_ties)
        eager: dict[str, str] = {}  # module name -> file name, loaded now
        lazy: dict[str, dict[str, str]] = {}  # module path -> {local name: file name}
        missing = []
        for n, t in params.items():
            if n in inside and t.device.type == "meta":
                continue  # block parameters wait for their block
            file = source_of_name.get(n)
            if file is None and tie and n in ties and n not in inside:
                file = source_of_name.get(ties[n])  # a tied head reads its embedding
            if file is None:
                if t.device.type == "meta":
                    missing.append(n)
                continue
            owner, _, leaf = n.rpartition(".")
            if stream_rest and isinstance(t, nn.Parameter) and rest_names[file] >= LARGE \
                    and owner and n not in inside:
                lazy.setdefault(owner, {})[leaf] = file
            else:
                eager[n] = file
        if missing:
            raise RotvizError(f"the checkpoint lacks {missing[:3]}, which the model needs; "
                              "re-save the model with save_pretrained")
        got = rest(sorted(set(eager.values())))
        for n, file in eager.items():
            _set(module, n, got[file].detach())
        self.inside_rest = {n: got[f] for n, f in eager.items() if n in inside}
        del got
        self.hooks: list = []
        self.metas: list[dict[str, Tensor]] = []
        for k, prefix in enumerate(prefixes):
            block = module.get_submodule(prefix.rstrip("."))
            self.metas.append({n: t for n, t in _params(block).items()
                               if t.device.type == "meta"})
            self.hooks.append(block.register_forward_pre_hook(self._loader(k, block, prefix)))
            self.hooks.append(block.register_forward_hook(self._unloader(self.metas[k], block)))
        for path, files in lazy.items():
            sub = module.get_submodule(path)
            metas = {leaf: sub._parameters[leaf] for leaf in files}
            self.hooks.append(sub.register_forward_pre_hook(self._rest_loader(sub, files)))
            self.hooks.append(sub.register_forward_hook(self._unloader(metas, sub)))

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

    def _rest_loader(self, sub: nn.Module, files: Mapping[str, str]):
        def hook(_module, _args):
            got = self.rest(sorted(set(files.values())))
            for leaf, file in files.items():
                _set(sub, leaf, got[file].detach())
        return hook

    def _unloader(self, metas: Mapping[str, Tensor], sub: nn.Module):
        def hook(_module, _args, _output):
            for n, t in metas.items():
                _set(sub, n, t)
        return hook

    def close(self) -> None:
        """Drop the hooks (they hold this object: a cycle the collector would free late) and
        the tensors held for the run."""
        for h in self.hooks:
            h.remove()
        self.hooks.clear()
        self.module = self.inside_rest = None  # type: ignore[assignment]

    def logits(self, inputs: Mapping[str, Tensor]) -> Tensor:
        """Every output of the module side by side (rotviz.heads.side_by_side): this runner
        serves the function check."""
        with torch.no_grad():
            return call(self.spec, self.module, None, inputs, every=True)


def checked_meta(spec: ArchSpec, config: dict, where) -> tuple[nn.Module, dict]:
    """`build_meta`'s module and full config of the model folder `where`, or one line saying
    its config.json is refused (a class the config names that cannot be built)."""
    from pathlib import Path

    try:
        return build_meta(spec, config)
    except RotvizError as e:
        raise RotvizError(f"'{Path(where) / 'config.json'}' is refused: {e}") from None


# The fit checks passed in this process, by all that decides them: the family, the config and
# the checkpoint's tensor names and shapes. The check is a pure function of these, and each one
# builds the module on meta (a third of a small model's load); the app, the gallery and a run of
# many records load the same folders again and again. A memo, not state: a folder whose
# config or headers change has another key and is checked again. Bounded, and locked for the
# app's threads.
_FITTED: OrderedDict[tuple, None] = OrderedDict()
_FITTED_MAX = 256
_FITTED_LOCK = threading.Lock()


def _fit_key(spec: ArchSpec, config: dict, meta: Mapping[str, Tensor]) -> tuple:
    return (spec, json.dumps(config, sort_keys=True, default=repr),
            tuple(sorted((n, tuple(t.shape)) for n, t in meta.items())))


def check_fits(spec: ArchSpec, config: dict, meta: Mapping[str, Tensor], where,
               built: tuple[nn.Module, dict] | None = None) -> None:
    """One line (sources.files.fit_error) where the checkpoint's tensors `meta` (names,
    shapes, from its headers) do not fit the module `config` builds: tensors the module needs
    and the checkpoint lacks, tensors it does not have, tensors of the wrong shape. The
    module is built on meta (nothing allocated), so a config whose `architectures` names a
    class the weights do not fit is refused before a real module is built; the paths at size
    and in memory both ask here. Old-format buffers the module's class reads past
    (rotviz.sources.legacy) are not unexpected. A checkpoint whose names the loader converts (split,
    merged) cannot be compared name by name: the loader's own check decides there. `built`:
    `checked_meta`'s module and config where the caller has built them already (a module
    built on meta takes a second or more at a real vocabulary: once per opening is enough).
    A check passed once in this process is not made again (_FITTED)."""
    key = _fit_key(spec, config, meta)
    with _FITTED_LOCK:
        if key in _FITTED:
            _FITTED.move_to_end(key)
            return
    _check_fits(spec, config, meta, where, built)
    with _FITTED_LOCK:
        _FITTED[key] = None
        while len(_FITTED) > _FITTED_MAX:
            _FITTED.popitem(last=False)


def _check_fits(spec: ArchSpec, config: dict, meta: Mapping[str, Tensor], where,
                built: tuple[nn.Module, dict] | None) -> None:
    import re

    from rotviz.sources.files import fit_error

    module, _ = built if built is not None else checked_meta(spec, config, where)
    try:
        names = source_of(spec).checkpoint_names(module, list(meta))
    except RotvizError:
        return
    given = {names[n]: t for n, t in meta.items()}
    own = module.state_dict()
    past = read_past(module, spec, config, {n: tuple(t.shape) for n, t in given.items()})
    ignore_missing = [re.compile(p) for p in
                      getattr(module, "_keys_to_ignore_on_load_missing", None) or []]
    ties = dict(spec.tied)
    hf_ties = getattr(module, "_tied_weights_keys", None)
    if isinstance(hf_ties, dict):
        ties.update(hf_ties)
    tie = config.get("tie_word_embeddings", True) is not False
    missing = [n for n, _ in module.named_parameters() if n not in given
               and not any(p.search(n) for p in ignore_missing)
               and not (tie and ties.get(n) in given)]
    unexpected = [n for n in given if n not in own and n not in past]
    mismatched = [n for n, t in given.items()
                  if n in own and tuple(own[n].shape) != tuple(t.shape)]
    fit_error(where, missing, unexpected, [])
    if mismatched:  # worded as the in-memory loader has always said it
        raise RotvizError(f"cannot read the weights in '{where}' (a tensor's shape differs from "
                          f"what config.json describes: {mismatched[:3]}); the file is corrupt "
                          "or does not fit config.json")


def legacy_tensors(spec: ArchSpec, config: dict, module: nn.Module,
                   meta: Mapping[str, Tensor]) -> frozenset[str]:
    """The checkpoint's tensors (`meta`: names and shapes from its headers) that `module`, built
    from `config`, reads past (rotviz.sources.legacy.read_past), under the checkpoint's own names:
    what a run at size neither reads nor writes. The source's one line (RotvizError) where its
    loader converts the checkpoint's names, which cannot be compared name by name."""
    names = source_of(spec).checkpoint_names(module, list(meta))
    past = read_past(module, spec, config, {names[n]: tuple(t.shape) for n, t in meta.items()})
    return frozenset(n for n in meta if names[n] in past)

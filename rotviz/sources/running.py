"""Running a loaded model: probe inputs, a module that attends the way the checkpoint's
positions need, a twin for threads that run side by side, the forward pass with a parameter
set of the caller's, and the output differences the function checks report (in float32 and in
the stored dtype).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace

import torch
from torch import nn

from rotviz.devices import SHORT_ATTENTION
from rotviz.sources.adapters import call, source_of
from rotviz.sources.loading import Loaded

Tensor = torch.Tensor



def probe_inputs(loaded: Loaded, n: int = 4, seed: int = 0) -> dict[str, Tensor]:
    """Random but seeded inputs of the model's kind, for function checks."""
    spec = loaded.spec
    return source_of(spec).probe_inputs(spec, loaded.config, loaded.model, n, seed)


def image_shape(loaded: Loaded) -> tuple[int, int]:
    """(channels, size) of the square images an image model takes."""
    return source_of(loaded.spec).image_shape(loaded.model, loaded.config)


def attention_positions(config: Mapping, inputs: Tensor | Mapping[str, Tensor]) -> int | None:
    """How many positions a model of `config` attends over on `inputs`: the token windows'
    length, or an image model's patches plus its class token; None when the config does
    not say."""
    x = inputs.get("input_ids", inputs.get("pixel_values")) if isinstance(inputs, Mapping) \
        else inputs
    if x is not None and x.dim() == 2:
        return int(x.shape[1])
    size, patch = config.get("image_size"), config.get("patch_size")
    if isinstance(size, int) and isinstance(patch, int) and patch > 0:
        return (size // patch) ** 2 + 1
    return None


def attends_unfused(module: nn.Module, positions: int | None, device: torch.device) -> bool:
    """Whether `module` should attend unfused: a transformers model using torch's fused
    kernel, on the CPU, over at most SHORT_ATTENTION positions (rotviz.devices)."""
    config = getattr(module, "config", None)
    return (device.type == "cpu" and positions is not None and positions <= SHORT_ATTENTION
            and getattr(config, "_attn_implementation", None) == "sdpa"
            and hasattr(module, "set_attn_implementation")
            # classes that pick their attention themselves (Falcon) only warn when asked
            and getattr(module, "_can_set_attn_implementation", lambda: True)())


def module_copy(module: nn.Module) -> nn.Module:
    """A copy of `module`'s structure and config that shares every parameter and buffer
    with it: functional calls and hooks change a module's attributes while they run, so a
    thread, or another attention implementation, gets a copy of its own."""
    memo = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, memo)


def twin(loaded: Loaded) -> Loaded:
    """`loaded` on a module of its own (`module_copy`: `state` still shares storage with
    it), with nothing derived yet. For a thread of its own: two threads must never run one
    module at once."""
    return replace(loaded, model=module_copy(loaded.model), derived={})


def attending_module(loaded: Loaded, positions: int | None, device: torch.device) -> nn.Module:
    """The module `loaded`'s parameter sets run on: the model's own, or, for sequences of at
    most SHORT_ATTENTION positions on the CPU (rotviz.devices), a twin of it that attends
    unfused. The twin copies the module's structure and config only: it shares every tensor
    with the model, whose config is left as it is (a cached model is never modified). It is
    made once per model and kept in `loaded.derived` (a copy costs 15 to 40 ms)."""
    module = loaded.model
    if not attends_unfused(module, positions, device):
        return module
    made = loaded.derived.get(id(module))
    if made is not None and made[0] is module:
        return made[1]
    twin = module_copy(module)
    try:
        twin.set_attn_implementation("eager")
    except (ValueError, AttributeError, NotImplementedError):
        return module
    loaded.derived[id(module)] = (module, twin)
    return twin


def forward(
    loaded: Loaded, inputs: Mapping[str, Tensor], state: Mapping[str, Tensor] | None = None,
    every: bool = False,
) -> Tensor:
    """Logits of the model, or of `state` evaluated on the model's module (not modified);
    with `every`, all the model's outputs side by side (rotviz.heads.side_by_side: every
    head of a pre-training model, a headless model's hidden states and pooler), as the
    function check compares them."""
    from rotviz.data.inputs import to_device

    first = next(loaded.model.parameters())
    device = first.device
    model = attending_module(loaded, attention_positions(loaded.config, inputs), device)
    inputs = to_device(dict(inputs), device, first.dtype)  # images in the module's dtype
    with torch.no_grad():
        if state is not None:
            keep = set(dict(model.named_parameters())) | set(dict(model.named_buffers()))
            state = {k: v.to(device) for k, v in state.items() if k in keep}  # tied: owner only
        return call(loaded.spec, model, state, inputs, every=every)


def max_output_diff(
    loaded: Loaded,
    state_a: Mapping[str, Tensor],
    state_b: Mapping[str, Tensor],
    n: int = 4,
    seed: int = 0,
) -> float:
    """The largest absolute difference between two parameter sets' outputs (every output:
    each head's logits, or a headless model's hidden states) on probe inputs."""
    x = probe_inputs(loaded, n, seed)
    ya, yb = forward(loaded, x, state_a, every=True), forward(loaded, x, state_b, every=True)
    return float((ya.double() - yb.double()).abs().max())


def stored_state(loaded: Loaded, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """`state` with each tensor in the checkpoint's dtype of `loaded` (new tensors where cast)."""
    dtypes = loaded.stored_dtypes
    return {k: v.to(dtypes.get(k, v.dtype)) for k, v in state.items()}


def stored_module(loaded: Loaded) -> nn.Module:
    """A copy of `loaded.model` holding each checkpoint tensor in its stored dtype, as the
    checkpoint runs natively; `loaded.model` (shared) is not touched. Each tensor is cast
    straight into the copy, so no second float32 model is made; non-persistent buffers (RoPE
    frequencies) are copied as they are, as transformers keeps them float32 too."""
    dtypes = loaded.stored_dtypes
    memo: dict[int, object] = {}
    for name, t in [*loaded.model.named_parameters(), *loaded.model.named_buffers()]:
        if name in dtypes and t.dtype != dtypes[name]:
            cast = t.detach().to(dtypes[name])
            memo[id(t)] = nn.Parameter(cast, requires_grad=False) \
                if isinstance(t, nn.Parameter) else cast
    return copy.deepcopy(loaded.model, memo)


def stored_output_diff(
    loaded: Loaded, state: Mapping[str, Tensor], n: int = 4, seed: int = 0
) -> tuple[float, float]:
    """The largest absolute logit difference between `loaded` and `state`, both held and run
    in the checkpoint's dtypes (as they are stored), on probe inputs; and the largest |logit|
    of `loaded` there, the scale that difference is judged against. Not finite (inf) where a
    model's logits overflow."""
    module = stored_module(loaded)
    view = replace(loaded, model=module)
    dtype = loaded.stored_dtype
    x = {k: v.to(dtype) if v.is_floating_point() else v
         for k, v in probe_inputs(loaded, n, seed).items()}
    return logit_change(forward(view, x, every=True),
                        forward(view, x, stored_state(loaded, state), every=True))


def logit_change(ya: Tensor, yb: Tensor) -> tuple[float, float]:
    """The largest |yb - ya| and the largest |ya|, the scale it is judged against; either is
    inf where its logits are not all finite (a model that overflows in a half dtype)."""
    ya, yb = ya.double(), yb.double()
    inf = float("inf")
    scale = float(ya.abs().max()) if bool(torch.isfinite(ya).all()) else inf
    diff = float((ya - yb).abs().max()) if bool(torch.isfinite(yb).all()) else inf
    return diff, scale

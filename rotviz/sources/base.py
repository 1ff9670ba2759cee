"""What every weight source's adapter does (rotviz.sources): build a module from a config,
load one from a folder, write one, and call a module with given parameters on inputs.

An adapter knows the library a checkpoint comes from (transformers, timm); the family's
`ArchSpec` (rotviz.arch) knows where the tensors sit and how configs name the family.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from rotviz.arch.spec import ArchSpec, max_positions
from rotviz.confine import ANYWHERE, Confined

Tensor = torch.Tensor
# torch.func's functional_call swaps a module's parameters while it runs, so two threads must
# never run one module with parameter sets at once (the app's sessions share cached models:
# interleaved, each would compute with a mix of both sets). One lock per module, dropped with
# it; a thread that needs points side by side runs on a twin (Evaluator.evaluate_each).
_RUNNING: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_RUNNING_GUARD = threading.Lock()


def running_lock(module: nn.Module) -> threading.RLock:
    """The lock held while `module` runs with a parameter set of a caller's."""
    with _RUNNING_GUARD:
        lock = _RUNNING.get(module)
        if lock is None:
            lock = _RUNNING[module] = threading.RLock()
        return lock


def one_by_one(module: nn.Module, inputs: Mapping[str, Tensor]) -> bool:
    """Whether `module` must be run one example at a time on `inputs`: a decoder's sequence
    classifier (GPT-2's, LLaMA's, ...) finds each text's last token by its padding token, and
    transformers refuses a batch of more than one where the config names none. Unpadded
    inputs (the function check's probes) have no padding, so each row run alone gives what it
    would in a batch."""
    config = getattr(module, "config", None)
    x = next(iter(inputs.values()), None)
    return (x is not None and x.dim() >= 2 and x.shape[0] > 1 and config is not None
            and getattr(config, "pad_token_id", 0) is None
            and type(module).__name__.endswith("ForSequenceClassification"))


class Source:
    """The adapter of one weight source. Stateless: one shared instance per source."""

    name: str = ""

    # ---- building and loading --------------------------------------------------------------

    def build(self, config: dict, spec: ArchSpec, instantiate: bool = True) -> tuple:
        """A randomly initialised module of the config (or, where the source loads through a
        class, with `instantiate=False` that class) and the full config as a dict."""
        raise NotImplementedError

    def load(self, path: Path, config: dict, spec: ArchSpec, confined: Confined = ANYWHERE
             ) -> tuple[nn.Module, dict, dict[str, torch.dtype]]:
        """The module in `path`, its full config and the dtype of each floating tensor in the
        checkpoint, every file opened through `confined`. One-line errors for weights that
        do not fit. Called on a folder models.check_weights has validated."""
        raise NotImplementedError

    def build_dtype(self, dtype: torch.dtype):
        """A context in which `build` makes the module as `load` would for a checkpoint stored
        in `dtype` (buffers computed at build time then round the same way)."""
        from contextlib import nullcontext

        return nullcontext()

    def checkpoint_names(self, module: nn.Module, names: list[str]) -> dict[str, str]:
        """Checkpoint tensor name -> the module's name for it (where `load` renames)."""
        return {n: n for n in names}

    # ---- writing ----------------------------------------------------------------------------

    def save_module(self, module: nn.Module, config: dict, folder: Path) -> None:
        """`module` (of `config`) as a checkpoint folder, into the (empty) `folder`."""
        raise NotImplementedError

    def write_state(self, spec: ArchSpec, path: Path, config: dict,
                    state: Mapping[str, Tensor], folder: Path, own: dict | None = None) -> None:
        """`state` (CPU tensors in their final dtypes) as a checkpoint of the model loaded
        from `path` (full config `config`), into the (empty) `folder`; with `own`, a model of
        that config instead: a stacked model's own, which describes other blocks than
        `path`'s (rotviz.sources.stacking.own_config, as rotviz.sources.writing finds it)."""
        raise NotImplementedError

    # ---- running ----------------------------------------------------------------------------

    def arguments(self, spec: ArchSpec, inputs: Mapping[str, Tensor]) -> tuple[tuple, dict]:
        """Positional and keyword arguments of the module's forward for `inputs`."""
        raise NotImplementedError

    def call(self, spec: ArchSpec, module: nn.Module, params: Mapping[str, Tensor] | None,
             inputs: Tensor | Mapping[str, Tensor], strict: bool = False,
             every: bool = False) -> Tensor:
        """The logits of `module` run with the parameter set `params` (torch.func's
        functional_call; None: the module's own) on `inputs` (a mapping of named inputs, or
        one tensor: the spec's `input_key`): the output a loss is computed on
        (rotviz.heads.primary), or with `every` all its outputs side by side, one row per
        example (rotviz.heads.side_by_side: what the function check compares). The module is
        not modified; gradients flow as the caller's context allows."""
        from torch.func import functional_call

        from rotviz.heads import outputs_of, primary, side_by_side

        if isinstance(inputs, Tensor):
            inputs = {spec.input_key: inputs}
        if one_by_one(module, inputs):  # a decoder's classifier with no padding token
            rows = [self.call(spec, module, params, {k: v[i:i + 1] for k, v in inputs.items()},
                              strict, every) for i in range(len(next(iter(inputs.values()))))]
            return torch.cat(rows)
        args, kwargs = self.arguments(spec, inputs)
        with running_lock(module):  # its own weights too: another thread may have swapped them
            if params is None:
                out = module(*args, **kwargs)
            else:
                out = functional_call(module, params, args, kwargs, strict=strict)
        if isinstance(out, Tensor):
            return out
        outputs = outputs_of(out)
        return side_by_side(outputs) if every else primary(outputs)

    def image_shape(self, module: nn.Module, config: Mapping) -> tuple[int, int]:
        """(channels, size) of the square images an image model takes."""
        raise NotImplementedError

    def n_outputs(self, config: Mapping) -> int | None:
        """Outputs of a classifier's head, None if the config does not say."""
        raise NotImplementedError

    def probe_inputs(self, spec: ArchSpec, config: Mapping, module: nn.Module, n: int = 4,
                     seed: int = 0) -> dict[str, Tensor]:
        """Random but seeded inputs of the model's kind, for function checks: up to 16 tokens
        (as many as the positions allow), or images of the model's shape."""
        from rotviz.heads import choices

        gen = torch.Generator().manual_seed(seed)
        if spec.inputs == "tokens":
            vocab = int(config.get("vocab_size", 100))
            length = max(2, min(16, max_positions(spec, config, 32)))
            shape = (n, choices(config), length) if choices(config) else (n, length)
            return {"input_ids": torch.randint(0, vocab, shape, generator=gen)}
        c, size = self.image_shape(module, config)
        return {"pixel_values": torch.randn(n, c, size, size, generator=gen)}

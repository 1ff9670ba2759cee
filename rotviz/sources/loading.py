"""Loading models, safely and offline: a model reference resolved, its config and weights
checked, and the module built by its source's adapter.

A model reference is a directory in Hugging Face `save_pretrained` format (config.json plus
safetensors, or a pickled `pytorch_model.bin` loaded with `weights_only=True`), `zoo:NAME`, or
`ORG/NAME[@REVISION]`, a model already in the local Hugging Face cache
(rotviz.sources.hf_cache). timm models use the same layout: a config.json with `architecture`
(and `model_args`). What differs between those sources is in their adapters
(rotviz.sources.adapters). Remote code is never run and nothing is downloaded. Writing a model
back: rotviz.sources.writing; pairs of models: rotviz.sources.pairs; running one:
rotviz.sources.running.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from rotviz import zoo_registry as zoo
from rotviz.arch import ArchSpec, spec_for
from rotviz.atsize.runtime import check_fits
from rotviz.confine import ANYWHERE, Confined
from rotviz.devices import wide_device
from rotviz.errors import RotvizError
from rotviz.sources import hf_cache as hub
from rotviz.sources.adapters import source_of
from rotviz.sources.checkpoint import INDEX, SINGLE, Checkpoint
from rotviz.sources.configs import check_against, check_sizes

Tensor = torch.Tensor

HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Loaded:
    """A model as rotviz holds it. `state` shares storage with `model`: never modify either.

    `state` is float32 (or an explicitly asked dtype) even when the checkpoint stores half
    precision: `stored_dtypes` keeps each floating tensor's dtype in the checkpoint (empty:
    all float32), so that outputs can be written back in it."""

    ref: str
    path: Path
    config: dict
    spec: ArchSpec
    model: nn.Module
    state: dict[str, Tensor]
    stored_dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    # modules derived from `model` and sharing its tensors (attending_module's unfused twin),
    # by the model's id, each kept beside the model it was made from
    derived: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.ref

    @property
    def stored_dtype(self) -> torch.dtype:
        """The checkpoint's dtype: the floating dtype holding most parameters."""
        return dominant_dtype((dt, self.state[k].numel() if k in self.state else 0)
                              for k, dt in self.stored_dtypes.items())


def dominant_dtype(counts: Iterable[tuple[torch.dtype, int]]) -> torch.dtype:
    """The dtype holding most elements among (floating dtype, element count) pairs; float32
    when there are none."""
    total: dict[torch.dtype, int] = {}
    for dt, n in counts:
        total[dt] = total.get(dt, 0) + n
    return max(total, key=total.__getitem__) if total else torch.float32


def to_wide(t: Tensor) -> Tensor:
    """`t` in float64: on its own device, or on the CPU when it lives on MPS (a new tensor
    unless it already is one)."""
    return t.to(device=wide_device(t.device), dtype=torch.float64)


def resolve_ref(ref: str | os.PathLike, confined: Confined = ANYWHERE) -> Path:
    """A directory for a model reference, inside `confined`'s roots: `zoo:NAME`, a folder,
    or a model of the local Hugging Face cache, `ORG/NAME[@REVISION]` (rotviz.sources.hf_cache: its
    snapshot folder, never downloaded; an existing folder of that path wins)."""
    ref = str(ref)
    if ref.startswith("zoo:"):
        return zoo.path_of(ref[4:])
    name = hub.cache_ref(ref)
    if name is not None:
        return hub.locate(name, confined)
    path = Path(ref).expanduser()
    if not path.is_dir():
        raise RotvizError(
            f"no model directory at '{ref}': give a save_pretrained folder, zoo:NAME or a "
            "model of the local Hugging Face cache, ORG/NAME[@REVISION]"
        )
    confined.folder(path, "model folder")
    return path


def read_config(path: Path, confined: Confined = ANYWHERE) -> dict:
    """config.json of the model folder `path`, read through `confined` and checked
    (rotviz.sources.configs.check_sizes: a JSON object whose sizes are bounded integers)."""
    cfg_file = path / "config.json"
    if not os.path.lexists(cfg_file):
        raise RotvizError(
            f"no model in '{path}': expected config.json and model.safetensors "
            "(Hugging Face save_pretrained format)"
        )
    return check_sizes(confined.read_json(cfg_file, "re-save the model", "config"), cfg_file)


def check_weights(path: Path, config: dict, spec: ArchSpec, confined: Confined = ANYWHERE,
                  streamed: bool = False, fits: bool = True) -> Checkpoint | None:
    """The checks both paths make before a module is built: the checkpoint read and
    validated (rotviz.sources.checkpoint: safetensors headers and index; a pickled checkpoint read
    with weights_only=True), then the config compared with its tensor shapes (sizes,
    blocks, tables: rotviz.sources.configs.check_against; every tensor: rotviz.atsize.runtime
    .check_fits; left to the caller with `fits=False`, as the lite loader compares every
    tensor with its own module and must not import transformers). Returns the safetensors
    checkpoint (None for a pickled one). `streamed` folders must be safetensors."""
    from rotviz.heads import check_head
    from rotviz.sources.files import read_weights

    check_head(config, path)
    if streamed or os.path.lexists(path / SINGLE) or os.path.lexists(path / INDEX):
        checkpoint: Checkpoint | None = Checkpoint(path, confined)
        meta = checkpoint.meta_state()
    else:
        checkpoint = None
        meta = {k: t.to("meta") for k, t in read_weights(path, confined).items()}
    check_against(spec, config, meta, path / "config.json")
    if fits:
        check_fits(spec, config, meta, path)
    return checkpoint


def load_model(ref: str | os.PathLike, dtype: torch.dtype | None = None,
               confined: Confined = ANYWHERE) -> Loaded:
    """Load a model on the CPU, checking that it is supported, complete and finite. Every
    file is read through `confined`, and the checkpoint and config are validated
    (check_weights) before transformers or timm is handed the folder."""
    path = resolve_ref(ref, confined)
    config = read_config(path, confined)
    if config.get("auto_map"):
        raise RotvizError(
            f"'{path}' needs remote code (auto_map in config.json); rotviz never runs it"
        )
    spec = spec_for(config)
    check_weights(path, config, spec, confined)
    model, full_cfg, stored = source_of(spec).load(path, config, spec, confined)
    if dtype is not None:
        model = model.to(dtype)
        stored = {}
    elif any(dt in HALF for dt in stored.values()):
        # torch.linalg has no half kernels and half sums lose the small differences rotviz
        # measures: compute in float32, write back in `stored` (see save_model).
        model = model.to(torch.float32)
    model.eval()
    model.requires_grad_(False)
    state = dict(model.state_dict())
    check_finite(state, path)
    return Loaded(str(ref), path, full_cfg, spec, model, state, stored)


def check_finite(state: Mapping[str, Tensor], where) -> None:
    for k, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise RotvizError(
                f"'{where}' has NaN or Inf weights in {k}; the checkpoint is corrupt or diverged"
            )

"""Checkpoint folders opened at size, and what every path at size shares: one block read as
a one-block view, the output written as shards as it goes, and the logits of a model whose
blocks load only while they run (rotviz.atsize.runtime). Matching at size:
rotviz.match.at_size (per-layer maps), rotviz.match.at_size_residual (weight matching), and
what both check (distances, the function check): rotviz.match.at_size_checks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import torch

from rotviz.arch import ArchSpec, spec_for
from rotviz.atsize.runtime import (
    BlockStreamed,
    Provider,
    Reader,
    build_meta,
    check_fits,
    checked_meta,
    legacy_tensors,
)
from rotviz.confine import ANYWHERE, Confined
from rotviz.errors import RotvizError
from rotviz.memory import release
from rotviz.sources.adapters import source_of
from rotviz.sources.checkpoint import Checkpoint
from rotviz.sources.loading import check_weights, dominant_dtype, read_config, resolve_ref
from rotviz.sources.running import attends_unfused, attention_positions
from rotviz.sources.shards import ShardWriter
from rotviz.symmetry.actions import LayerTransform, apply_layer
from rotviz.symmetry.view import (
    Block,
    Dims,
    Layout,
    ModelView,
    model_dims,
    read_block,
    resolve_layout,
    write_block,
)

Tensor = torch.Tensor


@dataclass(frozen=True)
class Streamed:
    """A model folder opened at size: its config and spec, the checkpoint's headers,
    and where every tensor sits in the family's layout. No weights are read."""

    ref: str
    path: Path
    config: dict  # the full config, as the in-memory path sees it
    spec: ArchSpec
    checkpoint: Checkpoint
    layout: Layout
    dims: Dims
    block_keys: tuple[tuple[str, ...], ...]  # per block, the names its view reads
    rest: tuple[str, ...]  # every other name the model reads, in checkpoint order
    tied: tuple[tuple[str, str], ...]
    confined: Confined = ANYWHERE  # what every later read of the folder goes through
    # old-format buffers the model's class reads past (rotviz.sources.legacy): never read, compared
    # or written, as a loaded model does not hold them
    dropped: frozenset[str] = frozenset()

    @property
    def keys(self) -> list[str]:
        """The checkpoint's names the model reads (all but `dropped`), in checkpoint order."""
        return [n for n in self.checkpoint.keys() if n not in self.dropped]

    @cached_property
    def state(self) -> dict[str, Tensor]:
        """Meta tensors (names, shapes, dtypes) for the checks that compare two models."""
        return {n: t for n, t in self.checkpoint.meta_state().items() if n not in self.dropped}

    @property
    def stored_dtype(self) -> torch.dtype:
        """The floating dtype holding most parameters (as `Loaded.stored_dtype`)."""
        return dominant_dtype((e.dtype, math.prod(e.shape))
                              for n, e in self.checkpoint.entries.items()
                              if e.dtype.is_floating_point and n not in self.dropped)

    def runner(self, module, rest: Reader, provider: Provider,
               stream_rest: bool = True) -> BlockStreamed:
        """`module` (built by rotviz.atsize.runtime.build_meta from this model's config) run block
        by block: blocks from `provider`, the tensors outside them from `rest`, under the
        checkpoint's names mapped to the module's as the source's loader maps them."""
        names = source_of(self.spec).checkpoint_names(module, self.checkpoint.keys())
        prefixes = resolve_layout(self.spec, module.state_dict()).blocks
        sizes = {n: math.prod(self.checkpoint.entries[n].shape) for n in self.rest}
        tie = self.config.get("tie_word_embeddings", True) is not False
        return BlockStreamed(module, self.spec, prefixes, rest, sizes, provider, names, tie,
                             stream_rest)


def open_streamed(ref: str | os.PathLike, confined: Confined = ANYWHERE) -> Streamed:
    """Open a model folder at size (headers only), through `confined`; one-line errors
    for folders that cannot be run at size: no safetensors, a checkpoint or config that the
    in-memory path refuses too (models.check_weights, the same checks), a tensor group (the
    linear maps of one block) in mixed dtypes."""
    path = resolve_ref(ref, confined)
    config = read_config(path, confined)
    if config.get("auto_map"):
        raise RotvizError(
            f"'{path}' needs remote code (auto_map in config.json); rotviz never runs it")
    spec = spec_for(config)
    checkpoint = check_weights(path, config, spec, confined, streamed=True, fits=False)
    assert checkpoint is not None
    meta = checkpoint.meta_state()
    module, full = checked_meta(spec, config, path)
    check_fits(spec, config, meta, path, (module, full))  # the check check_weights leaves
    try:
        dropped = legacy_tensors(spec, config, module, meta)
    except RotvizError:  # names the loader converts: the runner says so, as before
        dropped = frozenset()
    meta = {n: t for n, t in meta.items() if n not in dropped}
    layout = resolve_layout(spec, meta)
    dims = model_dims(spec, full, meta, layout)
    block_keys = []
    used_all: set[str] = set()
    for prefix in layout.blocks:
        used: set[str] = set()
        read_block(spec, dims, layout, meta, prefix, used)
        ordered = tuple(n for n in meta if n in used)
        linear = {meta[n].dtype for n in ordered if "norm" not in n.lower()}
        if len(linear) > 1:
            kinds = ", ".join(sorted(str(d).removeprefix("torch.") for d in linear))
            raise RotvizError(
                f"cannot stream '{path}': the weights of block {prefix.rstrip('.')} mix dtypes "
                f"({kinds}); a block's maps move its tensors together, so save them in one "
                "dtype")
        block_keys.append(ordered)
        used_all |= used
    rest = tuple(n for n in meta if n not in used_all)
    return Streamed(str(ref), path, full, spec, checkpoint, layout, dims, tuple(block_keys),
                    rest, _ties(spec, config, set(meta), set(module.state_dict())), confined,
                    dropped)


# ---- one block --------------------------------------------------------------------------------


def block_view(model: Streamed, block: Block, i: int, dtypes: dict[str, torch.dtype]
                ) -> ModelView:
    """A one-block view of block i (the view matching and distances take)."""
    layout = replace(model.layout, blocks=(model.layout.blocks[i],), final_norm=None,
                     writers=(), stream_norms=(), readers=())
    return ModelView(model.spec, replace(model.dims, n_layers=1), layout, (block,), {},
                     dtypes, ())


def read_block_view(model: Streamed, i: int, dtype: torch.dtype | None = torch.float32
                ) -> ModelView:
    state = model.checkpoint.read(model.block_keys[i], dtype)
    prefix = model.layout.blocks[i]
    block = read_block(model.spec, model.dims, model.layout, state, prefix)
    return block_view(model, block, i, {n: t.dtype for n, t in state.items()})


def applied_block(source: Streamed, i: int, t: LayerTransform | None,
           dtype: torch.dtype | None = torch.float32) -> ModelView:
    """Source block i with its map applied (float32 arithmetic, as in memory); the view's
    dtypes are `dtype`'s, or the checkpoint's with None."""
    v = read_block_view(source, i)
    if dtype is None:
        v = as_stored(v, source)
    return v if t is None else apply_layer(v, 0, t)


def as_stored(view: ModelView, model: Streamed) -> ModelView:
    """`view` whose tensors are written in the checkpoint's own dtypes."""
    return replace(view, dtypes={n: model.checkpoint.entries[n].dtype for n in view.dtypes})


def block_tensors(view: ModelView, i: int, model: Streamed) -> dict[str, Tensor]:
    return write_block(view, view.blocks[0], model.layout.blocks[i])


# ---- the whole model ----------------------------------------------------------------------------


def _ties(spec: ArchSpec, config: dict, names: set[str], module: set[str]
          ) -> tuple[tuple[str, str], ...]:
    """The spec's ties the loaded model has: the owner in the checkpoint, the alias in it or
    in the module (a file often leaves a tied head out), and not untied by the config (a
    file never shares storage, so the config alone decides)."""
    if config.get("tie_word_embeddings") is False:
        return ()
    return tuple((a, o) for a, o in spec.tied if o in names and (a in names or a in module))


def open_writer(source: Streamed, folder: Path | None, shard_bytes: int | None,
                rest: Mapping[str, Tensor | Callable[[], Iterable[Tensor]]] | None = None):
    """The output's writer, the tensors outside the blocks written first: from `rest` where
    it has them (a tensor, or a function giving its row slices; cast to the stored dtype),
    else copied as they are stored. With no folder, a writer that drops what it is given
    (row slices are still computed)."""
    writer = _Discard() if folder is None else None
    if writer is None:
        order = [*source.rest, *(n for keys in source.block_keys for n in keys)]
        entries = source.checkpoint.entries
        plan = [(n, entries[n].dtype, entries[n].shape) for n in order]
        writer = ShardWriter(folder, plan,
                             shard_bytes or source.checkpoint.largest_file_bytes())
    for name in source.rest:
        dtype = source.checkpoint.entries[name].dtype
        t = rest.get(name) if rest is not None else None
        if callable(t):
            writer.write_parts(name, (p.to(device="cpu", dtype=dtype) for p in t()))
            continue
        if folder is None:
            continue
        if t is None:
            t = source.checkpoint.read([name], None)[name]
        writer.write(name, t.to(device="cpu", dtype=dtype))
    return writer


def write_block_tensors(writer, view: ModelView, i: int, source: Streamed) -> None:
    tensors = block_tensors(view, i, source)
    for name in source.block_keys[i]:
        writer.write(name, tensors[name])


class _Discard:
    """A writer for a run that writes nothing (benchmarks of the solve alone)."""

    def write(self, name: str, t: Tensor) -> None:
        pass

    def write_parts(self, name: str, parts: Iterable[Tensor]) -> None:
        for _ in parts:
            pass

    def close(self) -> list[str]:
        return []

    def abort(self) -> None:
        pass


def write_config(source: Streamed, folder: Path) -> None:
    from rotviz.sources.writing import copy_reading_files

    config = source.confined.read_bytes(source.path / "config.json", "config")
    (folder / "config.json").write_bytes(config)
    copy_reading_files(source.path, folder, source.confined)  # tokenizer, processor, generation


# ---- the function check -------------------------------------------------------------------------


def logits_at_size(source: Streamed, provider: Provider, rest: Reader, inputs) -> Tensor:
    """The source's module run on `inputs`, blocks from `provider`, the tensors outside them
    from `rest` (in the dtype they come in). Embeddings and output heads are read only while
    their module runs; a model that uses one elsewhere (a head that decodes with the
    embedding matrix itself) then meets a meta tensor and is run again holding them."""
    full = read_config(source.path, source.confined)

    def run(stream_rest: bool) -> Tensor:
        module, _ = build_meta(source.spec, full, source.stored_dtype)
        # attention as the in-memory check runs it (rotviz.sources.running.attending_module)
        first = next(iter(inputs.values())) if isinstance(inputs, Mapping) else inputs
        if attends_unfused(module, attention_positions(full, inputs), first.device):
            module.set_attn_implementation("eager")
        runner = source.runner(module, rest, provider, stream_rest)
        try:
            return runner.logits(inputs).double()
        finally:
            runner.close()

    try:
        out = run(True)
        if out.device.type != "meta":
            return out
    except (RuntimeError, NotImplementedError) as e:
        if "meta" not in str(e):
            raise
    release()
    return run(False)



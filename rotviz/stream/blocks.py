"""Checkpoint folders opened for streaming, and what the streamed paths share: one block
read as a one-block view, the tensors outside the blocks measured in slices, the output
written as shards as it goes, and the function check with each block loaded only while it
runs (rotviz.skeleton). The matching itself: rotviz.stream.match (per-layer maps) and
rotviz.stream.residual (weight matching).
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
from rotviz.confine import ANYWHERE, Confined
from rotviz.errors import RotvizError
from rotviz.match.distances import Distances, distances, squared_distance
from rotviz.match.options import MatchOptions
from rotviz.match.pipeline import record_stored_check
from rotviz.match.report import MatchReport
from rotviz.memory import release
from rotviz.skeleton import BlockStreamed, Provider, Reader, build_meta, legacy_tensors
from rotviz.sources.adapters import source_of
from rotviz.sources.checkpoint import Checkpoint
from rotviz.sources.loading import HALF, check_weights, dominant_dtype, read_config, resolve_ref
from rotviz.sources.running import attends_unfused, attention_positions, logit_change
from rotviz.sources.shards import ShardWriter
from rotviz.symmetry.actions import LayerTransform, apply_layer
from rotviz.symmetry.view import (
    Block,
    Dims,
    Layout,
    ModelView,
    _kind_of,
    model_dims,
    read_block,
    resolve_layout,
    write_block,
)

Tensor = torch.Tensor


@dataclass(frozen=True)
class Streamed:
    """A model folder opened for streaming: its config and spec, the checkpoint's headers,
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
        """`module` (built by rotviz.skeleton.build_meta from this model's config) run block
        by block: blocks from `provider`, the tensors outside them from `rest`, under the
        checkpoint's names mapped to the module's as the source's loader maps them."""
        names = source_of(self.spec).checkpoint_names(module, self.checkpoint.keys())
        prefixes = resolve_layout(self.spec, module.state_dict()).blocks
        sizes = {n: math.prod(self.checkpoint.entries[n].shape) for n in self.rest}
        tie = self.config.get("tie_word_embeddings", True) is not False
        return BlockStreamed(module, self.spec, prefixes, rest, sizes, provider, names, tie,
                             stream_rest)


def open_streamed(ref: str | os.PathLike, confined: Confined = ANYWHERE) -> Streamed:
    """Open a model folder for streaming (headers only), through `confined`; one-line errors
    for folders that cannot be streamed: no safetensors, a checkpoint or config that the
    in-memory path refuses too (models.check_weights, the same checks), a tensor group (the
    linear maps of one block) in mixed dtypes."""
    path = resolve_ref(ref, confined)
    config = read_config(path, confined)
    if config.get("auto_map"):
        raise RotvizError(
            f"'{path}' needs remote code (auto_map in config.json); rotviz never runs it")
    spec = spec_for(config)
    checkpoint = check_weights(path, config, spec, confined, streamed=True)
    assert checkpoint is not None
    module, full = build_meta(spec, config)
    meta = checkpoint.meta_state()
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


def streaming_refusal(options: MatchOptions) -> str | None:
    """Why `options` cannot be matched block by block, or None."""
    if options.needs_data:
        return f"matching from data ([{options.label}]) cannot be streamed yet"
    return None


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


def kind_cells(d: Distances) -> dict[str, float]:
    return {kind: v for (_, kind), v in d.cells.items()}


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


def rest_cells(anchor: Streamed, source: Streamed) -> dict[tuple[int | None, str], float]:
    """Distances outside the blocks (unchanged by per-layer maps), one tensor at a time and
    the largest (embeddings, output heads) in slices of rows, in the kinds
    `rotviz.symmetry.view.groups` gives them (tie aliases counted once)."""
    tied = {alias for alias, _ in source.tied}
    cells: dict[tuple[int | None, str], float] = {}
    for name in source.rest:
        if name in tied or not source.checkpoint.entries[name].dtype.is_floating_point:
            continue
        shape = source.checkpoint.entries[name].shape
        rows = shape[0] if shape else 1
        step = max(1, (1 << 22) // max(1, math.prod(shape[1:]))) if shape else 1
        total = 0.0
        for lo in range(0, rows, step):
            if shape:
                a = anchor.checkpoint.read_rows(name, lo, lo + step, torch.float32)
                s = source.checkpoint.read_rows(name, lo, lo + step, torch.float32)
            else:
                a = anchor.checkpoint.read([name], torch.float32)[name]
                s = source.checkpoint.read([name], torch.float32)[name]
            total += squared_distance(s, a)
        key = (None, _kind_of(name, source.layout))
        cells[key] = cells.get(key, 0.0) + total
    return cells


def streamed_distance(anchor: Streamed, source: Streamed) -> Distances:
    """The parameter distance of two checkpoints, read block by block (as the in-memory
    `rotviz.match.distances.distances` of the loaded models)."""
    cells: dict[tuple[int | None, str], float] = {}
    for i in range(source.dims.n_layers):
        d = distances(read_block_view(source, i), read_block_view(anchor, i))
        cells.update({(i, k): v for k, v in kind_cells(d).items()})
        release()
    return Distances({**cells, **rest_cells(anchor, source)})


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


def _logits(source: Streamed, provider: Provider, rest: Reader, inputs) -> Tensor:
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


Dtype = torch.dtype | None  # float32, or None: as stored


def check_function(source: Streamed, matched: Callable[[Dtype], Provider],
           matched_rest: Callable[[Dtype], Reader], report: MatchReport,
           folder: Path | None) -> None:
    """Fill the report's function check, as rotviz.match.pipeline does in memory: the source
    against the matched model (`matched(dtype)` gives its blocks, `matched_rest(dtype)` the
    tensors outside them), in float32 and, for a half checkpoint, as stored (read back from
    the written `folder` where there is one)."""
    module, full = build_meta(source.spec, read_config(source.path, source.confined))
    x = source_of(source.spec).probe_inputs(source.spec, full, module, 4, 0)

    def original(dtype: Dtype) -> Provider:
        return lambda i: block_tensors(applied_block(source, i, None, dtype), i, source)

    def stored_rest(dtype: Dtype) -> Reader:
        return lambda ns: source.checkpoint.read(ns, dtype)

    ya = _logits(source, original(torch.float32), stored_rest(torch.float32), x)
    release()
    yb = _logits(source, matched(torch.float32), matched_rest(torch.float32), x)
    release()
    report.max_output_diff = float((ya - yb).abs().max())
    dtype = source.stored_dtype
    if dtype not in HALF:
        return
    xs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in x.items()}
    if folder is not None:  # the written files, as they will be loaded
        written = Checkpoint(folder, source.confined)

        def blocks(i: int) -> Mapping[str, Tensor]:
            return written.read(source.block_keys[i], None)

        def rest(ns: list[str]) -> Mapping[str, Tensor]:
            return written.read(ns, None)
    else:
        blocks, rest = matched(None), matched_rest(None)
    ya = _logits(source, original(None), stored_rest(None), xs)
    release()
    yb = _logits(source, blocks, rest, xs)
    release()
    record_stored_check(report, dtype, *logit_change(ya, yb))

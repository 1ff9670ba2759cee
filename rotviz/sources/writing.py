"""Writing a model: a state dict saved as a model of a template's class (one transaction, as
rotviz.outputs checks outputs), with the files that say how it reads its inputs (tokenizer,
image processor, generation config) copied beside it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

from rotviz.confine import ANYWHERE, Confined
from rotviz.data.tokens import (
    PROCESSOR_FILES,
    TOKENIZER_FILES,
)
from rotviz.outputs import Outputs
from rotviz.sources.adapters import source_of
from rotviz.sources.loading import Loaded
from rotviz.sources.stacking import own_config

Tensor = torch.Tensor



def save_model(
    template: Loaded,
    state: Mapping[str, Tensor],
    out: str | os.PathLike,
    extra_files: Mapping[str, str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write `state` as a model of `template`'s class into `out`, as one transaction.

    `out` is checked first (rotviz.outputs: a new or empty folder, or with `overwrite` an
    earlier rotviz output); the files go to a temporary folder beside it and are moved in
    place only when complete, so a failure leaves nothing half-written."""
    outputs = Outputs("save")
    folder = outputs.add(out, "out", folder=True, overwrite=overwrite)
    with outputs.write() as tmp:
        write_model(template, state, tmp[folder], extra_files)
    return folder.path


def write_model(
    template: Loaded,
    state: Mapping[str, Tensor],
    folder: Path,
    extra_files: Mapping[str, str] | None = None,
) -> None:
    """The files of `state` as a model of `template`'s class and config, into the (empty)
    `folder`. A model stacked to other blocks than its folder's (rotviz.sources.stacking)
    holds its own config, which the source writes in place of the folder's."""
    tmp = folder
    dtypes = template.stored_dtypes  # each tensor back in the checkpoint's dtype; one the
    # template lacks (a block beyond its depth) in the checkpoint's dominant floating dtype
    wide = template.stored_dtype if dtypes else None
    cpu = {k: v.detach().to("cpu", dtypes.get(k, wide if v.is_floating_point() and wide
                                               else v.dtype)).contiguous()
           for k, v in state.items()}
    source_of(template.spec).write_state(template.spec, template.path, template.config, cpu, tmp,
                                         own_config(template.spec, template.config,
                                                    _folder_config(template.path)))
    copy_reading_files(template.path, tmp)
    for name, text in (extra_files or {}).items():
        (tmp / name).write_text(text)


def _folder_config(path: Path) -> dict:
    """The config.json of the model folder `path` ({} where it has none: a model read from
    elsewhere is written with its own config)."""
    f = Path(path) / "config.json"
    return ANYWHERE.read_json(f, "re-save the model", "config") if f.is_file() else {}


def copy_reading_files(src: Path, folder: Path, confined: Confined = ANYWHERE) -> list[str]:
    """Copy the tokenizer, image-processor and generation files of the model folder `src`
    into the output `folder` (those it does not hold yet), so the output loads with
    AutoTokenizer / AutoImageProcessor as the original does. Each is read through
    `confined` (a link out of the folder's roots, a FIFO: one line). Returns the names
    copied."""
    copied = []
    for name in (*TOKENIZER_FILES, *PROCESSOR_FILES):
        f = Path(src) / name
        if os.path.lexists(f) and not (folder / name).exists():
            (folder / name).write_bytes(confined.read_bytes(f, "reading file"))
            copied.append(name)
    return copied

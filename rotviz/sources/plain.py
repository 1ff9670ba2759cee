"""A model folder written without transformers, where what `save_pretrained` writes is known
file by file: the families rotviz.sources.plain_torch runs (ViT, GPT-2), stored in float32, whose
folder transformers itself wrote.

Importing transformers costs seconds (it pulls in torch._dynamo and torch.distributed), more
than `rotviz match` on the zoo pair takes in all. For these models `save_pretrained` of a fresh
module of the checkpoint's own config writes:
- config.json: that config as transformers serialises it (`json.dumps(..., indent=2,
  sort_keys=True)` and a newline) with its own version in `transformers_version`;
- generation_config.json (GPT-2, which generates): the one derived from the config, which a
  GPT-2 folder transformers wrote holds already (`_from_model_config`), again with the
  version;
- model.safetensors: every tensor under the checkpoint's (4.x) names, the tied head left out,
  with the metadata `{"format": "pt"}`.
`write_plain` writes exactly that, and writes nothing (returns False) wherever a condition
is not met, so that the caller goes through transformers: another family or class, a
half-precision state, a config or generation config that does not read back as transformers
wrote it, another major version of transformers, tensors the source checkpoint does not
hold under the same names, a head no longer tied. tests/test_zoo.py compares the folders
byte for byte with transformers' own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import torch

from rotviz.arch.vit_names import stored_name
from rotviz.confine import ANYWHERE, Confined
from rotviz.errors import RotvizError
from rotviz.sources.checkpoint import INDEX, SINGLE, Checkpoint

Tensor = torch.Tensor

CONFIG, GENERATION = "config.json", "generation_config.json"

# (architecture, model_type) -> (the tied alias and its owner, or None; whether it generates)
_COVERED = {
    ("ViTForImageClassification", "vit"): (None, False),
    ("GPT2LMHeadModel", "gpt2"): (("lm_head.weight", "transformer.wte.weight"), True),
}


def _dumps(d: dict) -> str:
    """JSON as transformers writes its configs (PretrainedConfig.to_json_string)."""
    return json.dumps(d, indent=2, sort_keys=True) + "\n"


def _as_written(text: str, major: str) -> dict | None:
    """The JSON file `text`, if transformers of this major version wrote it as it is (its
    own layout and a version of the same major), else None."""
    try:
        d = json.loads(text)
    except ValueError:
        return None
    version = d.get("transformers_version") if isinstance(d, dict) else None
    if not isinstance(version, str) or version.split(".")[0] != major or _dumps(d) != text:
        return None
    return d


def _installed() -> str | None:
    """The installed transformers' version, read from its metadata (no import), or None."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def write_plain(path: Path, state: Mapping[str, Tensor], folder: Path,
                confined: Confined = ANYWHERE) -> bool:
    """Write `state` (CPU tensors in their final dtypes, the module's names) into the empty
    `folder` as `save_pretrained` of the model in `path` writes it, when that is known
    without transformers (see the module's docstring); False, with nothing written, when
    not. Every file of `path` is read through `confined`."""
    version = _installed()
    if version is None or not (Path(path) / SINGLE).is_file() or (Path(path) / INDEX).exists() \
            or any(t.is_floating_point() and t.dtype != torch.float32
                              for t in state.values()):
        return False
    major = version.split(".")[0]
    files = {}
    config = _as_written(confined.read_bytes(Path(path) / CONFIG, "reading file").decode(),
                         major)
    if config is None or config.get("dtype") != "float32":
        return False
    arch = (config.get("architectures") or [None])[0]
    covered = _COVERED.get((arch, config.get("model_type")))
    if covered is None:
        return False
    tied, generates = covered
    files[CONFIG] = _dumps({**config, "transformers_version": version})
    if generates:
        gen_file = Path(path) / GENERATION
        try:
            text = confined.read_bytes(gen_file, "reading file").decode()
        except (RotvizError, OSError):
            return False
        gen = _as_written(text, major)
        if gen is None or not gen.get("_from_model_config") or any(
                gen.get(k) != config.get(k) for k in ("bos_token_id", "eos_token_id")):
            return False
        files[GENERATION] = _dumps({**gen, "transformers_version": version})
    tensors = dict(state)
    if tied is not None and tied[0] in tensors:
        alias, owner = tied
        if owner not in tensors or not torch.equal(tensors[alias], tensors[owner]):
            return False  # untied by the caller: what transformers would keep is not plain
        del tensors[alias]
    tensors = {stored_name(k): v for k, v in tensors.items()}
    try:
        stored = set(Checkpoint(Path(path), confined).keys())
    except RotvizError:
        return False
    if set(tensors) != stored:
        return False
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / SINGLE),
              metadata={"format": "pt"})
    for name, text in files.items():
        (folder / name).write_text(text)
    return True

"""Hugging Face transformers checkpoints: `save_pretrained` folders (config.json with
`model_type` and `architectures`, safetensors or a pickled pytorch_model.bin), read with
transformers' own reader, which maps legacy tensor names (4.x <-> 5.x). Remote code is never
run and nothing is downloaded."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from rotviz.arch.spec import ArchSpec
from rotviz.confine import ANYWHERE, Confined
from rotviz.errors import RotvizError
from rotviz.sources.base import Source
from rotviz.sources.files import fit_error, floating_dtypes
from rotviz.sources.legacy import read_past

Tensor = torch.Tensor


def tied_aliases(model: nn.Module, spec: ArchSpec) -> set[str]:
    """Tensor names a checkpoint may leave out because the loaded model ties them to another
    tensor. An alias whose owner is known counts only if the two really share storage after
    loading: a model that unties them (LLaMA's `tie_word_embeddings: false`) needs its own."""
    pairs = dict(spec.tied)
    keys = getattr(model, "_tied_weights_keys", None)
    loose: set[str] = set()
    if isinstance(keys, dict):
        pairs.update(keys)
    elif isinstance(keys, (list, tuple)):
        loose |= set(keys)  # legacy form: no owner named
    state = model.state_dict()
    live = {alias for alias, owner in pairs.items() if alias in state and owner in state
            and state[alias].data_ptr() == state[owner].data_ptr()}
    return live | (loose - set(pairs))


def cast_like(module: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Give `module`'s floating tensors the dtypes of `state`'s, in place (ties kept), so that
    load_state_dict keeps them: it would cast them into the module's own dtype."""
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if name in state and t.is_floating_point() and t.dtype != state[name].dtype:
            t.data = t.data.to(state[name].dtype)


class HFSource(Source):
    name = "hf"

    def build(self, config: dict, spec: ArchSpec, instantiate: bool = True) -> tuple:
        import transformers

        cfg_cls = transformers.AutoConfig.for_model
        try:
            hf_cfg = cfg_cls(**{k: v for k, v in config.items() if k != "auto_map"})
        except Exception as e:  # noqa: BLE001 (transformers and huggingface_hub raise many)
            first = (str(e).strip().splitlines() or [e.__class__.__name__])[0][:200]
            raise RotvizError(f"invalid config for {spec.family}: {first}") from None
        names = config.get("architectures") or []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise RotvizError(f"invalid config for {spec.family}: architectures must be a list "
                              f"of class names, got {str(names)[:40]}; fix config.json")
        cls = getattr(transformers, names[0], None) if names else None
        if cls is None or getattr(cls, "config_class", None) is None:
            cls = transformers.AutoModel._model_mapping[type(hf_cfg)]
        elif not (isinstance(cls, type) and isinstance(cls.config_class, type)
                  and issubclass(type(hf_cfg), cls.config_class)):
            raise RotvizError(f"invalid config for {spec.family}: architectures names "
                              f"{names[0]}, a model of another kind than model_type "
                              f"'{config.get('model_type')}'; fix config.json")
        if not instantiate:
            return cls, hf_cfg.to_dict()
        return cls(hf_cfg), hf_cfg.to_dict()

    def load(self, path: Path, config: dict, spec: ArchSpec, confined: Confined = ANYWHERE
             ) -> tuple[nn.Module, dict, dict[str, torch.dtype]]:
        """The module keeps the checkpoint's dtypes. transformers reads the folder itself:
        models.check_weights has validated what it will read just before, through
        `confined`: the safetensors file, the index and every shard it names, or the pickled
        checkpoint (loaded there with weights_only=True, so its one-line errors come first)."""
        import logging

        import transformers

        cls, full_cfg = self.build(config, spec, instantiate=False)
        level = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        logging.getLogger("transformers").setLevel(logging.ERROR)
        try:
            model, info = cls.from_pretrained(
                str(path), local_files_only=True, output_loading_info=True,
                trust_remote_code=False
            )
        except (OSError, ValueError, RuntimeError, KeyError) as e:
            text = str(e).strip()
            first = text.splitlines()[0][:200] if text else e.__class__.__name__
            if "ignore_mismatched_sizes" in first:  # its "report above" is not shown: say it
                first = "a tensor's shape differs from what config.json describes"
            raise RotvizError(
                f"cannot read the weights in '{path}' ({first}); "
                "the file is corrupt or does not fit config.json"
            ) from None
        except Exception as e:  # safetensors raises its own error type for truncated files
            if "safetensor" in type(e).__module__.lower() or "Safetensor" in type(e).__name__:
                raise RotvizError(
                    f"cannot read the weights in '{path}' ({e}); the file is corrupt or truncated"
                ) from None
            raise
        finally:
            transformers.logging.set_verbosity(level)
            transformers.utils.logging.enable_progress_bar()
        allowed = tied_aliases(model, spec)
        missing = [k for k in info.get("missing_keys", []) if k not in allowed]
        # transformers drops most old-format buffers from its report itself; what it still
        # reports (GPT-2's attn.masked_bias) is read past by name: models.check_weights has
        # judged those tensors' shapes from the headers (rotviz.sources.legacy)
        unexpected = list(info.get("unexpected_keys", []))
        past = read_past(model, spec, config, unexpected)
        fit_error(path, missing, [k for k in unexpected if k not in past],
                  info.get("mismatched_keys", []))
        return model, full_cfg, floating_dtypes(model.state_dict())

    def build_dtype(self, dtype: torch.dtype):
        """from_pretrained builds a half checkpoint's module under that default dtype, so
        buffers made at build time (Gemma's embedding scale) are rounded to it."""
        from contextlib import contextmanager

        @contextmanager
        def default(dtype: torch.dtype):
            before = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                yield
            finally:
                torch.set_default_dtype(before)

        return default(dtype)

    def checkpoint_names(self, module: nn.Module, names: list[str]) -> dict[str, str]:
        """transformers renames legacy checkpoint names as it loads them (ViT's
        'encoder.layer.N.attention.attention.query' is 'layers.N.attention.q_proj' in the
        module); the same renaming, from its own tables. A name it would also convert (split,
        merge or reshape) cannot be mapped one to one: a one-line error."""
        try:
            from transformers.conversion_mapping import get_model_conversion_mapping
            from transformers.core_model_loading import (
                WeightConverter,
                WeightRenaming,
                rename_source_key,
            )
        except ImportError:  # a transformers without renaming tables loads names as they are
            return {n: n for n in names}
        rules = get_model_conversion_mapping(module)
        renamings = [r for r in rules if isinstance(r, WeightRenaming)]
        converters = [r for r in rules if isinstance(r, WeightConverter)]
        meta = module.state_dict()
        out = {}
        for n in names:
            new, converted = rename_source_key(n, renamings, converters,
                                               module.base_model_prefix, meta)
            if converted is not None:
                raise RotvizError(f"transformers converts the checkpoint's {n} as it loads it, "
                                  "which a streamed run cannot; match this pair in memory")
            out[n] = new
        return out

    def save_module(self, module: nn.Module, config: dict, folder: Path) -> None:
        from transformers.utils import logging as hf_logging

        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # keep the CLI's stderr for errors only
        try:
            module.save_pretrained(str(folder), safe_serialization=True)
        finally:
            if bar:
                hf_logging.enable_progress_bar()

    def write_state(self, spec: ArchSpec, path: Path, config: dict,
                    state: Mapping[str, Tensor], folder: Path, own: dict | None = None) -> None:
        """Through a fresh module of the checkpoint's own config.json (or of `own`, the
        model's own config where it describes other blocks: a stacked model), so that
        `save_pretrained` writes what transformers itself would; without transformers where
        those files are known (rotviz.sources.plain: the zoo's ViT and GPT-2)."""
        from rotviz.sources.plain import write_plain

        if own is not None or not write_plain(path, state, folder):
            self.save_fresh(spec, path, state, folder, own)

    def save_fresh(self, spec: ArchSpec, path: Path, state: Mapping[str, Tensor],
                   folder: Path, own: dict | None = None) -> None:
        """`write_state` through transformers: a fresh module of `own` (the model's own
        config) or of the checkpoint's own config.json, given `state`, saved with
        `save_pretrained`."""
        if own is None:
            own = ANYWHERE.read_json(path / "config.json", "re-save the model", "config")
        model, _ = self.build(own, spec)
        cast_like(model, state)
        model.load_state_dict(state, strict=False)
        self.save_module(model, own, folder)

    def arguments(self, spec: ArchSpec, inputs: Mapping[str, Tensor]) -> tuple[tuple, dict]:
        return (), dict(inputs)

    def image_shape(self, module: nn.Module, config: Mapping) -> tuple[int, int]:
        return int(config.get("num_channels", 3)), int(config.get("image_size", 224))

    def n_outputs(self, config: Mapping) -> int | None:
        labels = config.get("id2label")
        return len(labels) if labels else config.get("num_labels")


HF = HFSource()

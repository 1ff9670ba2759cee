"""Loading, running and saving models, safely and offline.

A model reference is a directory in Hugging Face `save_pretrained` format (config.json plus
safetensors, or a pickled `pytorch_model.bin` loaded with `weights_only=True`), or `zoo:NAME`.
timm models use the same layout: a config.json with `architecture` (and `model_args`).
Remote code is never run and nothing is downloaded.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from rotviz.arch import ArchSpec, config_value, spec_for
from rotviz.errors import RotvizError

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

    @property
    def name(self) -> str:
        return self.ref

    @property
    def stored_dtype(self) -> torch.dtype:
        """The checkpoint's dtype: the floating dtype holding most parameters."""
        count: dict[torch.dtype, int] = {}
        for k, dt in self.stored_dtypes.items():
            count[dt] = count.get(dt, 0) + (self.state[k].numel() if k in self.state else 0)
        return max(count, key=count.__getitem__) if count else torch.float32


def mps_available() -> bool:
    """Whether an Apple GPU (MPS) is usable (builds without MPS lack torch.backends.mps)."""
    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def pick_device(device: str = "auto") -> torch.device:
    """`auto` picks cuda, then mps, then cpu."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device not in ("cpu", "cuda", "mps") and not device.startswith("cuda:"):
        raise RotvizError(f"unknown device '{device}': use auto, cpu, cuda or mps")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RotvizError(
            "--device cuda asked for, but no CUDA GPU is visible; use --device auto or cpu"
        )
    if device == "mps" and not mps_available():
        raise RotvizError("--device mps asked for, but no Apple GPU (MPS) is available; "
                          "use --device auto or cpu")
    return torch.device(device)


def wide_device(device: torch.device | str) -> torch.device:
    """Where float64 work for `device` runs: the device itself, except MPS, which has no
    float64, so the solvers, learned maps and float64 sums run on the CPU instead."""
    device = torch.device(device)
    return torch.device("cpu") if device.type == "mps" else device


def to_wide(t: Tensor) -> Tensor:
    """`t` in float64: on its own device, or on the CPU when it lives on MPS (a new tensor
    unless it already is one)."""
    return t.to(device=wide_device(t.device), dtype=torch.float64)


def resolve_ref(ref: str | os.PathLike) -> Path:
    """A directory for a model reference (`zoo:NAME` or a path)."""
    ref = str(ref)
    if ref.startswith("zoo:"):
        try:
            from rotviz import zoo
        except ImportError:  # pragma: no cover - the zoo ships with rotviz
            raise RotvizError("the model zoo is not available in this install") from None
        return zoo.path_of(ref[4:])
    path = Path(ref).expanduser()
    if not path.is_dir():
        raise RotvizError(
            f"no model directory at '{ref}': give a save_pretrained folder or zoo:NAME"
        )
    return path


def read_config(path: Path) -> dict:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise RotvizError(
            f"no model in '{path}': expected config.json and model.safetensors "
            "(Hugging Face save_pretrained format)"
        )
    try:
        return json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RotvizError(
            f"cannot parse '{cfg_file}': {e.__class__.__name__}; re-save the model"
        ) from None


def read_weights(path: Path) -> dict[str, Tensor]:
    """Weights from safetensors (preferred) or a pickled .bin, loaded with weights_only=True."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    state: dict[str, Tensor] = {}
    if files:
        for f in files:
            try:
                state.update(load_file(str(f)))
            except (SafetensorError, OSError, ValueError) as e:
                raise RotvizError(
                    f"cannot read weights file '{f}' ({e}); the file is corrupt or truncated"
                ) from None
        return state
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise RotvizError(
            f"no weights in '{path}': expected model.safetensors or pytorch_model.bin"
        )
    for f in bins:
        try:
            obj = torch.load(str(f), map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises many types for corrupt pickles
            raise RotvizError(
                f"cannot read weights file '{f}' ({e.__class__.__name__}); "
                "it is corrupt or not a plain state dict"
            ) from None
        if not isinstance(obj, Mapping):
            raise RotvizError(f"'{f}' holds no state dict; re-save the model with save_pretrained")
        odd = [str(k) for k, v in obj.items() if not isinstance(v, torch.Tensor)]
        if odd:
            raise RotvizError(
                f"'{f}' holds non-tensor entries {odd[:3]}; it is not a plain state dict"
            )
        state.update(obj)
    return state


def build_module(config: dict, spec: ArchSpec, instantiate: bool = True) -> tuple:
    """A randomly initialised module of the config's class (or, for transformers with
    `instantiate=False`, the class itself) and the full config as a dict."""
    if spec.source == "timm":
        import timm

        args = dict(config.get("model_args") or {})
        if "num_classes" in config and "num_classes" not in args:
            args["num_classes"] = config["num_classes"]
        model = timm.create_model(config["architecture"], pretrained=False, **args)
        blk = model.blocks[0]
        full = dict(config)
        full["model_args"] = {
            **args,
            "depth": len(model.blocks),
            "embed_dim": model.embed_dim,
            "num_heads": blk.attn.num_heads,
        }
        return model, full
    import transformers

    cfg_cls = transformers.AutoConfig.for_model
    try:
        hf_cfg = cfg_cls(**{k: v for k, v in config.items() if k != "auto_map"})
    except (ValueError, KeyError, TypeError) as e:
        raise RotvizError(f"invalid config for {spec.family}: {e}") from None
    names = config.get("architectures") or []
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None or getattr(cls, "config_class", None) is None:
        cls = transformers.AutoModel._model_mapping[type(hf_cfg)]
    if not instantiate:
        return cls, hf_cfg.to_dict()
    return cls(hf_cfg), hf_cfg.to_dict()


def _tied_aliases(model: nn.Module, spec: ArchSpec) -> set[str]:
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


def load_model(ref: str | os.PathLike, dtype: torch.dtype | None = None) -> Loaded:
    """Load a model on the CPU, checking that it is supported, complete and finite."""
    path = resolve_ref(ref)
    config = read_config(path)
    if config.get("auto_map"):
        raise RotvizError(
            f"'{path}' needs remote code (auto_map in config.json); rotviz never runs it"
        )
    spec = spec_for(config)
    if not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        raise RotvizError(
            f"no weights in '{path}': expected model.safetensors or pytorch_model.bin"
        )
    if spec.source == "timm":
        model, full_cfg, stored = _load_timm(path, config, spec)
    else:
        model, full_cfg = _load_hf(path, config, spec)  # keeps the checkpoint's dtypes
        stored = floating_dtypes(model.state_dict())
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


def floating_dtypes(state: Mapping[str, Tensor]) -> dict[str, torch.dtype]:
    """The dtype of each floating tensor."""
    return {k: v.dtype for k, v in state.items() if v.is_floating_point()}


def _load_timm(
    path: Path, config: dict, spec: ArchSpec
) -> tuple[nn.Module, dict, dict[str, torch.dtype]]:
    """The module (float32: load_state_dict casts into it), its config, the file's dtypes."""
    weights = read_weights(path)
    model, full_cfg = build_module(config, spec)
    own = model.state_dict()
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    bad_shape = [k for k in weights if k in own and weights[k].shape != own[k].shape]
    _fit_error(path, missing, unexpected, bad_shape)
    model.load_state_dict(weights)
    return model, full_cfg, floating_dtypes(weights)


def _fit_error(path: Path, missing, unexpected, mismatched) -> None:
    parts = []
    if missing:
        parts.append(f"missing {list(missing)[:3]}")
    if unexpected:
        parts.append(f"unexpected {list(unexpected)[:3]}")
    if mismatched:
        parts.append(f"wrong shape {list(mismatched)[:3]}")
    if parts:
        raise RotvizError(
            f"weights in '{path}' do not fit its config ({'; '.join(parts)}); re-save the model"
        )


def _load_hf(path: Path, config: dict, spec: ArchSpec) -> tuple[nn.Module, dict]:
    """Load with transformers' own reader, which maps legacy tensor names (4.x <-> 5.x)."""
    import logging

    import transformers

    if not any(path.glob("*.safetensors")):
        # A pickled checkpoint: open it ourselves first (weights_only=True, clean one-line
        # errors for corrupt or non-tensor payloads) rather than rely on transformers' loader.
        read_weights(path)
    template, full_cfg = build_module(config, spec, instantiate=False)
    cls = template
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        model, info = cls.from_pretrained(
            str(path), local_files_only=True, output_loading_info=True, trust_remote_code=False
        )
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else e.__class__.__name__
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
    allowed = _tied_aliases(model, spec)
    missing = [k for k in info.get("missing_keys", []) if k not in allowed]
    _fit_error(path, missing, info.get("unexpected_keys", []), info.get("mismatched_keys", []))
    return model, full_cfg


def check_finite(state: Mapping[str, Tensor], where) -> None:
    for k, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise RotvizError(
                f"'{where}' has NaN or Inf weights in {k}; the checkpoint is corrupt or diverged"
            )


def check_compatible(a: Loaded, b: Loaded) -> None:
    """Two models must share family, config shape fields and tensor shapes to be matched."""
    if a.spec.family != b.spec.family:
        raise RotvizError(
            f"different architectures: '{a.ref}' is {a.spec.family}, '{b.ref}' is {b.spec.family}"
        )
    fields = []
    for keys in (
        a.spec.n_layers_key,
        a.spec.d_model_key,
        a.spec.n_heads_key,
        a.spec.activation_key,
    ):
        va, vb = config_value(a.config, keys), config_value(b.config, keys)
        if va != vb:
            fields.append(f"{keys[0]} {va} vs {vb}")
    shapes = [
        f"{k} {tuple(a.state[k].shape)} vs {tuple(b.state[k].shape)}"
        for k in a.state
        if k in b.state and a.state[k].shape != b.state[k].shape
    ]
    only = sorted(set(a.state) ^ set(b.state))
    if fields or shapes or only:
        parts = fields or shapes[:3] or [f"tensors only in one model: {only[:3]}"]
        raise RotvizError(
            f"models differ in shape: {'; '.join(parts)}; match two models of one architecture"
        )


# ---- running ------------------------------------------------------------------------------


def probe_inputs(loaded: Loaded, n: int = 4, seed: int = 0) -> dict[str, Tensor]:
    """Random but seeded inputs of the model's kind, for function checks."""
    gen = torch.Generator().manual_seed(seed)
    cfg = loaded.config
    if loaded.spec.inputs == "tokens":
        vocab = int(cfg.get("vocab_size", 100))
        max_pos = int(cfg.get("n_positions") or cfg.get("max_position_embeddings") or 32)
        if loaded.spec.family == "roberta":
            max_pos -= int(cfg.get("pad_token_id") or 1) + 1  # RoBERTa counts positions from pad+1
        length = max(2, min(16, max_pos))
        return {"input_ids": torch.randint(0, vocab, (n, length), generator=gen)}
    c, size = image_shape(loaded)
    return {"pixel_values": torch.randn(n, c, size, size, generator=gen)}


def image_shape(loaded: Loaded) -> tuple[int, int]:
    cfg = loaded.config
    if loaded.spec.source == "timm":
        pe = loaded.model.patch_embed
        return int(pe.proj.in_channels), int(pe.img_size[0])
    return int(cfg.get("num_channels", 3)), int(cfg.get("image_size", 224))


def forward(
    loaded: Loaded, inputs: Mapping[str, Tensor], state: Mapping[str, Tensor] | None = None
) -> Tensor:
    """Logits of the model, or of `state` evaluated on the model's module (not modified)."""
    from torch.func import functional_call

    model = loaded.model
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in inputs.items()}
    with torch.no_grad():
        if loaded.spec.source == "timm":
            args, kwargs = (inputs["pixel_values"],), {}
        else:
            args, kwargs = (), dict(inputs)
        if state is None:
            out = model(*args, **kwargs)
        else:
            keep = set(dict(model.named_parameters())) | set(dict(model.named_buffers()))
            state = {k: v.to(device) for k, v in state.items() if k in keep}  # tied: owner only
            out = functional_call(model, state, args, kwargs, strict=False)
    return out if isinstance(out, torch.Tensor) else out.logits


def max_output_diff(
    loaded: Loaded,
    state_a: Mapping[str, Tensor],
    state_b: Mapping[str, Tensor],
    n: int = 4,
    seed: int = 0,
) -> float:
    """The largest absolute logit difference between two parameter sets on probe inputs."""
    x = probe_inputs(loaded, n, seed)
    ya, yb = forward(loaded, x, state_a), forward(loaded, x, state_b)
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
    ya = forward(view, x).double()
    yb = forward(view, x, stored_state(loaded, state)).double()
    inf = float("inf")
    scale = float(ya.abs().max()) if bool(torch.isfinite(ya).all()) else inf
    diff = float((ya - yb).abs().max()) if bool(torch.isfinite(yb).all()) else inf
    return diff, scale


# ---- saving ---------------------------------------------------------------------------------


def cast_like(module: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Give `module`'s floating tensors the dtypes of `state`'s, in place (ties kept), so that
    load_state_dict keeps them: it would cast them into the module's own dtype."""
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if name in state and t.is_floating_point() and t.dtype != state[name].dtype:
            t.data = t.data.to(state[name].dtype)


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
    from rotviz.outputs import Outputs

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
    """The files of `state` as a model of `template`'s class, into the (empty) `folder`."""
    tmp = folder
    dtypes = template.stored_dtypes  # each tensor back in the checkpoint's dtype
    cpu = {k: v.detach().to("cpu", dtypes.get(k, v.dtype)).contiguous()
           for k, v in state.items()}
    if template.spec.source == "timm":
        from safetensors.torch import save_file

        (tmp / "config.json").write_text(json.dumps(template.config, indent=2))
        save_file(cpu, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    else:
        from transformers.utils import logging as hf_logging

        model, _ = build_module(
            json.loads((template.path / "config.json").read_text()), template.spec
        )
        cast_like(model, cpu)
        model.load_state_dict(cpu, strict=False)
        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # keep the CLI's stderr for errors only
        try:
            model.save_pretrained(str(tmp), safe_serialization=True)
        finally:
            if bar:
                hf_logging.enable_progress_bar()
    for name, text in (extra_files or {}).items():
        (tmp / name).write_text(text)

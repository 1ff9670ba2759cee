"""Loading a model for evaluation without importing transformers, where plain torch computes
the same logits.

Importing transformers costs seconds (it pulls in torch._dynamo and torch.distributed), more
than `rotviz eval` may take in all. The zoo's two families are small enough to run with plain
torch: `LiteViT` (ViTForImageClassification) and `LiteGPT2` (GPT2LMHeadModel) compute the same
logits from the same tensors under the same names (tests compare them with transformers to
1e-5 on every shipped model and on random ones). Anything else (other classes, settings these
modules do not implement, checkpoints with other tensor names, pickled weights) is loaded the
ordinary way with `rotviz.sources.loading.load_model`: `load_for_eval` never guesses.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rotviz.arch import spec_for
from rotviz.arch.vit_names import runtime_name
from rotviz.confine import ANYWHERE, Confined
from rotviz.devices import SHORT_ATTENTION
from rotviz.sources.files import floating_dtypes
from rotviz.sources.legacy import read_past
from rotviz.sources.loading import HALF, Loaded, check_finite, load_model, read_config, resolve_ref

_ACTS = {
    "gelu": lambda x: F.gelu(x),
    # GPT-2's tanh GELU. transformers writes the formula out (5 kernels and temporaries);
    # the fused kernel is twice as fast here and differs by float rounding only (~1e-7).
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, causal: bool,
            scale: float | None) -> torch.Tensor:
    b, t, d = q.shape

    def split(x):
        return x.view(b, t, heads, d // heads).transpose(1, 2)

    if q.device.type == "cpu" and t <= SHORT_ATTENTION:  # unfused, as transformers' eager
        qh, kh, vh = split(q), split(k), split(v)
        w = torch.matmul(qh, kh.transpose(-1, -2)) * (scale if scale is not None
                                                      else (d // heads) ** -0.5)
        if causal:
            w = w.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1),
                              float("-inf"))
        out = torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), vh)
    else:
        out = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=causal,
                                             scale=scale)
    return out.transpose(1, 2).reshape(b, t, d)


class _Node(nn.Module):
    """A named container, so that parameters carry transformers' state-dict names."""

    def __init__(self, **children: nn.Module):
        super().__init__()
        for name, child in children.items():
            self.add_module(name, child)


def _param(*shape: int) -> nn.Parameter:
    """Uninitialised storage: every tensor is replaced by the checkpoint's when loading."""
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class _Linear(nn.Linear):
    """An nn.Linear (what RegMean's and Fisher's statistics look for: rotviz.merging.
    statistics.linear_layers) with uninitialised storage: nn.Linear's own initialisation is
    skipped, since the checkpoint's tensors replace it."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = d_in, d_out
        self.weight = _param(d_out, d_in)
        self.bias = _param(d_out) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class _LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight, self.bias, self.eps = _param(d), _param(d), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class _Patches(nn.Module):
    """ViT's patch projection: a convolution with stride = kernel = patch size."""

    def __init__(self, c: int, d: int, patch: int):
        super().__init__()
        self.weight, self.bias, self.patch = _param(d, c, patch, patch), _param(d), patch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, self.bias, stride=self.patch)


class _Embedding(nn.Module):
    def __init__(self, n: int, d: int):
        super().__init__()
        self.weight = _param(n, d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


_ln = _LayerNorm


class _ViTBlock(_Node):
    """One pre-LN encoder block, called as a module: hooks on a block (activation matching
    reads the stream entering each one) see what they see on transformers' own."""

    def __init__(self, heads: int, act, **children: nn.Module):
        super().__init__(**children)
        self.heads, self.act = heads, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, h = self.attention, self.layernorm_before(x)
        mixed = _attend(a.q_proj(h), a.k_proj(h), a.v_proj(h), self.heads, False, None)
        x = x + a.o_proj(mixed)
        return x + self.mlp.fc2(self.act(self.mlp.fc1(self.layernorm_after(x))))


class _GPT2Block(_Node):
    """One causal pre-LN decoder block, called as a module (see _ViTBlock)."""

    def __init__(self, heads: int, act, scale: float | None, **children: nn.Module):
        super().__init__(**children)
        self.heads, self.act, self.scale = heads, act, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(x.shape[-1], dim=2)
        x = x + self.attn.c_proj(_attend(q, k, v, self.heads, True, self.scale))
        return x + self.mlp.c_proj(self.act(self.mlp.c_fc(self.ln_2(x))))


class LiteViT(nn.Module):
    """ViTForImageClassification's forward (pre-LN encoder, CLS token head) in plain torch."""

    def __init__(self, cfg: dict):
        super().__init__()
        d, m, eps = cfg["hidden_size"], cfg["intermediate_size"], cfg["layer_norm_eps"]
        c, size, patch = cfg["num_channels"], cfg["image_size"], cfg["patch_size"]
        self.heads, self.act = cfg["num_attention_heads"], _ACTS[cfg["hidden_act"]]
        n_tokens = (size // patch) ** 2 + 1
        qkv_bias = cfg["qkv_bias"]
        layers = nn.ModuleList(
            _ViTBlock(
                self.heads, self.act,
                attention=_Node(q_proj=_Linear(d, d, bias=qkv_bias),
                                k_proj=_Linear(d, d, bias=qkv_bias),
                                v_proj=_Linear(d, d, bias=qkv_bias), o_proj=_Linear(d, d)),
                layernorm_before=_ln(d, eps), layernorm_after=_ln(d, eps),
                mlp=_Node(fc1=_Linear(d, m), fc2=_Linear(m, d)),
            )
            for _ in range(cfg["num_hidden_layers"])
        )
        emb = _Node(patch_embeddings=_Node(projection=_Patches(c, d, patch)))
        emb.cls_token = _param(1, 1, d)
        emb.position_embeddings = _param(1, n_tokens, d)
        self.vit = _Node(embeddings=emb, layers=layers, layernorm=_ln(d, eps))
        self.classifier = _Linear(d, cfg["num_labels"])

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        emb = self.vit.embeddings
        x = emb.patch_embeddings.projection(pixel_values).flatten(2).transpose(1, 2)
        x = torch.cat([emb.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + emb.position_embeddings
        for blk in self.vit.layers:
            x = blk(x)
        return self.classifier(self.vit.layernorm(x)[:, 0])


class Conv1D(nn.Module):
    """GPT-2's linear layer, weight stored (in, out). Named and shaped (`nf`) as
    transformers' Conv1D, which RegMean's statistics recognise by that name."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.nf = d_out
        self.weight, self.bias = _param(d_in, d_out), _param(d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
            *x.shape[:-1], -1)


class LiteGPT2(nn.Module):
    """GPT2LMHeadModel's forward (causal pre-LN decoder, head tied to wte) in plain torch."""

    TIED = {"lm_head.weight": "transformer.wte.weight"}
    # GPT2PreTrainedModel's own list (old checkpoints' causal masks), mirrored without
    # importing transformers so that rotviz.sources.legacy reads past what transformers does;
    # tests/test_legacy_buffers.py compares the two
    _keys_to_ignore_on_load_unexpected = ("attn.bias", "crossattention.bias")

    def __init__(self, cfg: dict):
        super().__init__()
        d, eps = cfg["n_embd"], cfg["layer_norm_epsilon"]
        m = cfg.get("n_inner") or 4 * d
        self.heads, self.act = cfg["n_head"], _ACTS[cfg["activation_function"]]
        self.scale = None if cfg["scale_attn_weights"] else 1.0
        h = nn.ModuleList(
            _GPT2Block(self.heads, self.act, self.scale, ln_1=_ln(d, eps),
                       attn=_Node(c_attn=Conv1D(d, 3 * d), c_proj=Conv1D(d, d)),
                       ln_2=_ln(d, eps), mlp=_Node(c_fc=Conv1D(d, m), c_proj=Conv1D(m, d)))
            for _ in range(cfg["n_layer"])
        )
        self.transformer = _Node(wte=_Embedding(cfg["vocab_size"], d),
                                 wpe=_Embedding(cfg["n_positions"], d), h=h, ln_f=_ln(d, eps))
        self.lm_head = _Linear(d, cfg["vocab_size"], bias=False)

    def tie(self) -> None:
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        tr = self.transformer
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = tr.wte(input_ids) + tr.wpe(pos)
        for blk in tr.h:
            x = blk(x)
        return self.lm_head(tr.ln_f(x))


def _vit_ok(cfg: dict) -> bool:
    need = ("hidden_size", "intermediate_size", "layer_norm_eps", "num_channels", "image_size",
            "patch_size", "num_attention_heads", "num_hidden_layers", "qkv_bias", "num_labels")
    if not all(k in cfg for k in need if k != "num_labels"):
        return False
    head_dim = cfg.get("head_dim")
    return (cfg.get("hidden_act") in _ACTS and isinstance(cfg["image_size"], int)
            and isinstance(cfg["patch_size"], int)
            and (head_dim is None or head_dim * cfg["num_attention_heads"] == cfg["hidden_size"]))


def _gpt2_ok(cfg: dict) -> bool:
    need = ("n_embd", "layer_norm_epsilon", "n_head", "activation_function", "n_layer",
            "vocab_size", "n_positions")
    return (all(k in cfg for k in need) and cfg["activation_function"] in _ACTS
            and cfg.get("scale_attn_weights", True)
            and not cfg.get("scale_attn_by_inverse_layer_idx")
            and not cfg.get("add_cross_attention") and cfg.get("tie_word_embeddings", True))


# Checkpoints keep transformers 4.x tensor names on disk (5.x writes them back that way);
# the modules above use the names of the loaded 5.x module (rotviz.arch.vit_names), so states are
# interchangeable.


def lite_module(config: dict) -> nn.Module | None:
    """An uninitialised plain-torch module for the config, or None if not covered."""
    arch = (config.get("architectures") or [None])[0]
    cfg = dict(config)
    if arch == "ViTForImageClassification" and config.get("model_type") == "vit":
        if "num_labels" not in cfg:
            cfg["num_labels"] = len(config.get("id2label") or {}) or 2
        return LiteViT(cfg) if _vit_ok(cfg) else None
    if arch == "GPT2LMHeadModel" and config.get("model_type") == "gpt2":
        return LiteGPT2(cfg) if _gpt2_ok(cfg) else None
    return None


def load_lite(ref: str | os.PathLike, device: torch.device | str = "cpu",
              confined: Confined = ANYWHERE) -> Loaded | None:
    """The model as a plain-torch module, or None when the lite path does not cover it.
    Every file is read through `confined` (regular files, inside the roots)."""
    from rotviz.sources.checkpoint import INDEX, SINGLE
    from rotviz.sources.loading import check_weights

    path = resolve_ref(ref, confined)
    config = read_config(path, confined)
    if config.get("auto_map") or not os.path.lexists(Path(path) / SINGLE) or \
            os.path.lexists(Path(path) / INDEX):
        return None
    # load_model's checks of the checkpoint and the config's sizes, before a module of those
    # sizes is built (its tensors are compared with the module's below)
    checkpoint = check_weights(path, config, spec_for(config), confined, fits=False)
    assert checkpoint is not None
    module = lite_module(config)
    if module is None:
        return None
    spec = spec_for(config)
    runtime = {k: runtime_name(k) for k in checkpoint.keys()}
    # old-format buffers (GPT-2's masks and fill values) are read past, as load_model does
    past = read_past(module, spec, config,
                     {runtime[k]: e.shape for k, e in checkpoint.entries.items()})
    weights = checkpoint.read([k for k in checkpoint.keys() if runtime[k] not in past], None)
    weights = {runtime[k]: v for k, v in weights.items()}
    tied = getattr(module, "TIED", {})
    for alias, owner in tied.items():
        if alias in weights:
            if owner not in weights or not torch.equal(weights.pop(alias), weights[owner]):
                return None  # an untied head: not what the lite module computes
    own = {k: v for k, v in module.state_dict().items() if k not in tied}
    if set(weights) != set(own) or any(weights[k].shape != own[k].shape for k in own):
        return None
    stored = floating_dtypes(weights)
    # Half checkpoints run in float32, as `load_model` runs them (the file's tensors are fresh
    # here, so this copies nothing shared).
    weights = {k: v.float() if v.dtype in HALF else v for k, v in weights.items()}
    module.load_state_dict(weights, strict=False, assign=True)
    if tied:
        module.tie()
    module.to(device)
    module.eval()
    module.requires_grad_(False)
    state = dict(module.state_dict())
    check_finite(state, path)
    return Loaded(str(ref), Path(path), config, spec, module, state, stored)


def load_for_eval(ref: str | os.PathLike, device: torch.device | str = "cpu",
                  confined: Confined = ANYWHERE) -> Loaded:
    """A model ready for `rotviz.evaluation.evaluate` on `device`: lite when exact, else full;
    every file read through `confined`."""
    lite = load_lite(ref, device, confined)
    if lite is not None:
        return lite
    loaded = load_model(ref, confined=confined)
    loaded.model.to(device)
    return replace(loaded, state=dict(loaded.model.state_dict()))


"""Loading, running and saving models, safely and offline.

A model reference is a directory in Hugging Face `save_pretrained` format (config.json plus
safetensors, or a pickled `pytorch_model.bin` loaded with `weights_only=True`), `zoo:NAME`, or
`ORG/NAME[@REVISION]`, a model already in the local Hugging Face cache (rotviz.hub).
timm models use the same layout: a config.json with `architecture` (and `model_args`).
What differs between those sources is in their adapters (rotviz.sources). Remote code is never
run and nothing is downloaded.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from rotviz import hub
from rotviz import zoo_registry as zoo
from rotviz.arch import ArchSpec, config_value, spec_for
from rotviz.checkpoint import INDEX, SINGLE, Checkpoint
from rotviz.confine import ANYWHERE, Confined
from rotviz.data.tokens import (
    PROCESSOR_FILES,
    TOKENIZER_FILES,
    encoding_fingerprint,
    processor_fingerprint,
)
from rotviz.devices import SHORT_ATTENTION, wide_device
from rotviz.errors import RotvizError
from rotviz.outputs import Outputs
from rotviz.sanity import check_against, check_sizes
from rotviz.skeleton import check_fits
from rotviz.sources import call, source_of

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
    or a model of the local Hugging Face cache, `ORG/NAME[@REVISION]` (rotviz.hub: its
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
    (rotviz.sanity.check_sizes: a JSON object whose sizes are bounded integers)."""
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
    validated (rotviz.checkpoint: safetensors headers and index; a pickled checkpoint read
    with weights_only=True), then the config compared with its tensor shapes (sizes,
    blocks, tables: rotviz.sanity.check_against; every tensor: rotviz.skeleton
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


def check_same_reading(a: Loaded, b: Loaded, labels: bool = True) -> None:
    """Two models are compared on one set of inputs: they must read them alike. Text: the
    same tokenizer files, or both rotviz's characters (a model that reads none is let through
    here; the first evaluation says why it cannot be fed). Images: the same image processor,
    or neither has one. Classifiers that name the same labels (unless `labels` is False: two
    heads whose outputs are never paired): in the same order, as output i of one is compared
    with output i of the other."""
    if labels:
        check_same_labels(a, b)
    if a.spec.inputs == "pixels":
        pa, pb = processor_fingerprint(a.path), processor_fingerprint(b.path)
        if pa != pb:
            raise RotvizError(
                f"'{a.ref}' and '{b.ref}' read images differently ({pa or 'no processor'} vs "
                f"{pb or 'no processor'}): one set of pixels cannot feed both; save the same "
                "image processor with both")
        return
    try:
        fa = encoding_fingerprint(a.path, a.config, a.ref)
        fb = encoding_fingerprint(b.path, b.config, b.ref)
    except RotvizError:
        return
    if fa != fb:
        raise RotvizError(
            f"'{a.ref}' and '{b.ref}' read text differently ({fa} vs {fb}): one set of ids "
            "cannot feed both; compare two models that share a tokenizer"
        )


def check_same_labels(a: Loaded, b: Loaded) -> None:
    """One line when both models name the same labels (config id2label) in another order:
    matching, interpolating or merging would pair output i of one with another label's
    output of the other, and data labelled for one would score the other against labels it
    never meant. Models with different label sets (say, fine-tunes for two tasks whose
    bodies are compared) and models with unnamed labels (LABEL_i) are taken at their ids,
    as before."""
    from rotviz.data.tasks import named_labels

    try:
        na, nb = named_labels(a.config, a.ref), named_labels(b.config, b.ref)
    except RotvizError:
        return  # an odd id2label is refused where labels are read by name
    if na is not None and nb is not None and na != nb and sorted(na) == sorted(nb):
        def some(names: tuple[str, ...]) -> str:
            return ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")

        raise RotvizError(
            f"'{a.ref}' and '{b.ref}' order their labels differently ({some(na)} vs "
            f"{some(nb)}): output i of one is not output i of the other; compare models "
            "whose config.json id2label are the same")


@dataclass(frozen=True)
class HeadsDiffer:
    """Two models of one body under different heads (a pre-training checkpoint and a
    fine-tuned classifier, two classifiers with different labels): the tensors both hold
    alike (the body, and any head part they share), each one's own head tensors (in one
    model only, or shaped differently), and both head classes. Matching aligns the shared
    tensors; the source's own head moves with its body (its function is kept) but is matched
    against nothing; the anchor's own head is left alone."""

    anchor_head: str
    source_head: str
    shared: tuple[str, ...]
    anchor_only: tuple[str, ...]
    source_only: tuple[str, ...]

    blocks: tuple[str, ...] = ()  # the shared tensors that are a block's
    # the anchor's names of `shared` (which holds the source's), in the same order: a
    # headless model's body is not under the root a headed one's is
    anchor_names: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"anchor_head": self.anchor_head, "source_head": self.source_head,
                "matched": len(self.shared), "matched_outside_blocks": self.outside(),
                "source_only": list(self.source_only), "anchor_only": list(self.anchor_only),
                "summary": self.words()}

    def outside(self) -> list[str]:
        """The shared tensors that are no block's (embeddings, norms, shared head parts)."""
        inside = set(self.blocks)
        return [k for k in self.shared if k not in inside]

    def words(self) -> str:
        """The pair's heads and what matching did with them, in one sentence."""
        def some(names: tuple[str, ...]) -> str:
            return (", ".join(names[:3]) + (", ..." if len(names) > 3 else "")) or "none"

        return (f"heads differ ({self.anchor_head or 'no head'} vs "
                f"{self.source_head or 'no head'}): matched the {len(self.shared)} tensors "
                f"both hold; the source's own {len(self.source_only)} ({some(self.source_only)})"
                f" moved with its body, unmatched; the anchor's own {len(self.anchor_only)} "
                f"({some(self.anchor_only)}) left alone")


def body_patterns(spec: ArchSpec):
    """Regular expressions of a family's block tensors and of its whole body (the blocks,
    the stream's writers, the norms on the stream and the final norm), under its roots."""
    import re

    roots = "|".join(re.escape(r) for r in spec.roots)
    blocks = [re.escape(t).replace(r"\{i\}", r"\d+") for t in spec.block]
    rest = [re.escape(n) + r"(\.|$)" for n in (*spec.writers, *spec.stream_norms,
                                                 *spec.final_norm)]
    return (re.compile(f"^(?:{roots})(?:{'|'.join(blocks)})"),
            re.compile(f"^(?:{roots})(?:{'|'.join(blocks + rest)})"))


def _root(loaded: Loaded) -> str:
    """The prefix `loaded`'s blocks sit under (one of its family's roots: "bert." inside a
    BertForPreTraining, "" in a headless BertModel): the first whose block 0 is present, as
    rotviz.symmetry.view.resolve_layout picks it."""
    firsts = [(r, r + t.format(i=0)) for r in loaded.spec.roots for t in loaded.spec.block]
    return next((r for r, first in firsts if any(k.startswith(first) for k in loaded.state)),
                "")


def heads_differ(a: Loaded, b: Loaded) -> HeadsDiffer | None:
    """How `a` and `b` differ where they hold the same body under different heads; None when
    they hold the same tensors (the same head), or when their bodies differ (then
    check_compatible says how). A headless model's body sits at the top (BertModel's
    `encoder...`), a headed one's under its root (`bert.encoder...`): tensors are paired by
    their names under the root."""
    from rotviz.heads import head_of_config

    if a.spec.family != b.spec.family:
        return None
    blocks, body = body_patterns(a.spec)
    ra, rb = _root(a), _root(b)

    def under(k: str, root: str) -> str:
        return k[len(root):] if k.startswith(root) else k

    names_a = {under(k, ra): k for k in a.state}
    names_b = {under(k, rb): k for k in b.state}
    pairs = [(names_a[r], k) for r, k in names_b.items()
             if r in names_a and a.state[names_a[r]].shape == b.state[k].shape]
    if ra == rb and len(pairs) == len(a.state) == len(b.state):
        return None
    paired_a, paired_b = {x for x, _ in pairs}, {y for _, y in pairs}
    own_a = tuple(k for k in a.state if k not in paired_a)
    own_b = tuple(k for k in b.state if k not in paired_b)
    if any(body.match(k) for k in (*own_a, *own_b)) or not any(body.match(y) for _, y in pairs):
        return None
    shared = tuple(y for _, y in pairs)
    return HeadsDiffer(head_of_config(a.config).class_name, head_of_config(b.config).class_name,
                       shared, own_a, own_b, tuple(k for k in shared if blocks.match(k)),
                       tuple(x for x, _ in pairs))


def check_compatible(a: Loaded, b: Loaded, heads: bool = False) -> None:
    """Two models must share family, config shape fields and tensor shapes to be matched.
    With `heads`, a pair of one body under different heads (`heads_differ`) is let through
    too (matching aligns the body; a measurement of the loss needs one head on both)."""
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
    if not fields and (shapes or only) and heads_differ(a, b) is not None:
        if heads:
            check_same_reading(a, b, labels=False)
            return
        from rotviz.heads import head_of_config

        ha, hb = (head_of_config(m.config).class_name or "no head" for m in (a, b))
        raise RotvizError(
            f"'{a.ref}' ({ha}) and '{b.ref}' ({hb}) share a body under different heads, which "
            "only matching in memory and the views of the weights (distances, spectra) "
            "compare: a loss runs one head on both, a streamed run pairs tensors by name")
    if not (fields or shapes or only):
        check_same_reading(a, b)
    if fields or shapes or only:
        parts = fields or shapes[:3] or [f"tensors only in one model: {only[:3]}"]
        raise RotvizError(
            f"models differ in shape: {'; '.join(parts)}; match two models of one architecture"
        )


# ---- running ------------------------------------------------------------------------------


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
            and hasattr(module, "set_attn_implementation"))


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


# ---- saving ---------------------------------------------------------------------------------


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
    """The files of `state` as a model of `template`'s class, into the (empty) `folder`."""
    tmp = folder
    dtypes = template.stored_dtypes  # each tensor back in the checkpoint's dtype
    cpu = {k: v.detach().to("cpu", dtypes.get(k, v.dtype)).contiguous()
           for k, v in state.items()}
    source_of(template.spec).write_state(template.spec, template.path, template.config, cpu, tmp)
    copy_reading_files(template.path, tmp)
    for name, text in (extra_files or {}).items():
        (tmp / name).write_text(text)


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

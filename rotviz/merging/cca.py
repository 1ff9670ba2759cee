"""CCA Merge (Horoi et al., ICML 2024, "Harmony in Diversity: Merging Neural Networks with
Canonical Correlation Analysis"): align each model onto the anchor with linear maps found by
canonical correlation analysis of their activations, then take the weighted average.

Why linear maps and not permutations: two networks trained from different inits rarely hold
the same features one for one; a feature of one is often a mix of several of the other's.
CCA finds, for each site, the directions of the two activation spaces that correlate most
and maps the source's space onto the anchor's through them, so mixes are aligned too.

Per site, with centred covariances S_aa, S_bb, S_ab of the anchor's (a) and the source's
(b) activations on the same examples, each S_aa, S_bb regularised (below), and
S_aa^-1/2 S_ab S_bb^-1/2 = U diag(rho) V^T, the map

    T = S_bb^-1/2 V U^T S_aa^1/2,    T^-1 = S_aa^-1/2 U V^T S_bb^1/2

sends the source's activations onto the anchor's (x_a ~ x_b T, row vectors): both sides'
canonical variates x S^-1/2 U (anchor) and x S^-1/2 V (source) are paired. T^-1 is exact
(not a pseudo-inverse), so a model aligned onto itself is itself. The sites are:

- the residual stream: one map T for the whole stream (every block's input and the final
  norm's input, their covariances summed, as activation matching sums its cross-covariances,
  rotviz.match.datamatch). Writers' outputs are mapped by T (W -> T^T W, b -> b T,
  embeddings E -> E T), readers' inputs by T^-1 (W -> W T^-T), on canonical forms (gains
  folded, writers centred: rotviz.symmetry.residual) put back into the anchor's gauge. On a
  pre-norm LayerNorm stream the map acts on the complement of the all-ones vector and keeps
  that vector (as the stream's symmetry does). A post-norm stream (LayerNorm on the stream
  itself) keeps the basis the matching before gave it: no linear map but a permutation
  passes such a norm, so only the FFN units are aligned there.
- each FFN's hidden units (the input of its down projection): the up rows W_in -> T^T W_in
  (bias b_in T), the down columns W_out -> W_out T^-T. A gated FFN's gate rows are mixed by
  T with each column divided by its largest-magnitude entry, so a permutation with scales
  (the gated FFN's own symmetry, scales on the up map only) is undone exactly.

Attention heads keep the alignment of the matching before (`--match`): CCA Merge is applied
after it, and CCA does not depend on the basis the source arrives in.

Regularisation (`cca_reg`, r): the stream's covariance gets r * trace(S) / d on its diagonal,
the FFN's r * diag(S) (plus 1e-9 of its mean, for dead units): each ridge is equivariant
under its site's own symmetry (rotations of the stream; permutations and positive scales of
units), so a copy of the anchor moved by that symmetry is recovered exactly at any r.

The statistics of a model are its weights aligned onto the anchor (and the maps, under
`cca:` keys): CCA needs the two models' activations on the same examples, so they are taken
together, both on the seeded batches of the statistics split. The anchor's statistics are
empty (it is its own alignment). The merge is then the weighted average of the aligned
weights; it needs whole models and data, so it does not run at size.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rotviz.limits import CCA_REG
from rotviz.merging.registry import MergeMethod, register
from rotviz.merging.statistics import STATS_PARAMS, stats_batches
from rotviz.params import Param

if TYPE_CHECKING:
    import torch

    from rotviz.data.split import Split
    from rotviz.merging.registry import MergeJob
    from rotviz.sources.loading import Loaded
    from rotviz.symmetry.view import ModelView
    from rotviz.types import Progress

    Tensor = torch.Tensor

MAP = "cca:"  # prefix of the statistics keys that hold maps, never a parameter's name
FLOOR = 1e-9  # share of the mean variance every FFN unit's ridge has at least (dead units)


# ---- the maps -------------------------------------------------------------------------------


class Moments:
    """Float64 sums of a site's paired activations (anchor a, source b): count, sums,
    a^T a, b^T b and a^T b, from which the centred covariances come."""

    def __init__(self) -> None:
        self.n = 0
        self.sums: list[Tensor] = []

    def add(self, a: Tensor, b: Tensor) -> None:
        a, b = a.double(), b.double()
        parts = [a.sum(0), b.sum(0), a.T @ a, b.T @ b, a.T @ b]
        self.sums = parts if not self.sums else [s + p for s, p in zip(self.sums, parts,
                                                                       strict=True)]
        self.n += a.shape[0]

    def covariances(self) -> tuple[Tensor, Tensor, Tensor]:
        """(S_aa, S_bb, S_ab), centred, divided by the count."""
        sa, sb, aa, bb, ab = (s / self.n for s in self.sums)
        return aa - sa[:, None] * sa, bb - sb[:, None] * sb, ab - sa[:, None] * sb


def _sqrt_pair(s: Tensor) -> tuple[Tensor, Tensor]:
    """(S^1/2, S^-1/2) of a symmetric positive definite S."""
    import torch

    w, v = torch.linalg.eigh(s)
    w = w.clamp_min(torch.finfo(w.dtype).tiny)
    return (v * w.sqrt()) @ v.T, (v / w.sqrt()) @ v.T


def cca_map(s_aa: Tensor, s_bb: Tensor, s_ab: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(T, T^-1, rho): the map sending the source's activations onto the anchor's
    (x_a ~ x_b T) from (already regularised) covariances, its exact inverse, and the
    canonical correlations, largest first."""
    import torch

    a_half, a_inv = _sqrt_pair(s_aa)
    b_half, b_inv = _sqrt_pair(s_bb)
    u, rho, vh = torch.linalg.svd(a_inv @ s_ab @ b_inv, full_matrices=False)
    return b_inv @ vh.T @ u.T @ a_half, a_inv @ u @ vh @ b_half, rho


def ridge_stream(s: Tensor, reg: float) -> Tensor:
    """S + r trace(S) / d I: the same for any rotation of the stream."""
    import torch

    scale = float(torch.diagonal(s).mean())
    return s + reg * scale * torch.eye(len(s), dtype=s.dtype, device=s.device)


def ridge_units(s: Tensor, reg: float) -> Tensor:
    """S + r diag(S) (+ a floor): the same for any permutation and scaling of the units."""
    import torch

    d = torch.diagonal(s)
    floor = FLOOR * max(float(d.mean()), torch.finfo(s.dtype).tiny)
    return s + torch.diag(reg * d + floor)


# ---- the activations ------------------------------------------------------------------------


def _first(args, kwargs, out) -> Tensor:
    x = out[0] if out else (args[0] if args else next(iter(kwargs.values())))
    return x[0] if isinstance(x, tuple) else x


def paired_moments(loaded: Loaded, state_a: Mapping[str, Tensor],
                   state_b: Mapping[str, Tensor], split: Split, batches: int, batch_size: int,
                   device, seed: int = 0, stream: bool = True,
                   progress: Progress | None = None) -> dict[str, Moments]:
    """The paired moments of both parameter sets (one architecture, `loaded`'s) on the same
    seeded batches of `split`: "stream" (every block's input and the final norm's, summed;
    only with `stream`) and "ffn.<i>" (block i's FFN hidden units). Padding never counts.

    Hooks go on a private copy of the module, never on the loaded (possibly shared) one."""
    import torch

    from rotviz.data.inputs import to_device, token_mask, without_padding
    from rotviz.data.reading import check_fits
    from rotviz.devices import resolve_device
    from rotviz.evaluation import Evaluator
    from rotviz.sources.adapters import call
    from rotviz.symmetry.view import resolve_layout

    check_fits(loaded, split)
    dev = resolve_device(device)
    ev = Evaluator(loaded, split.subset(1), dev)
    module = copy.deepcopy(loaded.model)
    lay = resolve_layout(loaded.spec, state_a)
    seen: dict[str, list[Tensor]] = {}
    real: list[Tensor | None] = [None]

    def keep(key: str):
        def hook(_mod, args, kwargs, *out):
            x = without_padding(_first(args, kwargs, out).detach(), real[0])
            seen.setdefault(key, []).append(x.reshape(-1, x.shape[-1]))
        return hook

    handles = []
    for i, prefix in enumerate(lay.blocks):
        sub = module.get_submodule(prefix.rstrip("."))
        if stream:
            handles.append(sub.register_forward_pre_hook(keep("stream"), with_kwargs=True))
        down = module.get_submodule((prefix + lay.roles["ffn_out"]).rstrip("."))
        handles.append(down.register_forward_pre_hook(keep(f"ffn.{i}"), with_kwargs=True))
    if stream and lay.final_norm is not None:
        handles.append(module.get_submodule(lay.final_norm).register_forward_pre_hook(
            keep("stream"), with_kwargs=True))
    moments: dict[str, Moments] = {}
    todo = list(stats_batches(split, batches, batch_size, seed))
    params = [ev.params(state_a), ev.params(state_b)]
    try:
        with torch.inference_mode():
            for j, (x, _) in enumerate(todo):
                x = to_device(x, dev)
                real[0] = token_mask(x)
                runs = []
                for p in params:
                    seen.clear()
                    call(loaded.spec, module, {**ev.buffers, **p}, x, strict=True)
                    runs.append({k: torch.cat(v) for k, v in seen.items()})
                for key, a in runs[0].items():
                    moments.setdefault(key, Moments()).add(a, runs[1][key])
                if progress:
                    progress(j + 1, len(todo), "CCA activations")
    finally:
        for h in handles:
            h.remove()
    return moments


# ---- the alignment --------------------------------------------------------------------------


def stream_basis(view: ModelView) -> Tensor | None:
    """The basis (d, d - 1) the stream map acts on for a pre-norm LayerNorm stream (the
    complement of all-ones), None where it acts on the whole stream (RMSNorm)."""
    from rotviz.groups import ones_complement
    from rotviz.symmetry.residual import group_of

    return ones_complement(view.dims.d_model) if group_of(view) == "centred" else None


def stream_map(m: Moments, reg: float, basis: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """(T, T^-1, rho) of the residual stream; with `basis`, found on the complement of
    all-ones and lifted to keep all-ones (T 1 = 1)."""
    import torch

    s_aa, s_bb, s_ab = m.covariances()
    if basis is None:
        return cca_map(ridge_stream(s_aa, reg), ridge_stream(s_bb, reg), s_ab)
    z = basis.to(s_aa)
    t, ti, rho = cca_map(ridge_stream(z.T @ s_aa @ z, reg), ridge_stream(z.T @ s_bb @ z, reg),
                         z.T @ s_ab @ z)
    ones = torch.full((len(z), len(z)), 1.0 / len(z), dtype=z.dtype)
    return z @ t @ z.T + ones, z @ ti @ z.T + ones, rho


def unit_map(m: Moments, reg: float) -> tuple[Tensor, Tensor, Tensor]:
    """(T, T^-1, rho) of one FFN's hidden units."""
    s_aa, s_bb, s_ab = m.covariances()
    return cca_map(ridge_units(s_aa, reg), ridge_units(s_bb, reg), s_ab)


def _gate_map(t: Tensor) -> Tensor:
    """T with each column divided by its largest-magnitude entry (for a gated FFN's gate)."""
    import torch

    top = t.gather(0, t.abs().argmax(0, keepdim=True))
    return t / torch.where(top == 0, torch.ones_like(top), top)


def map_units(view: ModelView, maps: Mapping[int, tuple[Tensor, Tensor]]) -> ModelView:
    """Each block i's FFN hidden units moved by maps[i] = (T, T^-1): h -> h T."""
    from rotviz.symmetry.view import FFN

    def rows(t: Tensor | None, m: Tensor) -> Tensor | None:  # (m, ...) rows mixed: m^T t
        return None if t is None else (m.T.to(t) @ t if t.dim() == 2 else t @ m.to(t))

    for i, (t, ti) in maps.items():
        blk = view.blocks[i]
        f = blk.ffn
        g = _gate_map(t) if f.w_gate is not None else t
        f = FFN(rows(f.w_in, t), rows(f.b_in, t), f.w_out @ ti.T.to(f.w_out), f.b_out,
                f.activation, rows(f.w_gate, g), rows(f.b_gate, g))
        view = view.with_block(i, replace(blk, ffn=f))
    return view


def map_stream(view: ModelView, t: Tensor, ti: Tensor) -> ModelView:
    """The canonical `view` with its stream moved by T: x -> x T. Writers W (d, in) -> T^T W,
    their biases, embeddings and norm biases b -> b T; readers W (out, d) -> W T^-T (the
    input they see is mapped back). With an orthogonal T this is
    rotviz.symmetry.residual.apply_residual; here T may be any invertible map."""
    from rotviz.symmetry.residual import _is_projection, tied_pairs
    from rotviz.symmetry.view import FFN, Block, Norm

    tt, back = t.T, ti.T  # writers' left factor; readers' right factor T^-T

    def w(x: Tensor | None) -> Tensor | None:  # a vector or table in the stream: x T
        return None if x is None else x @ t.to(x)

    def rd(x: Tensor | None) -> Tensor | None:  # a reader: x T^-T
        return None if x is None else x @ back.to(x)

    blocks = []
    for blk in view.blocks:
        a, f = blk.attn, blk.ffn
        a = replace(a, wq=rd(a.wq), wk=rd(a.wk), wv=rd(a.wv), wo=tt.to(a.wo) @ a.wo,
                    bo=w(a.bo), wpq=w(a.wpq), wpk=w(a.wpk))
        f = FFN(rd(f.w_in), f.b_in, tt.to(f.w_out) @ f.w_out, w(f.b_out), f.activation,
                rd(f.w_gate), f.b_gate)
        norms = {s: Norm(n.weight, w(n.bias), s) for s, n in blk.norms.items()}
        blocks.append(Block(a, f, norms))
    other = dict(view.other)
    lay = view.layout
    for key in lay.writers:
        x = other[key]
        other[key] = ((tt.to(x) @ x.reshape(x.shape[0], -1)).reshape(x.shape)
                      if _is_projection(view, key) else w(x))
    for mod in lay.readers:
        other[f"{mod}.weight"] = rd(other[f"{mod}.weight"])
    for mod in list(lay.stream_norms) + ([lay.final_norm] if lay.final_norm else []):
        if f"{mod}.bias" in other:
            other[f"{mod}.bias"] = w(other[f"{mod}.bias"])
    for alias, owner in tied_pairs(view):  # one tensor: the alias follows its owner
        if alias not in {f"{m}.weight" for m in lay.readers}:
            other[alias] = other[owner]
    return replace(view, blocks=tuple(blocks), other=other)


def align(loaded: Loaded, state: Mapping[str, Tensor], split: Split, device="cpu",
          seed: int = 0, progress: Progress | None = None, batches: int = 8,
          batch_size: int = 32, cca_reg: float = 1e-2) -> dict[str, Tensor]:
    """align(anchor, source_state, train_split) -> the source's changed tensors, aligned onto
    the anchor (`loaded`'s own state), and the maps: "cca:stream" (T), "cca:stream_inv",
    "cca:stream_rho" and "cca:ffn.<i>", "cca:ffn.<i>_inv", "cca:ffn.<i>_rho" (float64). The
    stream keys are missing where the stream keeps its basis (post-norm; tied embeddings)."""
    import torch

    from rotviz.symmetry import residual as rs
    from rotviz.symmetry.view import read_view, write_state

    spec, config = loaded.spec, loaded.config
    view_a = read_view(spec, config, loaded.state).to(dtype=torch.float64)
    view_b = read_view(spec, config, state).to(dtype=torch.float64)
    stream = rs.group_of(view_b) != "permutation" and rs.unsupported(view_b) is None \
        and not rs.tied_pairs(view_b)
    moments = paired_moments(loaded, loaded.state, state, split, batches, batch_size, device,
                             seed, stream, progress)
    out: dict[str, Tensor] = {}
    maps = {}
    for i in range(len(view_b.blocks)):
        t, ti, rho = unit_map(moments[f"ffn.{i}"], cca_reg)
        maps[i] = (t, ti)
        out |= {f"{MAP}ffn.{i}": t, f"{MAP}ffn.{i}_inv": ti, f"{MAP}ffn.{i}_rho": rho}
    if stream:
        _, gauge = rs.canonicalise(view_a)
        moved, _ = rs.canonicalise(view_b)
        t, ti, rho = stream_map(moments["stream"], cca_reg, stream_basis(view_b))
        out |= {f"{MAP}stream": t, f"{MAP}stream_inv": ti, f"{MAP}stream_rho": rho}
        moved = rs.restore(map_stream(map_units(moved, maps), t, ti), gauge)
    else:
        moved = map_units(view_b, maps)
    written = write_state(moved)
    return out | {k: v for k, v in written.items() if k in state}


def _is_anchor(loaded: Loaded, state: Mapping[str, Tensor]) -> bool:
    import torch

    own = loaded.state
    return state is own or (state.keys() == own.keys()
                            and all(torch.equal(state[k], own[k]) for k in own))


def _statistics(loaded: Loaded, state: Mapping[str, Tensor], split: Split, device,
                seed: int = 0, progress: Progress | None = None, batches: int = 8,
                batch_size: int = 32, cca_reg: float = 1e-2, **_: Any) -> dict[str, Tensor]:
    """The model aligned onto the anchor (`loaded`), or nothing for the anchor itself."""
    if _is_anchor(loaded, state):
        return {}
    return align(loaded, state, split, device, seed, progress, batches, batch_size, cca_reg)


def _combine(job: MergeJob, name: str, tensors: Sequence[Tensor],
             base: Tensor | None) -> Tensor | None:
    """The weighted average of the aligned tensors (a model's own where alignment left it)."""
    assert job.stats is not None
    total = sum(job.weights)
    out = sum(float(w) / total * st.get(name, t).double()
              for w, st, t in zip(job.weights, job.stats, tensors, strict=True))
    return out.to(tensors[0].dtype)


CCA = register(MergeMethod(
    "cca", "CCA Merge",
    "align each model onto the anchor by linear maps from canonical correlation of their "
    "activations (stream and FFN units), then average (Horoi et al., 2024)",
    _combine,
    params=(*STATS_PARAMS,
            Param("cca_reg", 1e-2, "ridge on the CCA covariances, relative to their scale "
                  f"(default 0.01, {CCA_REG.text})", CCA_REG,
                  label="CCA: regularisation", widget=(0.0, 1.0, 0.01))),
    statistics=_statistics, extra=("cca_reg",), order=35))

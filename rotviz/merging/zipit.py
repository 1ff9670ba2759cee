"""ZipIt! (Stoica et al., ICLR 2024, "ZipIt! Merging Models from Different Tasks without
Training"): features are merged within and across models, not only permuted onto each other.

At every feature space the two models' features are pooled (2n of them) and the correlation
matrix of the pool, taken on training data, is zipped greedily: the most correlated pair of
features still apart is merged, whichever models they come from, until n features are left.
A merged feature's similarities to the rest become the smaller of its members', times
`zip_alpha` (0: it merges no further with either model); `zip_beta` is the share of the
merges (n / 2 per model) that may join two features of the same model, after which that
model's features only merge across. The result per space is a 0/1 matrix P (2n x n; P[i, g] = 1
when feature i is in merged feature g): the unmerge U = P and the merge M, P's columns
normalised to the models' weights (the average of a merged feature's members). Merged
features keep the order of their lowest member, so a model zipped with a permuted copy of
itself is given back in its own basis.

In a transformer the feature spaces are the residual stream (one zip for every block, from
the stream pooled over every block's input and the final norm's, as rotviz's activation
matching pools it) and each block's FFN hidden units. Both models are put in canonical form
first (rotviz.symmetry.residual: norm gains folded into their readers, LayerNorm writers
centred), so what reads the stream is a plain linear map. Every tensor then becomes
M_out [W_A 0; 0 W_B] U_in: a reader of the stream W -> sum_X w_X W_X U_X, a writer
W -> sum_X M_X W_X, the FFN input M_f,X W_in,X U_X and output M_X W_out,X U_f,X. Heads are
not zipped: rotviz's attention matching (rotviz.match.layers.match_layers with
attn,rescale,heads: head permutation, per-head Q-K and V-O maps and scales, from the weights)
moves the source's heads onto the anchor's once both are read in the merged stream, and each
head's Q, K, V are averaged (the head dimensions zip across only, as gstoica27/ZipIt #31 asks
for transformers; positions are embeddings, writers of the stream). LayerNorm acts on the
merged stream: exact when the zip is a permutation, an approximation otherwise.

Partial zip (`zip_layers` k): the embeddings and the first k blocks are zipped; the merged
stream entering block k is unmerged (x_X = U_X x) into each model's own blocks k.., final
norm and head, and the two outputs (logits) are averaged with the models' weights (equal at
--weight 0.5), as the paper evaluates partial zips. k = 0 is the two models side by side
(their logits averaged: the ensemble); k = -1 (or the depth) zips everything and makes one
model of the family. A partial zip is no single parameter set: the merge record evaluates it
here (`evaluate`) and refuses to write it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from rotviz.errors import RotvizError
from rotviz.limits import ZIP_ALPHA, ZIP_BETA, ZIP_LAYERS
from rotviz.merging.registry import MergeMethod, register
from rotviz.merging.statistics import STATS_PARAMS
from rotviz.params import Param

if TYPE_CHECKING:
    import numpy as np
    import torch

    from rotviz.data.split import Split
    from rotviz.evaluation import Evaluator
    from rotviz.merging.registry import MergeJob
    from rotviz.sources.loading import Loaded
    from rotviz.symmetry.view import ModelView
    from rotviz.types import Progress

    Tensor = torch.Tensor

HEADS = "attn,rescale,heads"  # rotviz's attention matching the source's heads get
STREAM = "stream"  # statistics key of the pooled stream features; FFN units: "ffn.<block>"


# ---- the greedy zip ----------------------------------------------------------------------------


def correlation(fa: Tensor, fb: Tensor) -> Tensor:
    """The (2n x 2n) correlation of the pooled features [fa | fb] (rows: the same tokens in
    both), float64; a constant feature correlates 0 with everything."""
    import torch

    f = torch.cat([fa, fb], dim=1).double()
    f = f - f.mean(0)
    cov = f.T @ f / max(1, f.shape[0])
    std = cov.diagonal().clamp_min(0).sqrt()
    return cov / torch.outer(std, std).clamp_min(1e-12)


def zip_groups(corr: np.ndarray | Tensor, alpha: float = 0.3, beta: float = 0.125
               ) -> list[list[int]]:
    """The merged features of a 2n x 2n pooled correlation (features 0..n-1 of the anchor,
    n..2n-1 of the source): n groups of feature indices, each sorted, in the order of their
    lowest member. Greedy: the most correlated pair of groups is merged until n are left; a
    merged group's similarities are the smaller of its members' times `alpha` (alpha 0: it
    merges no further with either model's features); once n / 2 * `beta` merges within one
    model are spent (none allowed when that rounds to 0), that model's groups merge only
    across."""
    import numpy as np

    sims = np.array(corr, dtype=np.float64, copy=True)
    size = sims.shape[0]
    if sims.ndim != 2 or sims.shape[1] != size or size % 2:
        raise ValueError(f"a pooled correlation of two models is 2n x 2n, got {sims.shape}")
    n = size // 2
    np.fill_diagonal(sims, -np.inf)
    origin = np.repeat([0, 1], n)  # the model of each group's lowest member
    members = [[i] for i in range(size)]
    alive = np.ones(size, dtype=bool)
    budget = [int(n // 2 * beta + 1e-4)] * 2

    def close_within(model: int) -> None:
        own = alive & (origin == model)
        sims[np.ix_(own, own)] = -np.inf

    for model in (0, 1):
        if budget[model] <= 0:
            close_within(model)
    for _ in range(n):
        flat = int(np.argmax(sims))
        i, j = divmod(flat, size)
        if not np.isfinite(sims[i, j]):
            raise ValueError("ZipIt! found no pair of features left to merge")
        i, j = min(i, j), max(i, j)
        new = np.minimum(sims[:, i], sims[:, j])
        if alpha > 0:
            new = new * alpha
        else:
            new[(origin == origin[i]) | (origin == origin[j])] = -np.inf
        members[i] += members[j]
        alive[j] = False
        new[~alive] = -np.inf
        new[i] = -np.inf
        sims[:, i], sims[i, :] = new, new
        sims[:, j], sims[j, :] = -np.inf, -np.inf
        if origin[i] == origin[j]:
            budget[origin[i]] -= 1
            if budget[origin[i]] <= 0:
                close_within(int(origin[i]))
    return [sorted(members[g]) for g in np.flatnonzero(alive)]


@dataclass(frozen=True)
class Zip:
    """One feature space zipped: the unmerge U_X (n x n_merged: x_X = U_X x) and merge M_X
    (n_merged x n: x = sum_X M_X x_X) of each model (anchor, source), float64."""

    groups: tuple[tuple[int, ...], ...]
    unmerge: tuple[Tensor, Tensor]
    merge: tuple[Tensor, Tensor]

    @staticmethod
    def of(groups: Sequence[Sequence[int]], weights: Sequence[float]) -> Zip:
        """U and M from the groups, a merged feature the weighted mean of its members."""
        import torch

        n = len(groups)
        p = torch.zeros(2 * n, n, dtype=torch.float64)
        for g, mem in enumerate(groups):
            p[list(mem), g] = 1.0
        w = torch.tensor([float(weights[0])] * n + [float(weights[1])] * n, dtype=torch.float64)
        pw = p * w[:, None]
        total = pw.sum(0, keepdim=True)
        # a merged feature of a model weighted 0 only: the plain mean of its members
        m = torch.where(total > 0, pw / total.clamp_min(1e-300), p / p.sum(0, keepdim=True))
        return Zip(tuple(tuple(g) for g in groups), (p[:n], p[n:]), (m[:n].T, m[n:].T))

    def across(self) -> Tensor:
        """For each anchor feature, the source feature it was merged with (-1: none)."""
        import torch

        n = len(self.groups)
        out = torch.full((n,), -1, dtype=torch.long)
        for g in self.groups:
            a = [i for i in g if i < n]
            b = [i - n for i in g if i >= n]
            for i in a:
                out[i] = b[0] if b else -1
        return out


def zip_space(fa: Tensor, fb: Tensor, weights: Sequence[float], alpha: float, beta: float
              ) -> Zip:
    """The zip of one feature space from both models' features on the same tokens."""
    return Zip.of(zip_groups(correlation(fa, fb), alpha, beta), weights)


# ---- features ----------------------------------------------------------------------------------


def canonical(loaded: Loaded, state: Mapping[str, Tensor]) -> tuple[ModelView, Any]:
    """(the model's canonical view in float64, its gauge): gains folded and LayerNorm writers
    centred, the basis ZipIt! reads features in and merges weights in. A model whose gains
    cannot be folded (an output head tied to the embedding) is taken as it is, its gains
    then zipped as vectors in the stream (gauge None)."""
    import torch

    from rotviz.symmetry import residual as rs
    from rotviz.symmetry.view import read_view

    view = read_view(loaded.spec, loaded.config, state).to(torch.float64)
    if rs.unsupported(view) is not None:
        return view, None
    return rs.canonicalise(view)


def features(loaded: Loaded, state: Mapping[str, Tensor], split: Split, device,
             batches: int = 8, batch_size: int = 32, seed: int = 0) -> dict[str, Tensor]:
    """The features ZipIt! zips, on `batches` seeded batches of `split` (the same examples
    for every model with the same seed): the stream at every block's input and at the end,
    stacked (STREAM), and each block's FFN hidden units after the activation ("ffn.<i>"), as
    (tokens, width) float64 matrices, every non-padding token once."""
    import numpy as np
    import torch

    from rotviz.devices import resolve_device
    from rotviz.match.datamatch import activations
    from rotviz.merging.statistics import stats_batches

    next(stats_batches(split, batches, batch_size, seed))  # the others' one-line checks
    index = np.random.default_rng(seed).permutation(split.n)[: batches * batch_size]
    part = split.take(torch.as_tensor(np.sort(index)))
    streams, hidden = activations(loaded, canonical(loaded, state)[0], part,
                                  resolve_device(device), batch_size)
    return {STREAM: torch.cat(streams), **{f"ffn.{i}": h for i, h in enumerate(hidden)}}


# ---- carrying one model into the merged basis --------------------------------------------------


def _carried(view: ModelView, share: float, stream: Zip, ffn: Sequence[Zip], x: int,
             folded: bool = True) -> ModelView:
    """Model x's part of the merged model (the merged model is the sum of both parts): readers
    of the stream W w_x U_x, writers M_x W, FFN units through their own zip, every other
    floating tensor times w_x (`share`). x = 0: the anchor, 1: the source. `folded`: the
    view is canonical (pre-norm gains folded into their readers); otherwise every gain is
    a vector in the stream, zipped as the stream's features are."""
    from rotviz.symmetry import residual as rs
    from rotviz.symmetry.view import FFN, Block, Norm

    u, m = stream.unmerge[x], stream.merge[x]
    group = rs.group_of(view) if folded else "permutation"

    def rd(t):  # a reader of the stream (..., d) -> (..., d_merged), averaged
        return None if t is None else share * (t @ u.to(t))

    def vec(t):  # a vector in the stream (..., d): merged as features are
        return None if t is None else t @ m.T.to(t)

    def avg(t):
        return None if t is None else share * t

    blocks = []
    for i, blk in enumerate(view.blocks):
        a, f = blk.attn, blk.ffn
        a = replace(a, wq=rd(a.wq), wk=rd(a.wk), wv=rd(a.wv), wpq=rd(a.wpq), wpk=rd(a.wpk),
                    bq=avg(a.bq), bk=avg(a.bk), bv=avg(a.bv), bpq=avg(a.bpq), bpk=avg(a.bpk),
                    gq=avg(a.gq), gk=avg(a.gk), wo=m.to(a.wo) @ a.wo, bo=vec(a.bo))
        uf, mf = ffn[i].unmerge[x], ffn[i].merge[x]

        w_in, b_in = _unit_in(f.w_in, f.b_in, mf, u)
        w_gate, b_gate = _unit_in(f.w_gate, f.b_gate, mf, u)
        f = FFN(w_in, b_in, m.to(f.w_out) @ f.w_out @ uf.to(f.w_out), vec(f.b_out),
                f.activation, w_gate, b_gate)
        norms = {}
        for site, nm in blk.norms.items():
            gain = vec(nm.weight) if rs.moves_with_stream(site, group) else avg(nm.weight)
            norms[site] = Norm(gain, vec(nm.bias), site)
        blocks.append(Block(a, f, norms))
    lay = view.layout
    other = {k: avg(t) if t.is_floating_point() else t for k, t in view.other.items()}
    for key in lay.writers:
        t = view.other[key]
        if key.endswith(".weight") and any(key.endswith(f"{p}.weight")
                                           for p in view.spec.projections):
            other[key] = (m.to(t) @ t.reshape(t.shape[0], -1)).reshape(m.shape[0],
                                                                       *t.shape[1:])
        else:
            other[key] = vec(t)
    for mod in lay.readers:
        other[f"{mod}.weight"] = rd(view.other[f"{mod}.weight"])
    for mod in (*lay.stream_norms, *([lay.final_norm] if lay.final_norm else [])):
        for part in ("weight", "bias"):
            key = f"{mod}.{part}"
            if key in view.other and (part == "bias" or group == "permutation"):
                other[key] = vec(view.other[key])
    for alias, owner in rs.tied_pairs(view):  # one tensor: the alias follows its owner
        other[alias] = other[owner]
    return replace(view, blocks=tuple(blocks), other=other)


def _unit_in(w: Tensor | None, b: Tensor | None, mf: Tensor, u: Tensor
             ) -> tuple[Tensor | None, Tensor | None]:
    """An FFN input map (rows: units, columns: the stream) and its bias, zipped: M_f W U."""
    if w is None:
        return None, None
    return mf.to(w) @ w @ u.to(w), None if b is None else mf.to(b) @ b


def _add(x: Any, y: Any) -> Any:
    """Two parts of the merged model summed, tensor by tensor (integer tensors: the first)."""
    import torch

    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return x + y if x.is_floating_point() else x
    if isinstance(x, Mapping):
        return {k: _add(v, y[k]) for k, v in x.items()}
    return replace(x, **{f.name: _add(getattr(x, f.name), getattr(y, f.name))
                         for f in fields(x) if f.name != "site" and f.name != "activation"})


@dataclass(frozen=True)
class Zipped:
    """Two models zipped: the merged canonical view (every block zipped), the zips, the
    source's head permutation per block, each model's canonical view, the depth zipped
    (`layers`, 0..depth) and the anchor's gauge, which the written model is put back in."""

    merged: ModelView
    stream: Zip
    ffn: tuple[Zip, ...]
    heads: tuple[Tensor | None, ...]
    views: tuple[ModelView, ModelView]
    layers: int
    gauge: Any = None  # the anchor's (rotviz.symmetry.residual.Gauge); None: not canonical
    weights: tuple[float, float] = (0.5, 0.5)  # the models', summing to 1
    states: tuple[Mapping[str, Tensor], ...] = ()  # the models as given (k = 0 runs them)

    @property
    def depth(self) -> int:
        return len(self.merged.blocks)

    def state(self) -> dict[str, Tensor]:
        """The merged model's state dict (every block zipped; refused for a partial zip)."""
        from rotviz.symmetry.view import write_state

        if self.layers < self.depth:
            raise RotvizError(
                f"a zip of {self.layers} of {self.depth} blocks keeps each model's later blocks "
                "and head, so it is no single model; zip every block (--zip-layers -1), or "
                "evaluate it with `rotviz merge` (without --out)")
        if self.gauge is None:
            return write_state(self.merged)
        from rotviz.symmetry import residual as rs

        # in the anchor's gauge (its gains and writer means): a model zipped with itself
        # is given back as it was, not only as the same function
        return write_state(rs.restore(self.merged, self.gauge))

    def part(self, x: int) -> ModelView:
        """Model x's path through a partial zip, as one view: the zipped embeddings and first
        `layers` blocks, then model x's own blocks, final norm and head (its stream entering
        block `layers` is unmerged by `unmerge(x)`)."""
        own, lay = self.views[x], self.merged.layout
        prefix = set(lay.writers) | {f"{mod}.{p}" for mod in lay.stream_norms
                                     for p in ("weight", "bias")}
        other = {k: (self.merged.other[k] if k in prefix else t) for k, t in own.other.items()}
        blocks = self.merged.blocks[: self.layers] + own.blocks[self.layers:]
        return replace(own, blocks=blocks, other=other)

    def unmerge(self, x: int) -> Tensor:
        return self.stream.unmerge[x]


def zip_models(loaded: Loaded, states: Sequence[Mapping[str, Tensor]],
               stats: Sequence[Mapping[str, Tensor]], weights: Sequence[float] = (0.5, 0.5),
               zip_layers: int = -1, zip_alpha: float = 0.3, zip_beta: float = 0.125,
               heads: str = HEADS) -> Zipped:
    """zip_models(loaded, [anchor, source], [features(anchor), features(source)]) -> Zipped

    ZipIt! of two parameter sets of `loaded`'s architecture from their `features` (same
    examples, same seed). `zip_layers`: blocks zipped (-1: all; 0: none, the ensemble)."""
    if len(states) != 2 or len(stats) != 2:
        raise RotvizError(f"ZipIt! zips two models, got {len(states)}")
    k = _check_depth(loaded, states[0], zip_layers)
    (va, gauge), (vb, _) = canonical(loaded, states[0]), canonical(loaded, states[1])
    folded = gauge is not None
    total = float(weights[0]) + float(weights[1])
    ws = (float(weights[0]) / total, float(weights[1]) / total)
    stream = zip_space(stats[0][STREAM], stats[1][STREAM], ws, zip_alpha, zip_beta)
    ffn = tuple(zip_space(stats[0][f"ffn.{i}"], stats[1][f"ffn.{i}"], ws, zip_alpha, zip_beta)
                for i in range(len(va.blocks)))
    pa = _carried(va, ws[0], stream, ffn, 0, folded)
    pb = _carried(vb, ws[1], stream, ffn, 1, folded)
    # the heads: rotviz's attention matching (head permutation, then the Q-K and V-O maps
    # and their scales, from the weights) moves the source's heads onto the anchor's, both
    # read in the merged stream; a symmetry of the source's attention, so its path keeps
    # its function
    from rotviz.match.layers import match_layers
    from rotviz.match.selection import match_options

    step = match_layers(pa, pb, match_options(heads))
    pb = step.view
    moved = tuple(step.transforms[i].heads if i in step.transforms else None
                  for i in range(len(va.blocks)))
    merged = replace(pa, blocks=tuple(_add(x, y) for x, y in zip(pa.blocks, pb.blocks,
                                                                   strict=True)),
                     other=_add(pa.other, pb.other))
    return Zipped(merged, stream, ffn, moved, (va, vb), k, gauge, ws, tuple(states))


def _check_depth(loaded: Loaded, state: Mapping[str, Tensor], zip_layers: int) -> int:
    """The blocks zipped, 0..depth, from --zip-layers (-1: all; one line beyond the depth)."""
    from rotviz.symmetry.view import resolve_layout

    depth = len(resolve_layout(loaded.spec, state).blocks)
    k = depth if zip_layers == -1 else ZIP_LAYERS.check(zip_layers)
    if not 0 <= k <= depth:
        raise RotvizError(f"--zip-layers must be -1 (all) or from 0 to {depth} (this model's "
                          f"blocks), got {zip_layers}")
    return k


def zipped_logits(loaded: Loaded, zipped: Zipped, x, device, buffers: Mapping[str, Tensor]
                  | None = None, module=None) -> Tensor:
    """The zipped model's output on inputs `x` (on `device`, as `module` is: default the
    loaded model's): one model for a full zip, else both paths' logits averaged with the
    models' weights (each model's own later blocks after the unmerge; k = 0: the
    ensemble)."""
    import torch

    from rotviz.sources.adapters import call
    from rotviz.sources.running import module_copy
    from rotviz.symmetry.view import write_state

    # hooks go on a copy (it shares the weights: never moved here, `module` is on `device`)
    module = module_copy(module if module is not None else loaded.model)
    buffers = dict(buffers or {})

    def run(view: ModelView | Mapping[str, Tensor], u: Tensor | None) -> Tensor:
        state = view if isinstance(view, Mapping) else write_state(view)
        params = {k: v.to(device) for k, v in state.items()}
        handle = None
        if u is not None:
            block = module.get_submodule(zipped.merged.layout.blocks[zipped.layers].rstrip("."))
            handle = block.register_forward_pre_hook(_unmerging(u), with_kwargs=True)
        try:
            with torch.inference_mode():
                return call(loaded.spec, module, {**buffers, **params}, x)
        finally:
            if handle is not None:
                handle.remove()

    if zipped.layers == zipped.depth:
        return run(zipped.merged, None)
    outs = []
    for side in (0, 1):
        view = zipped.states[side] if zipped.layers == 0 else zipped.part(side)
        outs.append(run(view, None if zipped.layers == 0 else zipped.unmerge(side)))
    return zipped.weights[0] * outs[0] + zipped.weights[1] * outs[1]


def _unmerging(u: Tensor):
    """A pre-hook putting the merged stream into one model's basis: x -> x U^T."""

    def hook(_mod, args, kwargs):
        if args:
            h = args[0]
            return (h @ u.T.to(h), *args[1:]), kwargs
        key = next(iter(kwargs))
        h = kwargs[key]
        return args, {**kwargs, key: h @ u.T.to(h)}

    return hook


# ---- the record ----------------------------------------------------------------------------


def _statistics(loaded: Loaded, state: Mapping[str, Tensor], split: Split, device,
                seed: int = 0, progress: Progress | None = None, batches: int = 8,
                batch_size: int = 32, zip_layers: int = -1, **_) -> dict[str, Tensor]:
    _check_depth(loaded, state, zip_layers)  # before the features are taken
    out = features(loaded, state, split, device, batches, batch_size, seed)
    if progress:
        progress(1, 1, "ZipIt! features")
    return out


def _combine(job: MergeJob, name: str, tensors: Sequence[Tensor],
             base: Tensor | None) -> Tensor | None:
    raise RotvizError("ZipIt! merges whole models, not tensor by tensor: use "
                      "rotviz.merging.zipit.zip_models, or `rotviz merge --method zipit`")


def merge_zip(loaded: Loaded, states: Sequence[Mapping[str, Tensor]],
              stats: Sequence[Mapping[str, Tensor]], weights: Sequence[float],
              params: Mapping[str, Any]) -> Zipped:
    """The zip the merge record makes (its parameters checked, defaults for those missing)."""
    values = {p.name: params.get(p.name, p.default) for p in ZIPIT.params}
    return zip_models(loaded, states, stats, weights, values["zip_layers"],
                      values["zip_alpha"], values["zip_beta"])


def _whole(loaded: Loaded, states: Sequence[Mapping[str, Tensor]],
           stats: Sequence[Mapping[str, Tensor]], weights: Sequence[float],
           params: Mapping[str, Any]) -> dict[str, Tensor]:
    """The merged state (every block zipped; a partial zip is refused in one line)."""
    return merge_zip(loaded, states, stats, weights, params).state()


def _evaluate(loaded: Loaded, states: Sequence[Mapping[str, Tensor]],
              stats: Sequence[Mapping[str, Tensor]], weights: Sequence[float],
              params: Mapping[str, Any], ev: Evaluator) -> tuple[float, float] | None:
    """(loss, accuracy) of a partial zip, both paths' logits averaged; None for a full
    zip, which is one model of the family (the caller evaluates its state)."""
    from rotviz.data.tasks import batch_loss

    z = merge_zip(loaded, states, stats, weights, params)
    if z.layers == z.depth:
        return None
    total, correct, count = 0.0, 0, 0
    for x, y in ev.batches:
        logits = zipped_logits(loaded, z, x, ev.device, ev.buffers, ev.module)
        bl, bc, bn = batch_loss(ev.split.task, logits, y)
        total, correct, count = total + bl, correct + bc, count + bn
    return total / count, correct / count


ZIPIT = register(MergeMethod(
    "zipit", "ZipIt!",
    "features merged within and across models from their correlations on training data, "
    "heads rearranged; --zip-layers k zips the first k blocks only (Stoica et al., 2024)",
    _combine,
    params=(*STATS_PARAMS,
            Param("zip_layers", -1, "blocks zipped from the input: -1 every block and the "
                  "head (one model), 0 none (the two models' logits averaged), k the first k, "
                  "each model keeping its later blocks and head (default -1)", ZIP_LAYERS,
                  label="ZipIt!: blocks zipped (-1 all)"),
            Param("zip_alpha", 0.3, "ZipIt!'s alpha: a merged feature's similarities are "
                  "scaled by it, 0 = merged once only (default 0.3)", ZIP_ALPHA,
                  label="ZipIt!: alpha", widget=(0.0, 1.0, 0.05)),
            Param("zip_beta", 0.125, "ZipIt!'s beta: the share of merges that may join two "
                  "features of one model (default 0.125)", ZIP_BETA,
                  label="ZipIt!: beta (within-model share)", widget=(0.0, 1.0, 0.025))),
    statistics=_statistics, extra=("zip_layers", "zip_alpha", "zip_beta"),
    max_models=2, whole=_whole, evaluate=_evaluate, order=210))

"""The continuous symmetry group at one model in Lie-algebra coordinates, and its action,
differentiable in those coordinates: what teleportation (rotviz.measures.teleport) climbs
or descends on, and what "teleporting while training" steps along.

Coordinates. Per block and per KV group g, a Q-K matrix X_g = sum_i c_gi E_i and a V-O
matrix Y_g = sum_i d_gi E_i over the generators E_i that rotviz.analysis.tangents allows the
family (`qk_generators`: any d_h x d_h matrix for plain attention; under RoPE per frequency
pair a scale and a rotation, any matrix on the free dims; under per-head q/k norms only the
rotations of equal-gain pairs; V-O: any matrix), and per FFN unit k a log-scale s_k (gated
and ReLU FFNs only). A coordinate is a dict of tensors keyed "<block>.qk" (H_kv, k_qk),
"<block>.vo" (H_kv, d_h^2) and "<block>.ffn" (m,), the coefficients c, d, s.

The element of a coordinate is A_g = exp(X_g), B_g = exp(Y_g), unit scales exp(s_k), and it
acts through rotviz.symmetry.actions (W_Q -> A^T W_Q, W_K -> A^-1 W_K, ...), so
d/dt act(t e_i) at t = 0 is exactly tangents.py's tangent of generator i (and the
coordinates flattened in `Orbit.flat` order are that module's generator order).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rotviz.errors import RotvizError
from rotviz.sources.loading import Loaded
from rotviz.symmetry.actions import LayerTransform, apply
from rotviz.symmetry.view import read_view, write_state

Tensor = torch.Tensor
F64 = torch.float64
GROUPS = ("qk", "vo", "ffn-scale")
Coords = dict[str, Tensor]


def parse_groups(text: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """'qk,vo' -> ('qk', 'vo'), in GROUPS order; unknown or no names: one line."""
    names = [g.strip() for g in text.split(",")] if isinstance(text, str) else list(text)
    names = [g for g in names if g]
    bad = [g for g in names if g not in GROUPS]
    if bad or not names:
        raise RotvizError(f"unknown symmetry group {', '.join(bad) or '(none)'}: use a comma "
                          f"list of {', '.join(GROUPS)}")
    return tuple(g for g in GROUPS if g in names)


@dataclass(frozen=True)
class Orbit:
    """The group's coordinates at one model (see the module docstring). `bases[li]` holds
    block li's Q-K generators (k_qk, d_h, d_h), V-O generators (d_h^2, d_h, d_h) and FFN
    width, each None where the group is not asked for or the family has none."""

    loaded: Loaded
    groups: tuple[str, ...]
    bases: tuple[dict, ...]

    @classmethod
    def of(cls, loaded: Loaded, groups=("qk", "vo", "ffn-scale"),
           state: Mapping[str, Tensor] | None = None) -> Orbit:
        """The coordinates at `loaded` (its generators read at `state`, the model's own by
        default: q/k-norm gains decide which rotations are allowed). `ffn-scale` on an FFN
        that is neither gated nor ReLU is refused in one line."""
        from rotviz.analysis.tangents import _elementary, ffn_has_scales, qk_generators

        groups = parse_groups(groups)
        st = loaded.state if state is None else state
        view = read_view(loaded.spec, loaded.config, st)
        bases = []
        for blk in view.blocks:
            a, dims = blk.attn, view.dims
            dh = a.wq.shape[1]
            qk = vo = ffn = None
            if "qk" in groups:
                gens = qk_generators(a, dims.rope, dims.qk_norm)
                qk = (torch.stack([e for e, _ in gens]) if gens
                      else torch.zeros(0, dh, dh, dtype=F64))
            if "vo" in groups:
                vo = torch.stack([_elementary(dh, i, j) for i in range(dh) for j in range(dh)])
            if "ffn-scale" in groups:
                if not ffn_has_scales(blk.ffn):
                    ok = ",".join(g for g in groups if g != "ffn-scale") or "qk,vo"
                    raise RotvizError(
                        f"ffn-scale is a symmetry of gated and ReLU FFNs only, not of this "
                        f"model's {blk.ffn.activation} FFN ({loaded.spec.family}); use "
                        f"--group {ok}")
                ffn = blk.ffn.w_in.shape[0]
            bases.append({"qk": qk, "vo": vo, "ffn": ffn, "kv": a.n_kv_heads})
        return cls(loaded, groups, tuple(bases))

    def zeros(self, dtype: torch.dtype = F64, requires_grad: bool = False) -> Coords:
        """The identity's coordinates (all zero), leaves for autograd when asked."""
        out: Coords = {}
        for li, b in enumerate(self.bases):
            for kind in ("qk", "vo"):
                if b[kind] is not None:
                    out[f"{li}.{kind}"] = torch.zeros(b["kv"], b[kind].shape[0], dtype=dtype)
            if b["ffn"] is not None:
                out[f"{li}.ffn"] = torch.zeros(b["ffn"], dtype=dtype)
        return {k: v.requires_grad_(requires_grad) for k, v in out.items()}

    def dimension(self) -> int:
        return sum(v.numel() for v in self.zeros().values())

    def flat(self, coords: Coords) -> Tensor:
        """The coordinates as one vector, in tangents.generators' order (block by block:
        Q-K per KV group, V-O per KV group, FFN units)."""
        return torch.cat([coords[k].reshape(-1) for k in self.zeros()])

    def unflat(self, v: Tensor) -> Coords:
        out, start = {}, 0
        for k, z in self.zeros(v.dtype).items():
            out[k] = v[start:start + z.numel()].reshape(z.shape)
            start += z.numel()
        return out

    def matrices(self, coords: Coords) -> dict[str, Tensor]:
        """The Lie-algebra matrices X (H_kv, d_h, d_h) of each Q-K and V-O coordinate."""
        out = {}
        for li, b in enumerate(self.bases):
            for kind in ("qk", "vo"):
                if b[kind] is not None:
                    c = coords[f"{li}.{kind}"]
                    out[f"{li}.{kind}"] = torch.einsum("gk,kij->gij", c.to(F64),
                                                       b[kind].to(c.device))
        return out

    def transforms(self, coords: Coords) -> dict[int, LayerTransform]:
        """The group element of `coords`, one LayerTransform per block (A = matrix_exp(X),
        unit scales exp(s)), float64, differentiable in `coords`; compose elements with
        LayerTransform.then."""
        mats = self.matrices(coords)
        out = {}
        for li, b in enumerate(self.bases):
            qk = torch.linalg.matrix_exp(mats[f"{li}.qk"]) if b["qk"] is not None else None
            vo = torch.linalg.matrix_exp(mats[f"{li}.vo"]) if b["vo"] is not None else None
            sc = torch.exp(coords[f"{li}.ffn"].to(F64)) if b["ffn"] is not None else None
            out[li] = LayerTransform(qk=qk, vo=vo, ffn_scale=sc)
        return out

    def pullback(self, state: Mapping[str, Tensor], cotangent: Mapping[str, Tensor]
                 ) -> Coords:
        """d/dX <cotangent, act(X, state)> at X = 0: the vector-Jacobian product of the
        action (a function f of the parameters with df/dtheta = cotangent has df/dX this;
        no model runs). `cotangent` names some of the state's tensors; the rest count 0."""
        coords = self.zeros(requires_grad=True)
        with torch.enable_grad():
            moved = self.act(coords, state)
            f = sum((moved[n] * w.to(moved[n].dtype)).sum() for n, w in cotangent.items()
                    if n in moved and moved[n].requires_grad)
            keys = list(coords)
            if not isinstance(f, torch.Tensor):  # nothing the cotangent names moves
                return {k: torch.zeros_like(coords[k]).detach() for k in keys}
            d = torch.autograd.grad(f, [coords[k] for k in keys], allow_unused=True)
        return {k: (x if x is not None else torch.zeros_like(coords[k])).detach()
                for k, x in zip(keys, d, strict=True)}

    def act(self, coords: Coords, state: Mapping[str, Tensor] | None = None
            ) -> dict[str, Tensor]:
        """The state dict moved by the element of `coords` (never mutating `state`),
        differentiable in `coords`, in `state`'s dtypes."""
        return act_element(self.loaded, self.transforms(coords), state)


def act_element(loaded: Loaded, element: Mapping[int, LayerTransform],
                state: Mapping[str, Tensor] | None = None, dtype: torch.dtype | None = None
                ) -> dict[str, Tensor]:
    """`state` (the model's own by default) moved by a group element (per block), through
    rotviz.symmetry.actions; with `dtype`, computed in it (float64: the written model loses
    only its final rounding) and written back in `state`'s dtypes."""
    st = loaded.state if state is None else state
    import warnings

    view = read_view(loaded.spec, loaded.config, st)
    if dtype is not None:
        view = view.to(dtype)
    with warnings.catch_warnings():  # the q/k-norm check reads floats off the graph: fine
        warnings.filterwarnings("ignore", "Converting a tensor with requires_grad")
        return write_state(apply(view, dict(element)))


def conditions(element: Mapping[int, LayerTransform]) -> list[dict[str, list[float]]]:
    """Per block, the condition number (2-norm) of each KV group's Q-K and V-O map, and the
    largest over min ratio of its FFN unit scales: how far the element is from orthogonal,
    which bounds the rounding a float32 model gains from it."""
    out = []
    for li in sorted(element):
        t = element[li]
        row: dict[str, list[float]] = {}
        for kind in ("qk", "vo"):
            m = getattr(t, kind)
            if m is not None:
                row[kind] = [float(x) for x in torch.linalg.cond(m.detach().to(F64))]
        if t.ffn_scale is not None:
            s = t.ffn_scale.detach().abs()
            row["ffn"] = [float(s.max() / s.min())]
        out.append(row)
    return out


def max_condition(element: Mapping[int, LayerTransform]) -> float:
    """The largest condition number of any map or scale ratio of the element (1: none)."""
    vals = [x for row in conditions(element) for v in row.values() for x in v]
    return max(vals, default=1.0)


def compose(first: Mapping[int, LayerTransform], then: Mapping[int, LayerTransform]
            ) -> dict[int, LayerTransform]:
    """The element that applies `first`, then `then` (block by block), detached."""
    out = {}
    for li in sorted(set(first) | set(then)):
        a, b = first.get(li), then.get(li)
        t = b if a is None else a if b is None else a.then(b)
        out[li] = LayerTransform(*(None if x is None else x.detach() for x in
                                   (t.perm, t.qk, t.vo, t.heads, t.ffn_scale)))
    return out

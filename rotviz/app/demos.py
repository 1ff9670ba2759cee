"""The Learn page's demonstrations: scramble a model with a random symmetry, show that its
outputs stay, and match it back (per layer: permute, rotate, rescale; or its residual
stream). Each returns numpy arrays and floats the page draws; the model is only read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from rotviz.sources.loading import Loaded

LEARN_KINDS = {
    "rotate": dict(ffn=False, attn=True, rescale=False),
    "permute": dict(ffn=True, attn=False, rescale=False),
    "all": dict(ffn=True, attn=True, rescale=True),
}


def learn_demo(loaded: Loaded, split, kind: str = "rotate", seed: int = 0, layer: int = 0,
               head: int = 0, n_examples: int = 32) -> dict:
    """Scramble a model with a random symmetry, show nothing changed, then match it back.

    Returns the weights of one head (W_Q) or FFN slice in the three models, logits of all
    three on a few examples, distances and accuracies, as numpy arrays and floats. Kind
    "residual" turns the residual stream instead (`residual_demo`).
    """
    if kind == "residual":
        return residual_demo(loaded, split, seed, layer, head, n_examples)
    from rotviz.evaluation import batch_inputs, evaluate
    from rotviz.match.distances import distances
    from rotviz.match.engine import match
    from rotviz.match.options import MatchOptions
    from rotviz.match.pipeline import FUNCTION_TOLERANCE, view_of
    from rotviz.sources.running import forward, max_output_diff
    from rotviz.symmetry.actions import apply, random_element
    from rotviz.symmetry.view import write_state

    if kind not in LEARN_KINDS:
        raise ValueError(f"kind must be one of {sorted([*LEARN_KINDS, 'residual'])}")
    flags = LEARN_KINDS[kind]
    view = view_of(loaded)
    g = random_element(view.dims, seed, **flags)
    scrambled_view = apply(view, g)
    scrambled = write_state(scrambled_view)
    back = match(view, scrambled_view, MatchOptions(**flags))
    restored = write_state(back.view)
    x = split.inputs[:n_examples]
    inputs = batch_inputs(loaded, x)
    logits = {name: forward(loaded, inputs, st).double().numpy()
              for name, st in (("original", None), ("scrambled", scrambled), ("matched", restored))}
    layer = min(layer, view.dims.n_layers - 1)
    head = min(head, view.dims.n_heads - 1)

    def weights(v) -> np.ndarray:
        if kind == "permute":  # the first 24 FFN units' input weights: rows trade places
            return v.blocks[layer].ffn.w_in[:24].detach().double().numpy()
        return v.blocks[layer].attn.wq[head].detach().double().numpy()

    accs = {name: evaluate(loaded, split, st)["acc"]
            for name, st in (("original", None), ("scrambled", scrambled), ("matched", restored))}
    return {
        "kind": kind, "seed": seed, "layer": layer, "head": head,
        "weights": {"original": weights(view), "scrambled": weights(scrambled_view),
                    "matched": weights(back.view)},
        "logits": logits,
        "diff_scrambled": float(np.abs(logits["scrambled"] - logits["original"]).max()),
        "diff_matched": float(np.abs(logits["matched"] - logits["original"]).max()),
        "probe_diff_scrambled": max_output_diff(loaded, loaded.state, scrambled),
        "distance_scrambled": distances(scrambled_view, view).total,
        "distance_matched": distances(back.view, view).total,
        "acc": accs,
        "tolerance": FUNCTION_TOLERANCE,
    }


def _changed(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor],
             atol: float = 1e-6) -> tuple[list[str], list[str], int, int]:
    """Tensors (floating, shared) that differ between two states, those that do not, and how
    many numbers changed out of how many."""
    changed, same, n_changed, n_total = [], [], 0, 0
    for k, x in a.items():
        y = b.get(k)
        if y is None or not x.is_floating_point():
            continue
        diff = (x.detach().double() - y.detach().double()).abs() > atol
        n_changed += int(diff.sum())
        n_total += diff.numel()
        (changed if bool(diff.any()) else same).append(k)
    return changed, same, n_changed, n_total


def residual_demo(loaded: Loaded, split, seed: int = 0, layer: int = 0, head: int = 0,
                  n_examples: int = 32) -> dict:
    """The Learn page's residual step: canonicalise the model (fold the norm gains into the
    readers and, for LayerNorm, centre the writers: other weights, same function), turn its
    residual stream by a random element of its group, check the outputs, and match it back
    with the residual map alone.

    When the architecture has no usable residual map (e.g. GPT-2's tied output head) the
    result says why (`unsupported`) and carries only the original model's numbers.
    """
    from rotviz.evaluation import batch_inputs, evaluate
    from rotviz.match.distances import distances
    from rotviz.match.engine import match
    from rotviz.match.options import MatchOptions
    from rotviz.match.pipeline import FUNCTION_TOLERANCE, view_of
    from rotviz.sources.running import forward, max_output_diff
    from rotviz.symmetry import residual as rs
    from rotviz.symmetry.view import write_state

    view = view_of(loaded)
    layer = min(layer, view.dims.n_layers - 1)
    head = min(head, view.dims.n_heads - 1)
    x = split.inputs[:n_examples]
    inputs = batch_inputs(loaded, x)
    group = rs.group_of(view)
    why = rs.unsupported(view)

    def wq(v) -> np.ndarray:
        return v.blocks[layer].attn.wq[head].detach().double().numpy()

    out: dict = {"kind": "residual", "seed": seed, "layer": layer, "head": head,
                 "group": group, "group_text": rs.GROUP_TEXT[group], "unsupported": why,
                 "tolerance": FUNCTION_TOLERANCE}
    if why:
        out.update(weights={"original": wq(view)},
                   acc={"original": evaluate(loaded, split)["acc"]})
        return out
    canon, _ = rs.canonicalise(view)
    q = rs.random_map(canon, seed)
    rotated = rs.apply_residual(canon, q.to(canon.blocks[0].attn.wq))
    back = match(view, rotated, MatchOptions(ffn=False, attn=False, rescale=False,
                                             residual=True))
    states = {"canonical": write_state(canon), "rotated": write_state(rotated),
              "matched": write_state(back.view)}
    logits = {"original": forward(loaded, inputs, None).double().numpy()}
    logits.update({k: forward(loaded, inputs, st).double().numpy() for k, st in states.items()})
    changed, same, n_changed, n_total = _changed(states["canonical"], states["rotated"])
    res = back.report.residual or {}
    out.update(
        weights={"original": wq(view), "canonical": wq(canon), "rotated": wq(rotated),
                 "matched": wq(back.view)},
        logits=logits,
        **{f"diff_{k}": float(np.abs(logits[k] - logits["original"]).max()) for k in states},
        **{f"probe_diff_{k}": max_output_diff(loaded, loaded.state, st)
           for k, st in states.items()},
        distance_canonical=distances(canon, view).total,
        distance_rotated=distances(rotated, canon).total,
        distance_rotated_original=distances(rotated, view).total,
        distance_matched=distances(back.view, view).total,
        changed=changed, unchanged=same, numbers_changed=n_changed, numbers_total=n_total,
        angles=rs.angles(q, group),
        matched_angles=res.get("angles") or [],
        acc={"original": evaluate(loaded, split)["acc"],
             **{k: evaluate(loaded, split, st)["acc"] for k, st in states.items()}},
    )
    return out

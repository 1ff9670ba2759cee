"""The app's computations, as plain data (dicts of floats, lists and numpy arrays).

Each function takes loaded models and a data split and returns something the app can cache
by value, export as JSON or CSV and hand to `rotviz.plots`. Nothing here imports streamlit;
loaded models are only read (every transform builds new tensors).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np
import torch

from rotviz.actions import apply, random_element
from rotviz.distances import distances
from rotviz.evaluate import batch_inputs, evaluate
from rotviz.matching import MatchOptions, match
from rotviz.models import Loaded, forward, max_output_diff
from rotviz.pipeline import FUNCTION_TOLERANCE, Matched, view_of
from rotviz.view import write_state

Progress = Callable[[int, int, str], None]

# The five settings the Barrier page compares, as matching SPEC strings (rotviz.matchspec).
BARRIER_SPECS = ("none", "ffn", "attn", "ffn,attn", "seed")

# One line per symmetry toggle: why the function does not change (shown next to the toggle).
WHY_UNCHANGED = {
    "ffn": "Hidden units of an FFN are summed in any order: permuting W_in's rows together with "
           "W_out's columns relabels neurons without changing the sum.",
    "attn": "Attention scores use q·k = (x W_Qᵀ)(x W_Kᵀ)ᵀ: rotating queries and keys by the same R "
            "cancels (R Rᵀ = I); values rotated by R are rotated back by W_O.",
    "rescale": "Multiplying a head's queries by a and dividing its keys by a leaves every q·k "
               "the same (likewise values by b, W_O by 1/b).",
}


def dims_of(loaded: Loaded) -> dict:
    return dataclasses.asdict(view_of(loaded).dims)


def n_params(loaded: Loaded) -> int:
    seen: set[int] = set()
    total = 0
    for p in loaded.model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def symmetry_check(loaded: Loaded, seed: int = 0) -> dict:
    """Apply a random element of the full group (permute, rotate, rescale every layer) and
    measure the largest logit change on probe inputs: the model's own functional check."""
    view = view_of(loaded)
    g = random_element(view.dims, seed, ffn=True, attn=True, rescale=True)
    moved = write_state(apply(view, g))
    diff = max_output_diff(loaded, loaded.state, moved)
    return {"max_output_diff": diff, "passed": diff <= FUNCTION_TOLERANCE,
            "distance": distances(view, view_of_state(loaded, moved)).total}


def view_of_state(loaded: Loaded, state: Mapping[str, torch.Tensor]):
    from rotviz.view import read_view

    return read_view(loaded.spec, loaded.config, state)


def model_card(loaded: Loaded, split) -> dict:
    """What the Models page shows for one model: shape, size, quality and its symmetry check."""
    d = dims_of(loaded)
    ev = evaluate(loaded, split)
    return {
        "ref": loaded.ref,
        "family": loaded.spec.family,
        **d,
        "params": n_params(loaded),
        "loss": ev["loss"],
        "acc": ev["acc"],
        "n_eval": ev["n"],
        "check": symmetry_check(loaded),
    }


def match_summary(matched: Matched, spec: str) -> dict:
    """A `Matched` result as plain data: distances, per-head report, function check."""
    rep = matched.report
    return {
        "spec": spec,
        "report": rep.to_dict(),
        "before_total": rep.before.total,
        "after_total": rep.after.total,
        "max_output_diff": rep.max_output_diff,
        "preserved": matched.preserved,
        "tolerance": FUNCTION_TOLERANCE,
    }


def distance_rows(summary: Mapping) -> list[dict]:
    """Per layer and per kind distances before and after, as one flat table."""
    rows = []
    rep = summary["report"]
    for by in ("per_layer", "per_kind"):
        for key, before in rep["distance_before"][by].items():
            rows.append({"spec": summary["spec"], "group": by[4:], "name": key,
                         "before": before, "after": rep["distance_after"][by].get(key)})
    return rows


def head_rows(summary: Mapping) -> list[dict]:
    """Per layer and head: singular value sums, mean angles, reflections and scales."""
    rows = []
    for lay in summary["report"]["heads"]:
        for h in range(len(lay.get("qk_singular") or lay.get("qk_scale") or [])):
            row = {"spec": summary["spec"], "layer": lay["layer"], "head": h}
            for kind in ("qk", "vo"):
                if lay.get(f"{kind}_singular"):
                    row[f"{kind}_singular_sum"] = float(np.sum(lay[f"{kind}_singular"][h]))
                    row[f"{kind}_mean_angle_deg"] = float(np.mean(lay[f"{kind}_angles"][h]))
                    row[f"{kind}_det"] = lay[f"{kind}_det"][h]
                if lay.get(f"{kind}_scale"):
                    row[f"{kind}_scale"] = lay[f"{kind}_scale"][h]
            row["ffn_moved"] = lay.get("ffn_moved", 0)
            rows.append(row)
    return rows


# ---- the Learn page -------------------------------------------------------------------------

LEARN_KINDS = {
    "rotate": dict(ffn=False, attn=True, rescale=False),
    "permute": dict(ffn=True, attn=False, rescale=False),
    "all": dict(ffn=True, attn=True, rescale=True),
}


def learn_demo(loaded: Loaded, split, kind: str = "rotate", seed: int = 0, layer: int = 0,
               head: int = 0, n_examples: int = 32) -> dict:
    """Scramble a model with a random symmetry, show nothing changed, then match it back.

    Returns the weights of one head (W_Q) or FFN slice in the three models, logits of all
    three on a few examples, distances and accuracies, as numpy arrays and floats.
    """
    if kind not in LEARN_KINDS:
        raise ValueError(f"kind must be one of {sorted(LEARN_KINDS)}")
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

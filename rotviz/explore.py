"""The app's computations, as plain data (dicts of floats, lists and numpy arrays).

Each function takes loaded models and a data split and returns something the app can cache
by value, export as JSON or CSV and hand to `rotviz.plots`. Nothing here imports streamlit;
loaded models are only read (every transform builds new tensors). Importing this module costs
no torch import (the SPEC tables and labels are what a page needs before it computes): each
function imports the engine when it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rotviz.symmetry.registry import DATA_SOLVERS, MAPS, SYMMETRIES

if TYPE_CHECKING:
    import torch

    from rotviz.match.pipeline import Matched
    from rotviz.models import Loaded


# Matching SPEC strings (rotviz.match.selection) the app offers. The seed paper's five first (the
# Barrier page's original comparison), then what goes beyond it: head permutation, the
# residual stream alone, weight matching (seed + heads + residual, alternated), activation matching
# and learned matching (both start from weight matching and need data).
BARRIER_SPECS = ("none", "ffn", "attn", "ffn,attn", "seed")
SPEC_CHOICES = BARRIER_SPECS + ("seed,heads", "residual", "weight", "weight,act",
                                "weight,learned")
# What the Barrier page draws by default: the story in three curves (no matching, the seed
# paper's full method, every data-free map). The seed paper's per-group ablation (ffn, attn,
# ffn,attn) is one click away in the page's picker and on the Match page; drawing it by default
# doubled the first visit's compute. Learned matching trains, so it is opt-in.
DEFAULT_SPECS = ("none", "seed", "weight")
# The Match page's ablation: each option set on its own (the page adds the one chosen).
ABLATION_CHOICES = BARRIER_SPECS + ("seed,heads", "weight")
MERGE_SPECS = SPEC_CHOICES

# One line per symmetry toggle: why the function does not change (shown next to the toggle).
WHY_UNCHANGED = {s.name: s.why for s in SYMMETRIES}


def __getattr__(name: str) -> Any:
    """FUNCTION_TOLERANCE (rotviz.match.pipeline's float32 tolerance) on first use."""
    if name == "FUNCTION_TOLERANCE":
        from rotviz.match.pipeline import FUNCTION_TOLERANCE

        return FUNCTION_TOLERANCE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def view_of(loaded: Loaded):
    """The model's weights as a `ModelView` (rotviz.match.pipeline.view_of), on the CPU."""
    from rotviz.match.pipeline import view_of as view

    return view(loaded)


def _tolerance() -> float:
    from rotviz.match.pipeline import FUNCTION_TOLERANCE

    return FUNCTION_TOLERANCE


def selection(spec: str):
    """The parsed matching string (rotviz.match.selection.Selection): flags and label."""
    from rotviz.match.selection import parse_selection

    return parse_selection(spec)


def spec_label(spec: str) -> str:
    """The canonical text of a SPEC ('act' -> 'weight,act'): one cache key per meaning."""
    return selection(spec).label


def needs_data(spec: str) -> bool:
    s = selection(spec)
    return any(getattr(s, d) for d in DATA_SOLVERS)


def uses_residual(spec: str) -> bool:
    return selection(spec).residual


def learns(spec: str) -> bool:
    return selection(spec).learned


def residual_unsupported(loaded: Loaded) -> str | None:
    """Why residual maps cannot be used on this model (e.g. a tied output head), or None."""
    from rotviz.symmetry.residual import unsupported

    return unsupported(view_of(loaded))


def offered(specs, residual_why: str | None) -> list[str]:
    """The SPECs a pair can use: none with the residual map when the pair has none."""
    return [s for s in specs if residual_why is None or not uses_residual(s)]


def without_residual(spec: str) -> str:
    """The SPEC with the residual map left out (data solvers then start from seed)."""
    s = dataclasses.replace(selection(spec), residual=False)
    if any(getattr(s, d) for d in DATA_SOLVERS) and not any(getattr(s, g) for g in MAPS):
        s = dataclasses.replace(s, ffn=True, attn=True, rescale=True)
    return s.label


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
    from rotviz.match.distances import distances
    from rotviz.models import max_output_diff
    from rotviz.symmetry.actions import apply, random_element
    from rotviz.symmetry.view import write_state

    view = view_of(loaded)
    g = random_element(view.dims, seed, ffn=True, attn=True, rescale=True)
    moved = write_state(apply(view, g))
    diff = max_output_diff(loaded, loaded.state, moved)
    return {"max_output_diff": diff, "passed": diff <= _tolerance(),
            "distance": distances(view, view_of_state(loaded, moved)).total}


def view_of_state(loaded: Loaded, state: Mapping[str, torch.Tensor]):
    from rotviz.symmetry.view import read_view

    return read_view(loaded.spec, loaded.config, state)


def model_card(loaded: Loaded, split) -> dict:
    """What the Models page shows for one model: shape, size, quality and its symmetry check."""
    from rotviz.evaluation import evaluate
    from rotviz.tasks import describe

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
        **describe(split.task),  # task, name, metrics
        "scores": {k: v for k, v in ev.items() if k not in ("loss", "acc", "n")},
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
        "tolerance": _tolerance(),
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


def objective_rows(summary: Mapping) -> list[dict]:
    """The weight-matching alternation, one row per step: the squared distance to the anchor
    between canonical forms after the step, and which maps that step solved. Empty when no
    residual map was matched."""
    rep = summary["report"]
    res = rep.get("residual") or {}
    obj = res.get("objective") or []
    if not obj:
        return []
    o = rep.get("options") or {}
    per_layer = bool(o.get("ffn") or o.get("attn") or o.get("rescale"))
    rows = [{"step": 0, "objective": float(obj[0]), "after": "start (canonical forms)",
             "round": 0}]
    for k, v in enumerate(obj[1:], start=1):
        if per_layer:
            after = "per-layer maps (FFN, heads)" if k % 2 == 1 else "residual map"
            rnd = (k + 1) // 2
        else:
            after, rnd = "residual map", k
        rows.append({"step": k, "objective": float(v), "after": after, "round": rnd})
    return rows


def never_increases(values, rtol: float = 1e-9) -> bool:
    """True when no value is above the one before it (up to float rounding)."""
    v = [float(x) for x in values]
    return all(b <= a + rtol * max(1.0, abs(a)) for a, b in zip(v, v[1:], strict=False))


STOP_REASONS = {
    "steps": "it ran all {steps} steps it was given",
    "patience": "the validation barrier did not improve for {patience} checks in a row "
                "(one check every {eval_every} steps)",
    "cancelled": "it was stopped",
    "nothing to learn": "there was nothing to learn (no rotation in this option set)",
}


def stop_reason(learned: Mapping, patience: int = 8, eval_every: int = 20) -> str:
    """Why learned matching stopped, in words."""
    text = STOP_REASONS.get(str(learned.get("stopped")), str(learned.get("stopped")))
    return text.format(steps=learned.get("steps"), patience=patience, eval_every=eval_every)


def learned_rows(summary: Mapping) -> list[dict]:
    """Learned matching's validation checks: step, mean training loss since the last check,
    validation barrier."""
    learned = summary["report"].get("learned") or {}
    return [{"step": h["step"], "train_loss": h.get("train_loss"),
             "val_barrier": h["val_barrier"]} for h in learned.get("history") or []]


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
    three on a few examples, distances and accuracies, as numpy arrays and floats. Kind
    "residual" turns the residual stream instead (`residual_demo`).
    """
    if kind == "residual":
        return residual_demo(loaded, split, seed, layer, head, n_examples)
    from rotviz.evaluation import batch_inputs, evaluate
    from rotviz.match.distances import distances
    from rotviz.match.engine import match
    from rotviz.match.options import MatchOptions
    from rotviz.models import forward, max_output_diff
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
        "tolerance": _tolerance(),
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
    from rotviz.models import forward, max_output_diff
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
                 "tolerance": _tolerance()}
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


# ---- the Merge page --------------------------------------------------------------------------


def fusion_with_states(anchor: Loaded, source: Loaded, split,
                       states: Mapping[str, Mapping[str, torch.Tensor] | None],
                       methods, weight: float = 0.5, batches: int = 8, batch_size: int = 32,
                       alpha: float = 0.9, device="cpu", seed: int = 0) -> dict:
    """`rotviz.analysis.fusion.fusion_table` for sources matched beforehand: one column per entry of
    `states` (label -> the matched source's state dict, None for the source as it is).

    The app matches through its own cache (shared with the other pages, with progress and
    cancelling), then hands each matched source to fusion_table as a source that needs no
    matching, so merging, statistics and evaluation are the library's own. Same keys as
    `FusionTable.to_dict()`; `seconds` and `timing` leave matching out."""
    from rotviz.analysis.fusion import fusion_table

    out: dict | None = None
    for label, state in states.items():
        moved = source if state is None else dataclasses.replace(source, state=dict(state))
        t = fusion_table(anchor, moved, split, None, methods, ("none",), weight, batches,
                         batch_size, alpha, device, seed).to_dict()
        if out is None:
            out = {**t, "specs": [], "acc": {m: {} for m in t["methods"]},
                   "loss": {m: {} for m in t["methods"]}, "scores": {m: {} for m in t["methods"]},
                   "distance": {}, "timing": {}, "seconds": 0.0}
        out["specs"].append(label)
        for m in t["methods"]:
            out["acc"][m][label] = t["acc"][m]["none"]
            out["loss"][m][label] = t["loss"][m]["none"]
            out["scores"][m][label] = t["scores"][m]["none"]
        out["distance"][label] = t["distance"]["none"]
        for k, v in t["timing"].items():
            if not k.startswith("match:"):
                out["timing"][k] = out["timing"].get(k, 0.0) + v
        out["seconds"] += t["seconds"]
        if state is None:  # the end models' numbers from the source as it is
            out.update(source_acc=t["source_acc"], source_loss=t["source_loss"],
                       source_scores=t["source_scores"])
    if out is None:
        raise ValueError("fusion_with_states needs at least one source state")
    return out

"""What the Models, Match and Barrier pages show, as plain data: a model's card and symmetry
check, a match's summary, the flat tables (distances, heads, the alternation, learned
matching) the pages draw and export, and what each matching did to the barrier.

Each function returns something the app can cache by value, export as JSON or CSV and hand
to `rotviz.plots`; loaded models are only read. Importing this module costs no torch import:
each function imports the engine when it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rotviz.match.pipeline import Matched
    from rotviz.models import Loaded


def residual_unsupported(loaded: Loaded) -> str | None:
    """Why residual maps cannot be used on this model (e.g. a tied output head), or None."""
    from rotviz.match.pipeline import view_of
    from rotviz.symmetry.residual import unsupported

    return unsupported(view_of(loaded))


def dims_of(loaded: Loaded) -> dict:
    from rotviz.match.pipeline import view_of

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
    from rotviz.match.pipeline import FUNCTION_TOLERANCE, view_of
    from rotviz.models import max_output_diff
    from rotviz.symmetry.actions import apply, random_element
    from rotviz.symmetry.view import read_view, write_state

    view = view_of(loaded)
    g = random_element(view.dims, seed, ffn=True, attn=True, rescale=True)
    moved = write_state(apply(view, g))
    diff = max_output_diff(loaded, loaded.state, moved)
    return {"max_output_diff": diff, "passed": diff <= FUNCTION_TOLERANCE,
            "distance": distances(view, read_view(loaded.spec, loaded.config, moved)).total}


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
    from rotviz.match.pipeline import FUNCTION_TOLERANCE

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


def barrier_verdict(curves: Sequence[Mapping]) -> dict | None:
    """What each matching did to the barrier, against the curve without matching: for each
    matched curve (in the order given) whether it lowered, raised or kept the barrier, from
    what to what, and the distance it closed; then all of it as Markdown, one line each. `kind` is
    "lowered" when every matching lowered it, "raised" when none did, "mixed" otherwise, so
    that a page never claims lowering where a matching raised it. None without a curve of
    no matching or without a matched one. Barriers that agree to the 3 decimals shown are
    "kept"."""
    from rotviz.plots.style import nice_label

    base = next((c for c in curves if c["match"] in ("none", "")), None)
    matched = [c for c in curves if c["match"] not in ("none", "")]
    if base is None or not matched:
        return None
    b0 = float(base["barrier"])
    changes = []
    for c in matched:
        b = float(c["barrier"])
        did = "kept" if f"{b:.3f}" == f"{b0:.3f}" else "lowered" if b < b0 else "raised"
        changes.append({"match": c["match"], "label": nice_label(str(c["match"])), "did": did,
                        "before": b0, "after": b, "distance_before": c["distance_before"],
                        "distance_after": c["distance_after"]})
    lowered = sum(ch["did"] == "lowered" for ch in changes)
    kind = ("lowered" if lowered == len(changes) else "raised" if lowered == 0 else "mixed")
    lines = [f"Barrier without matching: **{b0:.3f}**."]
    for ch in changes:
        move = (f"**kept** it at {ch['after']:.3f}" if ch["did"] == "kept" else
                f"**{ch['did']}** it to {ch['after']:.3f} ({ch['after'] - b0:+.3f})")
        lines.append(f"- {ch['label']}: {move}; distance {ch['distance_before']:.2f} → "
                     f"{ch['distance_after']:.2f}")
    return {"kind": kind, "text": "\n".join(lines), "changes": changes}

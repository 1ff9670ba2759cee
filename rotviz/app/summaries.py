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
    from rotviz.sources.loading import Loaded


def residual_unsupported(loaded: Loaded) -> str | None:
    """Why residual maps cannot be used on this model (a headless model's output is the
    stream; a tied output head), or None (rotviz.match.pipeline.residual_unsupported)."""
    from rotviz.match.pipeline import residual_unsupported

    return residual_unsupported(loaded)


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
    from rotviz.sources.running import max_output_diff
    from rotviz.symmetry.actions import apply, random_element
    from rotviz.symmetry.view import read_view, write_state

    view = view_of(loaded)
    g = random_element(view.dims, seed, ffn=True, attn=True, rescale=True)
    moved = write_state(apply(view, g))
    diff = max_output_diff(loaded, loaded.state, moved)
    return {"max_output_diff": diff, "passed": diff <= FUNCTION_TOLERANCE,
            "distance": distances(view, read_view(loaded.spec, loaded.config, moved)).total}


# The app's pages by what they need: the views of the weights run on any head, a loss needs
# a head rotviz scores (rotviz.heads). Named here so that the cards and the refusals agree.
WEIGHT_PAGES = "Match and Spectra pages (and the Measure page's distances and spectra)"
LOSS_PAGES = "Barrier, Landscape, Merge, Learn and Gallery pages"
# Heads a loss scores, as examples for a user whose models have none
SCORED_EXAMPLES = ("BertForMaskedLM, BertForPreTraining, GPT2LMHeadModel, "
                   "...ForSequenceClassification")


def head_card(loaded: Loaded) -> dict:
    """What a model's head is and what it allows in the app: the head's own record
    (rotviz.heads.Head.to_dict: class, kind, task, words, the library's `allows`), whether a
    loss scores it, and `pages`, the same in the app's terms (which pages take the model).
    The Models page shows it on each card, so that a pair refused later by a page that
    needs a loss was explained before."""
    from rotviz.heads import DATA_OF_TASK, head_of_config

    head = head_of_config(loaded.config)
    if head.scored:
        pages = (f"every page; its loss is measured on "
                 f"{DATA_OF_TASK.get(head.task or '', 'its data')}")
        if head.kind == "pretraining":
            pages += (" through the masked-LM head (the next-sentence head moves with the "
                      "weights and is checked, not scored)")
    else:
        pages = (f"the {WEIGHT_PAGES} only: no loss scores this head, so the card has no "
                 f"test loss or accuracy, and the {LOSS_PAGES} refuse it")
    return {**head.to_dict(), "scored": head.scored, "pages": pages}


def is_scored(loaded: Loaded) -> bool:
    """Whether a loss scores this model's head (rotviz.heads.Head.scored)."""
    from rotviz.heads import head_of_config

    return head_of_config(loaded.config).scored


def model_card(loaded: Loaded, split=None) -> dict:
    """What the Models page shows for one model: shape, size, head, quality and its symmetry
    check. A head no loss scores (headless, question answering, multiple choice, ...) is
    not evaluated (`split` is not read; loss, accuracy and task are None): its card says
    what the head allows instead, and its functional check still compares every output."""
    from rotviz.data.tasks import describe
    from rotviz.evaluation import evaluate

    head = head_card(loaded)
    card = {
        "ref": loaded.ref,
        "family": loaded.spec.family,
        **dims_of(loaded),
        "params": n_params(loaded),
        "head": head,
    }
    if head["scored"] and split is not None:
        ev = evaluate(loaded, split)
        card.update(loss=ev["loss"], acc=ev["acc"], n_eval=ev["n"],
                    **describe(split.task),  # task, name, metrics
                    scores={k: v for k, v in ev.items() if k not in ("loss", "acc", "n")})
    else:
        card.update(loss=None, acc=None, n_eval=0, task=None, name=None, metrics=[], scores={})
    card["check"] = symmetry_check(loaded)
    return card


def card_rows(cards: Mapping[str, Mapping]) -> list[dict]:
    """The Models page's cards as one flat table (the export's models.csv): one row per
    role, the head and the functional check as columns of their own."""
    rows = []
    for role, c in cards.items():
        head = c.get("head") or {}
        rows.append({"role": role, **{k: v for k, v in c.items() if k not in ("check", "head")},
                     "head_class": head.get("class"), "head_kind": head.get("kind"),
                     "head_scored": head.get("scored"),
                     "check_max_output_diff": c["check"]["max_output_diff"],
                     "check_passed": c["check"]["passed"]})
    return rows


def pair_note(cards: Mapping[str, Mapping], scored: bool) -> dict:
    """What the Models page says of the pair above its cards: `kind` "all" when every page
    takes it (`scored`: a loss scores the pair, rotviz.app.scored_pair), "weights" when only
    the views of the weights do (a head no loss scores, or one body under two heads);
    `text` says so in words."""
    if scored:
        return {"kind": "all", "text": "The two models share one architecture: they can be "
                                       "matched, interpolated and merged."}
    heads = {role: c.get("head") or {} for role, c in cards.items()}
    unscored = [role for role, h in heads.items() if not h.get("scored")]
    if not unscored:  # both scored, by different heads of one body
        names = " vs ".join(f"{h.get('class') or 'no head class'}" for h in heads.values())
        why = (f"They hold one body under different heads ({names}), and a loss would run "
               "one head on both")
    elif len(unscored) == len(cards):
        why = "Neither model has a head that a loss scores"
    else:
        why = f"The {' and '.join(unscored)} has no head that a loss scores"
    return {"kind": "weights", "text": (
        f"The two models share one architecture: they can be matched and compared by their "
        f"weights on the {WEIGHT_PAGES}. {why}, so the {LOSS_PAGES} refuse this pair; for "
        f"those, use models with a language-model or classifier head ({SCORED_EXAMPLES}).")}


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


def round_rows(summary: Mapping) -> list[dict]:
    """The weight-matching alternation, one row per round (the report's `history`): phase,
    round (labelled, `2h` for the second phase's, heads on), the canonical distance after it,
    its gain in squared distance, its share of the total gain and its seconds. Empty when no
    residual map was matched (or the report predates the history)."""
    res = summary["report"].get("residual") or {}
    return [{"label": f"{x['round']}{'h' if x['phase'] else ''}", "phase": x["phase"],
             "round": x["round"], "distance": x["distance"], "gain": x["gain"],
             "share": x["share"], "seconds": x["seconds"]} for x in res.get("history") or []]


ENDED = {"converged": "a round gained less than the tolerance of the start",
         "stalled": "a round gained less than the stall share of the total gain so far",
         "time": "the sidebar's matching time budget ran out (the best state is kept)",
         "rounds": "the round cap was reached while rounds still gained"}


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


# What each task's loss averages (rotviz.data.tasks.sample_losses), said under a loss chart
LOSS_OF_TASK = {
    "text": "cross-entropy of each next token",
    "masked": "cross-entropy of the masked tokens only (the masked-LM head's loss, as the "
              "MultiBERTs literature reports barriers)",
    "seq-cls": "cross-entropy of each example's label",
    "token-cls": "cross-entropy of each token's tag",
    "multi-label": "binary cross-entropy of each label",
    "regression": "squared error of each output",
    "image": "cross-entropy of each image's class",
}


def loss_note(curve: Mapping) -> str:
    """Which loss a barrier curve draws, in one sentence: the models' own task (read off
    their head, rotviz.data.tasks), what it averages and on what data; a masked-LM pair's curve
    would otherwise read as a next-token loss."""
    from rotviz.data.tasks import describe

    task = str(curve.get("task") or "")
    name = f"**{describe(task)['name']}**, " if task else ""
    what = LOSS_OF_TASK.get(task, "the head's own loss")
    n = f"{curve['n']} " if curve.get("n") else ""
    unit = "" if task == "regression" else ", in nats"
    return f"Test loss: {name}{what}{unit}, on {n}test examples of {curve.get('data')}."


def path_note(curve: Mapping) -> str:
    """What the path's animation shows beside the loss, for the task of `curve`."""
    text = ("The loss at each α so far, and what the model at that α answers on the first "
            "test inputs (green: right; vermillion: wrong; p: its probability).")
    if curve.get("task") == "masked":
        from rotviz.analysis.examples import MASKED

        text += (f" {MASKED} marks a masked character; the answer is the model's guess for "
                 "the last one shown, next to the true character.")
    return text


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

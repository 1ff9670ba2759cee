"""The symmetry ladder: the pair's barrier, distance and merged accuracy as the group it is
matched in grows, one rung per matching SPEC, and an align-to-self rung (rotviz.analysis.
ladder, docs/symmetries.md)."""

from __future__ import annotations

from rotviz.limits import BATCH_SIZE, DEFAULT_STEPS, POINTS, STEPS
from rotviz.measures.registry import Context, Inputs, Measurement, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style
from rotviz.sources import hf_cache as hub
from rotviz.symmetry.registry import LADDER

PARAMS = (
    Param("points", 11, f"number of alphas in [0, 1] on each rung's path (default 11, "
          f"{POINTS.text})", POINTS, label="Points on each path", widget=(3, 41, 2)),
    Param("steps", DEFAULT_STEPS, f"learned rung: at most this many learned-matching steps "
          f"(default {DEFAULT_STEPS}, {STEPS.text}; given, it needs a learned rung)", STEPS,
          label="Learned matching steps"),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)


def read_inputs(refs, specs, confined):
    from rotviz.analysis.ladder import LadderPair

    return LadderPair.read(refs, specs, confined)


def _inputs_check(inputs, values: dict, given: set[str]) -> None:
    """--steps bounds the learned rung alone: with none among the rungs it would be ignored."""
    from rotviz.match.selection import parse_selection
    from rotviz.params import needs

    needs("--steps", "steps" in given, "a learned rung (--match learned)",
          any(parse_selection(s).learned for s in inputs.specs))


def _run(inputs, ctx: Context, v: dict):
    from rotviz.analysis.ladder import ladder

    return ladder(inputs, ctx.split, v["points"], ctx.device, v["batch_size"], v["steps"],
                  ctx.progress, ctx.cancel)


def _summary(r, how: str) -> str:
    said = "; ".join(f"{x['words']} [{x['spec']}]: barrier {x['barrier']:.4f}, distance "
                     f"{x['distance']:.4f}, merged accuracy {x['merged_acc']:.4f}"
                     for x in r.rungs)
    left = "".join(f"; left out {spec}: {why}" for spec, why in r.skipped.items())
    return (f"ladder on {r.device}{how}: {said}{left}; {r.points} points on {r.n} {r.split} "
            f"samples in {r.seconds:.2f} s")


def _rows(d: dict) -> list[dict]:
    """One row per rung, the align-to-self rung last."""
    return [{"rung": i, "kind": x["kind"], "match": x["spec"], "words": x["words"],
             "barrier": x["barrier"], "distance": x["distance"],
             "distance_before": x["distance_before"], "merged_acc": x["merged_acc"],
             "merged_loss": x["merged_loss"], "mid_acc": x["mid_acc"],
             "loss_range": x["loss_range"], "max_output_diff": x["max_output_diff"],
             "reason": x["reason"]} for i, x in enumerate(d["rungs"])]


def markdown(d: dict) -> str:
    """The ladder as a table for a page: each rung's numbers (4 decimals: the align-to-self
    rung reads 0.0000 and 0.0000) and its reason the function is unchanged."""
    lines = ["| rung | `--match` | barrier (nats) | distance (L2) | merged accuracy | why the "
             "function is unchanged |", "|---|---|---|---|---|---|"]
    for x in d["rungs"]:
        words = f"**{x['words']}**" if x["kind"] == "self" else x["words"]
        lines.append(f"| {words} | `{x['asked']}` | {x['barrier']:.4f} | {x['distance']:.4f} "
                     f"| {x['merged_acc']:.4f} | {x['reason']} |")
    left = "".join(f"\n\nLeft out `{spec}`: {why}." for spec, why in d["skipped"].items())
    return ("\n".join(lines) + f"\n\nBarriers on {d['points']} points of the {d['split']} split "
            f"({d['n']} samples); merged accuracy: the simple average at 0.5; the anchor alone: "
            f"{d['anchor_acc']:.4f}." + left)


def _plot(d: dict, style: Style):
    from rotviz.plots.ladder import ladder_figure

    return ladder_figure(d)


RECORD = register(Measurement(
    "ladder", "Symmetry ladder",
    "barrier, distance and merged accuracy as the matching group grows, one rung per "
    "matching, and the anchor aligned to itself",
    _run, PARAMS, summary=_summary, plot=_plot, rows=_rows,
    refusal="it matches the pair once per rung in memory; run it on models that fit",
    inputs=Inputs((("anchor", f"anchor model (kept fixed): {hub.MODEL_HELP}"),
                   ("source", "source model, same architecture; matched onto the anchor at "
                              "each rung")), read_inputs, LADDER,
                  spec_help="a rung of the ladder, once per rung, in order",
                  check=_inputs_check),
    progress=True, markdown=markdown, order=170))

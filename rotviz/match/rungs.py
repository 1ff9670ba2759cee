"""The symmetry ladder's rungs: matching SPECs in the order the group grows
(rotviz.symmetry.registry.LADDER), each described in the registry's words, what the pair's
architecture cannot use, and the matching a learned rung starts from. The ladder record
(rotviz.measures.ladder) measures the pair at each rung; this is what it asks of matching.

| rung | SPEC | what it adds |
|---|---|---|
| none | `none` | nothing: the pair as trained |
| FFN permutation | `ffn` | FFN neuron permutations |
| + attention rotation | `ffn,attn` | per-head Q-K and V-O rotations |
| + rescale (seed paper) | `seed` | per-head Q-K and V-O scales |
| + head permutation | `seed,heads` | head order |
| + residual rotation (weight matching) | `weight` | the residual stream's map, alternated |
| activation matching | `act` | the same maps, FFN and stream picked from activations |
| learned matching | `learned` | activation matching, then its maps tuned on data |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rotviz.match.selection import parse_selection
from rotviz.symmetry import registry

if TYPE_CHECKING:
    from rotviz.sources.loading import Loaded

RUNGS = registry.LADDER


def rung_specs(specs: Sequence[str] | None) -> tuple[str, ...]:
    """The rungs asked for, each a matching SPEC as given (checked; default `RUNGS`), each
    meaning once and in the order given."""
    out: list[str] = []
    seen: set[str] = set()
    for s in specs or RUNGS:
        label = parse_selection(s).label  # one line for an unknown SPEC
        if label not in seen:
            seen.add(label)
            out.append(str(s).strip())
    return tuple(out)


# The rungs that are the shorthands of the matching string, named as the literature does
SHORTHAND_WORDS = {"seed": "seed paper", "weight": "weight matching"}


def describe(specs: Sequence[str]) -> list[dict]:
    """Each rung's SPEC (canonical and as asked), its words, the symmetries it adds and its
    one sentence from rotviz.symmetry.registry. A rung of maps adds the maps the rung of
    maps before it lacked ("+ attention rotation"), and its sentence is the first of those
    symmetries'; a data solver's rung (activations, learned) solves for maps the rungs
    before had, and its sentence is the solver's."""
    out = []
    before: set[str] = set()
    for spec in specs:
        sel = parse_selection(spec)
        flags = list(sel.flags)
        solvers = [f for f in flags if f in registry.DATA_SOLVERS]
        if not flags:
            adds, words, reason = [], "none", registry.NONE_REASON
        elif solvers:  # learned matching from activation matching: its own sentence
            adds = solvers
            words = registry.BY_NAME[solvers[-1]].label
            if len(solvers) > 1:
                words += " (from " + ", ".join(registry.BY_NAME[f].label
                                               for f in solvers[:-1]) + ")"
            reason = registry.BY_NAME[solvers[-1]].one_sentence()
        else:
            adds = [f for f in flags if f not in before] or flags
            words = ("+ " if before and set(flags) > before else "") + " + ".join(
                registry.BY_NAME[f].label for f in adds)
            short = sel.label.split(",")
            if len(short) == 1 and short[0] in SHORTHAND_WORDS:
                words += f" ({SHORTHAND_WORDS[short[0]]})"
            reason = registry.BY_NAME[adds[0]].one_sentence()
            before = set(flags)
        out.append({"spec": sel.label, "asked": str(spec).strip(), "words": words,
                    "adds": adds, "reason": reason})
    return out


def why_not(spec: str, anchor: Loaded) -> str | None:
    """Why the pair cannot use `spec` (a residual map its architecture lacks), or None."""
    if not parse_selection(spec).residual:
        return None
    from rotviz.match.pipeline import view_of
    from rotviz.symmetry import residual as rs

    why = rs.unsupported(view_of(anchor))
    return None if why is None else f"no residual map for {anchor.spec.family}: {why}"


def start_of(options) -> str | None:
    """The matching learned matching starts from (its SPEC label: activation matching for
    `learned`, a data-free matching for `weight,learned` and the like), or None."""
    from dataclasses import replace

    if not options.learned:
        return None
    return parse_selection(replace(options, learned=False).label).label


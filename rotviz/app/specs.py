"""The matching SPECs the app offers, and what a page asks of one before it computes.

The pages pick SPECs (rotviz.match.selection's matching strings) from these tables and key
their caches by a SPEC's canonical label, so two spellings of one meaning ('act' and
'weight,act') share one result. Parsing a SPEC imports no torch: these answer before the
engine has loaded.
"""

from __future__ import annotations

import dataclasses

from rotviz.match.selection import parse_selection
from rotviz.symmetry.registry import DATA_SOLVERS, MAPS, SYMMETRIES

# Matching SPEC strings (rotviz.match.selection) the app offers. The seed paper's five first (the
# Barrier page's original comparison), then what goes beyond it: head permutation, the
# residual stream alone, weight matching (seed + heads + residual, alternated), activation matching
# (from weight matching's maps) and learned matching (`learned`: from activation matching, whose
# lower barrier lets it train a quarter as long: docs/solvers.md); both need data.
BARRIER_SPECS = ("none", "ffn", "attn", "ffn,attn", "seed")
SPEC_CHOICES = BARRIER_SPECS + ("seed,heads", "residual", "weight", "weight,act",
                                "weight,act,learned")
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


def spec_label(spec: str) -> str:
    """The canonical text of a SPEC ('act' -> 'weight,act'): one cache key per meaning."""
    return parse_selection(spec).label


def needs_data(spec: str) -> bool:
    s = parse_selection(spec)
    return any(getattr(s, d) for d in DATA_SOLVERS)


def uses_residual(spec: str) -> bool:
    return parse_selection(spec).residual


def learns(spec: str) -> bool:
    return parse_selection(spec).learned


def offered(specs, residual_why: str | None) -> list[str]:
    """The SPECs a pair can use: none with the residual map when the pair has none."""
    return [s for s in specs if residual_why is None or not uses_residual(s)]


def without_residual(spec: str) -> str:
    """The SPEC with the residual map left out (data solvers then start from seed)."""
    s = dataclasses.replace(parse_selection(spec), residual=False)
    if any(getattr(s, d) for d in DATA_SOLVERS) and not any(getattr(s, g) for g in MAPS):
        s = dataclasses.replace(s, ffn=True, attn=True, rescale=True)
    return s.label

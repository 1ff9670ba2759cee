"""The built-in gallery: the seed paper's Figures 4, 5 and 6 and Table 1 (*Beyond the
Permutation Symmetry of Transformers*, ICML 2025) and the generalized-LMC paper's learned
matching barrier (*Generalized Linear Mode Connectivity for Transformers*, NeurIPS 2025),
each reproduced on a pair with rotviz's registered measurements.

Each `draw` reads the entry's table only (the rows the CSV holds), so the CSV written
beside a figure redraws it. The plots import plotly inside, so listing the gallery (for
`rotviz --help`, or the app's first paint) stays cheap.
"""

from __future__ import annotations

from rotviz.gallery.registry import Entry, Run, each, register

SEED = "Beyond the Permutation Symmetry of Transformers (ICML 2025)"
GLMC = "Generalized Linear Mode Connectivity for Transformers (NeurIPS 2025)"
F1_KEYS = ("macro_f1", "entity_f1", "micro_f1")  # the task's F1, where it has one


def _distances(rows: list[dict]):
    """Total distance to the anchor after each matching: the `total` row of each run."""
    from rotviz.measures.distances import ablation_bars

    return ablation_bars([{"match": r["match"], "distance": r["after"]}
                          for r in rows if r["by"] == "total"])


def _curves(rows: list[dict]):
    """One loss curve per matching along the path, its barrier in the legend."""
    from rotviz.measures.barrier import barrier_curves

    by: dict[str, dict] = {}
    for r in rows:
        c = by.setdefault(str(r["match"]), {"match": str(r["match"]), "alphas": [], "loss": [],
                                            "acc": []})
        c["alphas"].append(r["alpha"])
        c["loss"].append(r["loss"])
        c["acc"].append(r["acc"])
    return barrier_curves(list(by.values()))


def _sweeps(rows: list[dict]):
    """The merged model's loss when only layer i, or the layers from i to the last, are
    matched; the sweep's rows back into `rotviz.measures.sweeps.sweeps_figure`' shape."""
    from rotviz.measures.sweeps import sweeps_figure

    keys = ("distance", "barrier", "mid_loss", "mid_acc")
    d: dict = {"match": str(rows[0]["match"]), "single": [], "tail": []}
    for r in rows:
        kind = str(r["matched"]).split(" ")[0]  # none, all, single LAYER, tail LAYERS
        values = {k: r[k] for k in keys}
        if kind in ("none", "all"):
            d[kind] = values
        else:
            d[kind].append(values)
    d["n_layers"] = len(d["single"])
    return sweeps_figure(d)


def _merges(rows: list[dict]):
    """The merged model's F1 (accuracy for a task without one) per method and matching,
    the anchor's and the source's as reference lines."""
    from rotviz.measures.merge import fusion_chart

    metric = next((k for k in F1_KEYS if rows and rows[0].get(k) is not None), "acc")
    merged = [{"method": r["method"], "matching": r["match"], metric: r[metric]}
              for r in rows if r["model"] == "merged"]
    ends = {r["model"]: r[metric] for r in rows if r["model"] != "merged"}
    return fusion_chart(merged, metric, references=ends)


FIG4 = register(Entry(
    "fig4_distances", "Figure 4: distance to the anchor after each matching",
    "How far the source lies from the anchor (the Euclidean norm of the difference of all "
    "their shared weights) as trained, and after matching with FFN permutations alone (Git "
    "Re-Basin's group), attention rotations alone, both, and both with rescaling (the seed "
    "paper's matching). Each bar is the matched source's distance; the function of the "
    "source never changes. In the seed paper, rotations close more distance than "
    "permutations, and rescaling a little more.",
    f"{SEED}, Figure 4", "distances",
    each(("none", "ffn", "attn", "ffn,attn", "seed")), _distances, order=10))

FIG5 = register(Entry(
    "fig5_barriers", "Figure 5: loss along the path, by matching",
    "Test loss along the straight path from the anchor (α = 0) to the source (α = 1), as "
    "trained, after matching the attention only (the paper's w/o FFN), the FFN only (w/o "
    "ATTN) and both (the seed paper's matching). The barrier in each legend is the highest "
    "rise of the curve above the straight line between its ends (the GLMC definition; "
    "docs/conventions.md).",
    f"{SEED}, Figure 5", "barrier",
    each(("none", "attn", "ffn", "seed"), points=21), _curves, order=20))

FIG6 = register(Entry(
    "fig6_sweeps", "Figure 6: matching one layer, or the last layers",
    "Test loss of the simple average (α = 0.5) when only layer i is matched with the seed "
    "paper's matching, and when layers i to the last are matched; the dashed lines are no "
    "layer and every layer matched. It says which layers the merge needs matched.",
    f"{SEED}, Figure 6", "sweeps",
    (Run("seed", {"points": 11}),), _sweeps, order=30))

TABLE1 = register(Entry(
    "table1_merges", "Table 1: merged F1 by fusion method and matching",
    "F1 of the merged model (macro-F1 for classification) for the paper's three fusion "
    "methods, simple averaging, Fisher and RegMean (statistics from the train split), on "
    "the pair as trained, after the seed paper's matching and after weight matching (the "
    "seed paper's maps, head permutations and the residual stream). The lines are the anchor "
    "and the source alone. rotviz merges every tensor, the classifier head included.",
    f"{SEED}, Table 1", "merge",
    tuple(Run(spec, {"method": m}) for spec in ("none", "seed", "weight")
          for m in ("simple", "fisher", "regmean")),
    _merges, columns=("method",), order=40))

GLMC_LEARNED = register(Entry(
    "glmc_learned", "Learned matching: loss along the path",
    "Test loss along the straight path from the anchor to the source as trained, after weight "
    "matching (data-free: permutations, rotations and the residual stream's orthogonal map) "
    "and after learned matching (activation matching's maps tuned on the train split so "
    "that the models between the two have a low loss). The GLMC paper finds that learned "
    "matching brings the barrier to about zero where weight matching leaves part of it; the "
    "legend gives each curve's barrier.",
    f"{GLMC}, learned-matching barrier", "barrier",
    each(("none", "weight", "learned"), points=21), _curves, order=50))

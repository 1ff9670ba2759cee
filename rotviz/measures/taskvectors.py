"""taskvectors: how alike the fine-tunes of one base are, as task vectors tau_i = theta_i -
theta_base (Ilharco et al., 2023): their norms (whole and per layer), the cosine matrix of the
flattened vectors, and each pair's cosine per layer with its spread (docs/merging.md). Both
views, since users mix them up (mlfoundations/task_vectors #18, #22): the flattened cosine is
the per-layer cosines weighted by the layers' shares of the norms
(rotviz.analysis.task_vector_geometry, which computes every number from per-layer Gram
matrices)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from rotviz.confine import ANYWHERE, Confined
from rotviz.errors import RotvizError
from rotviz.measures.registry import Context, Inputs, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style
from rotviz.sources import hf_cache

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from rotviz.sources.loading import Loaded

LEAST = 2  # fine-tuned models at least: one task vector has no cosine to compare
GROUPS = ("block", "kind")
LAYER_AXIS = {"block": "layer (block index; 'outside' = embeddings, final norm, head)",
              "kind": "module kind (every block's qk, vo, ffn, norms; embeddings, head)"}

PARAMS = (
    Param("group", "block", "what a layer is: block (each transformer block, and 'outside': "
          "embeddings, final norm, head) or kind (qk, vo, ffn, norms, embeddings, head) "
          "(default block)", choices=GROUPS, label="Layers", essential=True),
    Param("skip", "", "a comma list of tensor-name patterns left out of the task vectors "
          "(shell wildcards: 'head.*' leaves out a classifier head; default none)",
          label="Leave out tensors (patterns)", metavar="PATTERNS"),
)


def spec_of(specs: Sequence[str] | None) -> str:
    """The one data-free matching (--match, default none) that aligns each fine-tune onto
    the first before the task vectors are taken; one line for more than one, or for one that
    trains on data (the record reads no data)."""
    from rotviz.match.selection import label_of, match_options

    given = [str(s) for s in (specs or ())]
    if len(given) > 1:
        raise RotvizError(f"taskvectors aligns with one matching, got {len(given)} --match "
                          "options; give one --match SPEC")
    options = match_options(given[0] if given else "none")
    if options is not None and options.needs_data:
        raise RotvizError(f"matching [{label_of(options)}] runs the models on data, and "
                          "taskvectors reads none; use a data-free SPEC (seed, weight) or none")
    return "none" if options is None else label_of(options)


class FineTunes:
    """What `rotviz taskvectors` takes: a base and two or more models fine-tuned from it, all
    of one architecture, and one data-free matching (default none: task vectors are
    differences in the base's own basis, which fine-tunes of one base share)."""

    def __init__(self, refs: Sequence[str], specs: Sequence[str] | None = None,
                 confined: Confined = ANYWHERE) -> None:
        from rotviz.sources.loading import resolve_ref

        self.spec = spec_of(specs)
        if len(refs) < 1 + LEAST:  # before any model is loaded
            raise RotvizError(f"task vectors need a base and at least {LEAST} fine-tuned "
                              f"models, got {max(len(refs) - 1, 0)} fine-tuned; give BASE FT1 "
                              "FT2 ...")
        self.refs = tuple(map(str, refs))
        self.paths = [resolve_ref(r, confined) for r in self.refs]
        self._confined = confined

    @cached_property
    def models(self) -> list[Loaded]:
        """The base, then the fine-tunes, loaded at first use (after the command has
        checked its outputs) and checked for one architecture."""
        from rotviz.sources.loading import load_model
        from rotviz.sources.pairs import check_compatible

        models = [load_model(r, confined=self._confined) for r in self.refs]
        for m in models[1:]:
            try:
                check_compatible(models[0], m)
            except RotvizError as e:
                raise RotvizError(f"'{m.ref}' is not of the base '{models[0].ref}''s "
                                  f"architecture ({e}); give fine-tunes of that base") from None
        return models

    def first_pair(self):
        return self.paths[0], self.paths[1]


@dataclass
class TaskVectors:
    """The task vectors' geometry (rotviz.analysis.task_vector_geometry.geometry's keys)
    and what was compared."""

    base: str
    finetuned: list[str]
    group: str
    skip: list[str]
    tensors: int  # floating trainable tensors compared
    params: int  # their entries
    geometry: dict
    seconds: float
    match: str = "none"  # the matching each fine-tune was aligned onto the first with
    # the function check of each aligned fine-tune (its largest output change; the first: 0),
    # or [] unaligned; the app's badge shows the largest (`max_output_diff`, None unaligned)
    output_diffs: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"base": self.base, "finetuned": self.finetuned, "group": self.group,
                "skip": self.skip, "match": self.match, "output_diffs": self.output_diffs,
                "max_output_diff": max(self.output_diffs) if self.output_diffs else None,
                "tensors": self.tensors, "params": self.params, **self.geometry,
                "seconds": self.seconds}


def compared_names(base: Loaded, skip: Sequence[str]) -> list[str]:
    """The trainable floating tensors (tied weights once, buffers never), less `skip`."""
    from rotviz.analysis.task_vector_geometry import skipped

    names = [n for n, p in base.model.named_parameters()
             if p.is_floating_point() and n in base.state]
    kept = skipped(names, skip)
    if not kept:
        raise RotvizError(f"--skip {','.join(skip)} leaves out every trainable tensor; give "
                          "patterns that keep some")
    return kept


def layers_of(base: Loaded, names: Sequence[str], by: str) -> tuple[dict[str, str], list[str]]:
    """Each tensor's layer by the family's layout (rotviz.analysis.hvp.group_names), and the
    layers in order: blocks by index then 'outside', or kinds as they first appear."""
    from rotviz.analysis.hvp import group_names

    group = group_names(list(names), base, by)
    seen = list(dict.fromkeys(group[n] for n in names))
    if by == "block":
        blocks = sorted((g for g in seen if g != "outside"), key=lambda g: int(g.split()[-1]))
        seen = blocks + (["outside"] if "outside" in seen else [])
    return group, seen


def task_vectors(base: Loaded, finetuned: Sequence[Loaded], group: str = "block",
                 skip: Sequence[str] = ()) -> TaskVectors:
    """taskvectors(base, [ft1, ft2, ...]) -> TaskVectors

    The task vectors theta_i - theta_base over the trainable floating tensors (less `skip`),
    grouped into layers by `group`; a zero task vector is refused (its cosine is
    undefined)."""
    from rotviz.analysis.task_vector_geometry import geometry, layer_grams, refuse_zero

    if len(finetuned) < LEAST:
        raise RotvizError(f"task vectors need at least {LEAST} fine-tuned models, got "
                          f"{len(finetuned)}")
    t0 = time.perf_counter()
    names = compared_names(base, skip)
    where, layers = layers_of(base, names, group)
    grams = layer_grams(base.state, [m.state for m in finetuned], names, where, layers)
    refuse_zero(grams, [m.ref for m in finetuned], base.ref)
    return TaskVectors(base.ref, [m.ref for m in finetuned], group, list(skip), len(names),
                       sum(base.state[n].numel() for n in names), geometry(grams),
                       time.perf_counter() - t0)


def aligned(finetuned: Sequence[Loaded], spec: Any,
            device) -> tuple[list[Loaded], list[float]]:
    """Each fine-tune after the first matched onto it with `spec` (a SPEC or MatchOptions;
    its function kept: the
    check's largest output change each), as models of the first's architecture."""
    import dataclasses

    from rotviz.match.endpoints import match_endpoints

    first, out, diffs = finetuned[0], [finetuned[0]], [0.0]
    for m in finetuned[1:]:
        ends = match_endpoints(first, m, spec, device)
        out.append(dataclasses.replace(m, state=dict(ends.matched)))
        diffs.append(float(ends.info.max_output_diff))
    return out, diffs


def _run(inputs: FineTunes, ctx: Context, v: dict) -> TaskVectors:
    from rotviz.analysis.task_vector_geometry import patterns_of

    base, *fts = inputs.models
    diffs: list[float] = []
    if inputs.spec != "none":
        fts, diffs = aligned(fts, ctx.matching(inputs.spec), ctx.device)
    r = task_vectors(base, fts, v["group"], patterns_of(v["skip"]))
    r.match, r.output_diffs = inputs.spec, diffs
    return r


def _f(x: float | None) -> str:
    return "undefined" if x is None else f"{x:.4f}"


def _summary(r: TaskVectors, how: str) -> str:
    d = r.to_dict()
    pairs = "; ".join(f"{_name(d, p['i'])}~{_name(d, p['j'])} {_f(p['flattened'])} "
                      f"(per {d['group']} {_f(p['min'])}/{_f(p['median'])}/{_f(p['max'])})"
                      for p in d["pairs"])
    said = "" if d["match"] == "none" else f" [aligned onto the first: {d['match']}]"
    return (f"taskvectors of {len(d['finetuned'])} fine-tunes of {d['base']}{said}{how}: cosine "
            f"flattened (per-layer min/median/max) {pairs}; norms "
            f"{', '.join(f'{n:.4f}' for n in d['norm'])}; {r.seconds:.2f} s")


def _name(d: Mapping, i: int) -> str:
    from rotviz.measures.many import short_names

    return short_names(d["finetuned"])[i]


def _rows(d: dict) -> list[dict]:
    """One row per pair and layer, then the pair's flattened cosine (layer 'flattened')."""
    out = []
    for p in d["pairs"]:
        a, b = _name(d, p["i"]), _name(d, p["j"])
        for n, layer in enumerate(d["layers"]):
            out.append({"a": a, "b": b, "layer": layer, "cosine": p["per_layer"][n],
                        "norm_a": d["layer_norms"][p["i"]][n],
                        "norm_b": d["layer_norms"][p["j"]][n], "weight": p["weights"][n]})
        out.append({"a": a, "b": b, "layer": "flattened", "cosine": p["flattened"],
                    "norm_a": d["norm"][p["i"]], "norm_b": d["norm"][p["j"]],
                    "weight": p["profile_cosine"]})
    return out


def plot(d: dict, look: Style) -> go.Figure:
    """Left: the flattened cosine matrix (annotated, -1 to 1); right: each pair's cosine per
    layer (lines), its flattened cosine (dotted), and the spread over pairs (band)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from rotviz.measures.many import short_names
    from rotviz.plots import style

    names = short_names(d["finetuned"])
    fig = make_subplots(rows=1, cols=2, column_widths=[0.38, 0.62], horizontal_spacing=0.25,
                        subplot_titles=("flattened over the whole model",
                                        f"per {d['group']}"))
    z = d["cosine"]
    fig.add_trace(go.Heatmap(
        z=z, x=names, y=names, zmin=-1, zmax=1, colorscale=style.DIVERGING,
        text=[[_f(v) for v in row] for row in z], texttemplate="%{text}",
        colorbar={"title": {"text": "cosine (unitless)", "side": "right"}, "x": 0.36, "len": 0.9,
                  "thickness": 14},
        hovertemplate="%{y} · %{x}: %{z:.4f}<extra>flattened</extra>"), 1, 1)
    fig.update_xaxes(title_text="fine-tuned model", row=1, col=1)
    fig.update_yaxes(title_text="fine-tuned model", autorange="reversed", row=1, col=1)
    layers = d["layers"]
    per = [p["per_layer"] for p in d["pairs"]]
    if len(per) > 1:  # the spread over the pairs, layer by layer
        lo = [min((c[n] for c in per if c[n] is not None), default=None)
              for n in range(len(layers))]
        hi = [max((c[n] for c in per if c[n] is not None), default=None)
              for n in range(len(layers))]
        fig.add_scatter(x=layers, y=hi, mode="lines", line={"width": 0}, showlegend=False,
                        hoverinfo="skip", row=1, col=2)
        fig.add_scatter(x=layers, y=lo, mode="lines", line={"width": 0}, fill="tonexty",
                        fillcolor="rgba(127,127,127,0.2)", name="spread over pairs",
                        hoverinfo="skip", row=1, col=2)
    for k, p in enumerate(d["pairs"]):
        label = f"{names[p['i']]} · {names[p['j']]}"
        fig.add_scatter(x=layers, y=p["per_layer"], mode="lines+markers", name=label,
                        line={"color": style.color(k), "dash": style.dash(0)},
                        marker={"symbol": style.marker(k)},
                        hovertemplate="%{x}: %{y:.4f}<extra>" + label + "</extra>",
                        row=1, col=2)
        fig.add_scatter(x=[layers[0], layers[-1]], y=[p["flattened"]] * 2, mode="lines",
                        name=f"{label}, flattened",
                        line={"color": style.color(k), "dash": "dot"}, row=1, col=2)
    x = LAYER_AXIS[d["group"]]
    style.finish(fig, f"Task vectors of {len(names)} fine-tunes of "
                 f"{short_names([d['base']])[0]}: cosine flattened and per {d['group']}",
                 "fine-tuned model", "fine-tuned model", "pair", look.font_size)
    fig.update_xaxes(title_text=x, row=1, col=2)
    fig.update_yaxes(title_text="cosine of the task vectors (unitless)", row=1, col=2)
    fig.update_layout(width=1150, height=520, margin={"b": 130},
                      legend={"orientation": "h", "y": -0.3, "x": 0.45})
    return fig


def _caption(r: dict) -> str:
    pairs = "; ".join(f"{_name(r, p['i'])} · {_name(r, p['j'])}: {_f(p['flattened'])} "
                      f"flattened, per {r['group']} {_f(p['min'])} to {_f(p['max'])} (median "
                      f"{_f(p['median'])}), norm profiles' cosine {p['profile_cosine']:.3f}"
                      for p in r["pairs"])
    return (f"{pairs}. Task vectors over {r['tensors']} tensors ({r['params']:,} entries); "
            f"norms {', '.join(f'{n:.3f}' for n in r['norm'])}.")


SECTION = Section(
    "merge", 40, "Task vectors: how alike the fine-tunes are",
    "A fine-tune's **task vector** is its weights minus the base's, τ = θ − θ_base. Left: "
    "the cosine of every two task vectors **flattened** over the whole model; right: the "
    "cosine **per layer** (each block, and 'outside': embeddings, final norm, head), one line "
    "per pair, its flattened cosine dotted. The two differ: the flattened cosine is the "
    "per-layer cosines weighted by the layers' shares of the two norms, so a layer that moved "
    "little counts little. Near-orthogonal task vectors interfere little when added (task "
    "arithmetic, TIES).",
    caption=_caption, busy="Taking task vectors",
    doing=lambda v: "reading the base and the fine-tunes")

TASKVECTORS = register(Measurement(
    "taskvectors", "Task vectors",
    "the cosines of the task vectors theta_i - theta_base of 2+ fine-tunes, flattened and "
    "per layer, with their norms",
    _run, PARAMS, summary=_summary, plot=plot, rows=_rows, data=False,
    refusal="it holds every model in memory; run it on models that fit",
    inputs=Inputs((("base", f"the base model ({hf_cache.MODEL_HELP})"),
                   ("finetuned", "two or more models fine-tuned from the base, of its "
                    "architecture")), FineTunes, ("none",), least=LEAST, one_spec=True),
    section=SECTION, order=165))

"""Conserved quantities of the symmetries over training (Zhao et al., ICLR 2023): for a
series of checkpoints, each continuous symmetry's conserved quantity (per block and KV group
for the Q-K and V-O maps, per unit for the FFN's unit scales; rotviz.analysis.conserved
defines them) at every step, and its drift from its start, |Q(t) - Q(0)|_F / scale, the scale
the Frobenius norms of the quantity's two Gram terms at the start summed (an FFN unit's: its
two squared norms summed). Gradient flow without weight decay keeps each quantity put; weight
decay lambda shrinks it as exp(-2 lambda t); Adam's per-coordinate steps and large steps
move it (docs/landscape.md, "conserved").

Weights only (no data). The checkpoints are read one at a time (each through `load_model`
and the `Confined` reader), so only one model is ever held.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rotviz.confine import ANYWHERE, Confined
from rotviz.errors import RotvizError
from rotviz.limits import Bound
from rotviz.measures.registry import Context, Inputs, Measurement, Section, register
from rotviz.measures.training import SERIES_HELP, STEP, Series, read_series, specs_of
from rotviz.params import Param
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    from rotviz.types import Progress

EVERY = Bound("--every", 1, 100_000)
PARAMS = (
    Param("every", 1, f"read every N-th checkpoint of the series, the first and the last "
          f"always (default 1: all; {EVERY.text})", EVERY, label="Every N-th checkpoint",
          widget=(1, 10, 1), essential=True),
)
AT_SIZE = ("it reads one checkpoint at a time in memory, in float64; run it on checkpoints "
           "that fit")
# config.json keys that differ between checkpoints of one model (where and how it was saved)
VOLATILE = ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "_commit_hash")
DRIFT = "drift |Q(t) − Q(0)| / scale (relative, unitless)"


@dataclass(frozen=True)
class OneSeries:
    """What `rotviz conserved` measures: one series, read and checked (three checkpoints or
    more, one architecture by config.json)."""

    series: Series
    confined: Confined = ANYWHERE

    @classmethod
    def read(cls, refs: Sequence[str], specs: Sequence[str] | None = None,
             confined: Confined = ANYWHERE) -> OneSeries:
        """The series; it takes no matching (the weights of one series: nothing to align),
        so one asked for is refused in one line."""
        asked = [s for s in specs_of(specs) if s != "none"] if specs else []
        if asked:
            raise RotvizError(f"conserved reads one series' weights and aligns nothing: drop "
                              f"the matching {', '.join(asked)}")
        series = read_series(refs[0], confined)
        _enough(series.ref, list(series.steps))
        _one_architecture(series, confined)
        return cls(series, confined)

    def first_pair(self) -> tuple[Path, Path]:
        first = next(iter(self.series.steps.values()))
        return first, first


def _enough(ref: str, steps: list[int], every: int = 1) -> None:
    """Refuse, in one line, fewer than three checkpoints (a drift needs a start and two
    more to be a trend)."""
    if len(steps) < 3:
        said = ", ".join(map(str, steps))
        how = f" read every {every}" if every > 1 else ""
        raise RotvizError(f"series '{ref}' gives {len(steps)} checkpoint(s){how} (step(s) "
                          f"{said}); conserved quantities need at least three: give a series "
                          "of three checkpoints or more" + (", or a smaller --every"
                                                            if every > 1 else ""))


def _one_architecture(series: Series, confined: Confined) -> None:
    """Refuse, in one line, checkpoints whose config.json differs (but for where and how
    they were saved), naming the first step that differs and a key."""
    from rotviz.sources.loading import read_config

    first_step, first_path = next(iter(series.steps.items()))
    want = _config_of(read_config(first_path, confined))
    for step, path in series.steps.items():
        got = _config_of(read_config(path, confined))
        if got != want:
            key = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))[0]
            raise RotvizError(f"series '{series.ref}': the checkpoint of step {step} has "
                              f"another architecture than step {first_step} ({key}: "
                              f"{got.get(key)!r}, not {want.get(key)!r}); give the "
                              "checkpoints of one model")


def _config_of(config: Mapping) -> dict:
    return {k: v for k, v in config.items() if k not in VOLATILE}


def _check(inputs: OneSeries, values: dict, named: set[str]) -> None:
    """Refuse an --every that leaves fewer than three checkpoints, before any model loads."""
    _enough(inputs.series.ref, kept_steps(list(inputs.series.steps), values["every"]),
            values["every"])


def kept_steps(steps: list[int], every: int) -> list[int]:
    """Every `every`-th step, the first and the last always."""
    kept = steps[::every]
    return kept if kept[-1] == steps[-1] else [*kept, steps[-1]]


# ---- measuring ---------------------------------------------------------------------------------


@dataclass
class Conserved:
    """Each kind's quantities and drifts by block, group (or unit summary) and step."""

    series: str
    steps: list[int]
    family: str
    blocks: int
    kv_groups: int
    units: int
    conserved: dict[str, bool]  # kind -> whether this architecture conserves anything
    what: dict[str, str]  # kind -> the components, or why none
    # qk, vo: [block][group][i] -> the components at step values_steps[i] (every step, or
    # the first and last where all would pass VALUES_CAP numbers); no ffn (summarised)
    values: dict[str, list]
    scale: dict[str, list]  # qk, vo: [block][group]; ffn: [block] -> median unit scale
    drift: dict[str, list]  # qk, vo: [block][group][step]; ffn: [block][step] (median)
    drift_max: dict[str, list]  # ffn: [block][step] max over units
    norm: dict[str, list]  # [block][group][step] (ffn: [block][step]) |Q(t)|_F
    summary: dict[str, dict[str, list[float]]]  # kind -> median/min/max over heads or units
    device: str
    seconds: float
    stopped: str = ""
    values_steps: list[int] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


VALUES_CAP = 2_000_000  # components kept in the JSON at most (a 7B model's series: far more)


def conserved_over(inputs: OneSeries, every: int = 1, progress: Progress | None = None,
                   cancel: Callable[[], bool] | None = None) -> Conserved:
    """Read the checkpoints one by one, in float64, and measure every conserved quantity
    against its value at the first step kept."""
    from rotviz.analysis import conserved as cq
    from rotviz.analysis.tangents import ffn_has_scales

    t0 = time.perf_counter()
    steps = kept_steps(list(inputs.series.steps), every)
    first, shapes, out = None, {}, None
    for i, step in enumerate(steps):
        if out is not None and cancel is not None and cancel():
            out.stopped = "cancelled"
            break
        family, view = _view_at(inputs, step, steps[0], shapes)
        scales = ffn_has_scales(view.blocks[0].ffn)
        q = cq.quantities(view, scales)
        if out is None:
            first, out = q, _empty(inputs.series.ref, steps, family, view, scales)
        _add(out, first, q, _keep_values(q, len(steps), i))
        del view
        if progress is not None:
            progress(i + 1, len(steps), f"step {step}")
    out.steps = out.steps[:len(out.norm["vo"][0][0])]
    out.summary = _summary_of(out)
    out.seconds = time.perf_counter() - t0
    return out


def _view_at(inputs: OneSeries, step: int, start: int, shapes: dict):
    """(family, the float64 view) of the checkpoint of `step`; one line when its tensors'
    shapes differ from the first's (`shapes`, filled on the first call)."""
    import torch

    from rotviz.sources.loading import load_model
    from rotviz.symmetry.view import read_view

    loaded = load_model(inputs.series.steps[step], confined=inputs.confined)
    now = {k: tuple(v.shape) for k, v in loaded.state.items()}
    if not shapes:
        shapes.update(now)
    elif now != shapes:
        key = sorted(k for k in set(now) | set(shapes) if now.get(k) != shapes.get(k))[0]
        raise RotvizError(f"series '{inputs.series.ref}': the checkpoint of step {step} has "
                          f"another architecture than step {start} ({key}: {now.get(key)} "
                          f"against {shapes.get(key)}); give the checkpoints of one model")
    view = read_view(loaded.spec, loaded.config, loaded.state).to(torch.float64)
    return loaded.spec.family, view


def _empty(ref: str, steps: list[int], family: str, view, scales: bool) -> Conserved:
    """The result before any step: empty lists per block and group of each kind conserved."""
    from rotviz.analysis import conserved as cq

    dims = view.dims
    on = cq.conserves(dims, scales)
    nb, ng = len(view.blocks), dims.n_kv_heads

    def groups(kind: str) -> list:
        return [[[] for _ in range(ng)] for _ in range(nb)] if on[kind] else []

    def blocks() -> list:
        return [[] for _ in range(nb)] if on["ffn"] else []

    return Conserved(
        ref, list(steps), family, nb, ng, dims.d_ffn, on, cq.which(dims, scales),
        values={"qk": groups("qk"), "vo": groups("vo")},
        scale={"qk": [], "vo": [], "ffn": []},
        drift={"qk": groups("qk"), "vo": groups("vo"), "ffn": blocks()},
        drift_max={"ffn": blocks()},
        norm={"qk": groups("qk"), "vo": groups("vo"), "ffn": blocks()},
        summary={}, device="cpu", seconds=0.0, extra={"units": {}})


def _keep_values(q, n_steps: int, i: int) -> bool:
    """Whether the JSON keeps step i's components: always, unless every step's would pass
    VALUES_CAP numbers; then the first and the last only."""
    per_step = sum(v.numel() for kind in (q.qk, q.vo) for b in kind for v in b)
    return per_step * n_steps <= VALUES_CAP or i in (0, n_steps - 1)


def _add(out: Conserved, first, q, keep: bool = True) -> None:
    """One checkpoint's quantities, measured against the first's (its components kept in
    the JSON when `keep`)."""
    import torch

    from rotviz.analysis.conserved import relative

    if keep:
        out.values_steps.append(out.steps[len(out.norm["vo"][0][0])])

    for kind in ("qk", "vo"):
        if not out.conserved[kind]:
            continue
        vals, v0, s0 = getattr(q, kind), getattr(first, kind), getattr(first, kind + "_scale")
        if not out.scale[kind]:
            out.scale[kind] = [list(s) for s in s0]
        for b, groups in enumerate(vals):
            for g, v in enumerate(groups):
                if keep:
                    out.values[kind][b][g].append(v.tolist())
                change = torch.linalg.norm(v - v0[b][g])
                out.drift[kind][b][g].append(float(relative(change, s0[b][g])))
                out.norm[kind][b][g].append(float(torch.linalg.norm(v)))
    if out.conserved["ffn"]:
        units = []
        for b, v in enumerate(q.ffn):
            d = relative((v - first.ffn[b]).abs(), first.ffn_scale[b])
            units.append(d)
            out.drift["ffn"][b].append(float(d.median()))
            out.drift_max["ffn"][b].append(float(d.max()))
            out.norm["ffn"][b].append(float(torch.linalg.norm(v)))
        if not out.scale["ffn"]:
            out.scale["ffn"] = [float(s.median()) for s in first.ffn_scale]
        out.extra["units"].setdefault("all", []).append(torch.cat(units))


def _summary_of(out: Conserved) -> dict[str, dict[str, list[float]]]:
    """Per kind and step: the median, min and max drift over every head (KV group) of every
    block, or every unit of every block."""
    import torch

    summary = {}
    n = len(out.steps)
    for kind in ("qk", "vo"):
        if out.conserved[kind]:
            per = torch.tensor([g for b in out.drift[kind] for g in b], dtype=torch.float64)
            summary[kind] = _stats([per[:, i] for i in range(n)])
    if out.conserved["ffn"]:
        summary["ffn"] = _stats(out.extra["units"].pop("all"))
    out.extra.pop("units", None)
    return summary


def _stats(columns) -> dict[str, list[float]]:
    return {"median": [float(c.median()) for c in columns],
            "min": [float(c.min()) for c in columns],
            "max": [float(c.max()) for c in columns]}


def _run(inputs: OneSeries, ctx: Context, v: dict) -> Conserved:
    return conserved_over(inputs, v["every"], ctx.progress, ctx.cancel)


def _said(r, kind: str) -> str:
    if kind not in r.summary:
        return f"{kind} none"
    s = r.summary[kind]
    return f"{kind} {s['median'][-1]:.3g} (max {s['max'][-1]:.3g})"


def _summary(r, how: str) -> str:
    said = ", ".join(_said(r, k) for k in ("qk", "vo", "ffn"))
    return (f"conserved quantities of {r.series}{how}: {len(r.steps)} checkpoints, steps "
            f"{r.steps[0]}..{r.steps[-1]}; drift at the last step (median over heads or "
            f"units, and max): {said}; in {r.seconds:.2f} s")


def rows(d: dict) -> list[dict]:
    """One row per kind, block, group (qk, vo) and step; the FFN's per block (median and
    max over its units)."""
    out = []
    for kind in ("qk", "vo"):
        for b, groups in enumerate(d["drift"][kind]):
            for g, drifts in enumerate(groups):
                out += [{"kind": kind, "block": b, "group": g, "step": s, "drift": x,
                         "drift_max": x, "norm": d["norm"][kind][b][g][i]}
                        for i, (s, x) in enumerate(zip(d["steps"], drifts, strict=True))]
    for b, drifts in enumerate(d["drift"]["ffn"]):
        out += [{"kind": "ffn", "block": b, "group": "units", "step": s, "drift": x,
                 "drift_max": d["drift_max"]["ffn"][b][i], "norm": d["norm"]["ffn"][b][i]}
                for i, (s, x) in enumerate(zip(d["steps"], drifts, strict=True))]
    return out


LABELS = {"qk": "Q-K map (per head)", "vo": "V-O map (per head)", "ffn": "FFN unit scale"}
FLOOR = 1e-16  # a drift of exactly 0 drawn here on the log axis


def conserved_figure(d: Mapping, style: Style | None = None, title: str | None = None):
    """Drift against step, one line per kind (the median over heads or units) in a band from
    the least to the most drifting, on a log axis; the first step (drift 0 by definition)
    left out."""
    import plotly.graph_objects as go

    from rotviz.plots import style as st

    style = style or Style()
    fig = go.Figure()
    x = list(d["steps"][1:])
    for i, (kind, s) in enumerate(d["summary"].items()):
        lo, hi, mid = ([max(float(v), FLOOR) for v in s[k][1:]] for k in ("min", "max",
                                                                          "median"))
        color, name = st.color(i), LABELS.get(kind, kind)
        fig.add_scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", fillcolor=color,
                        mode="lines", opacity=0.18, line={"width": 0}, hoverinfo="skip",
                        showlegend=False, legendgroup=kind)
        fig.add_scatter(x=x, y=mid, mode="lines+markers", name=name, legendgroup=kind,
                        line={"color": color, "dash": st.dash(i), "width": 2.5},
                        marker={"symbol": st.marker(i), "size": 8},
                        hovertemplate=f"step %{{x}}: median drift %{{y:.3g}}<extra>{name}"
                                      "</extra>")
    none = [LABELS[k] for k, on in d["conserved"].items() if not on]
    sub = ("line: median over heads or units; band: min to max"
           + (f"; none for {', '.join(none)} in this architecture" if none else ""))
    fig = st.finish(fig, (title or f"Conserved quantities of the symmetries: {d['series']}")
                    + f"<br><sup>{sub}</sup>", STEP, DRIFT, "symmetry", style.font_size)
    st.log_axis(fig)
    fig.update_layout(legend={"orientation": "h", "y": -0.22, "x": 0})
    return fig


def _caption(d: dict) -> str:
    last = "; ".join(f"{LABELS[k]} {s['median'][-1]:.3g} (max {s['max'][-1]:.3g})"
                     for k, s in d["summary"].items())
    return (f"{len(d['steps'])} checkpoints, steps {d['steps'][0]} to {d['steps'][-1]}; "
            f"drift at the last step, median over heads or units: {last}. Plain gradient "
            "descent without weight decay keeps them near 0; weight decay lambda shrinks "
            "them as exp(-2 lambda t).")


SECTION = Section(
    "training", 30, "3. Conserved quantities of the symmetries",
    "Each continuous symmetry conserves a quantity under gradient flow (Zhao et al., ICLR "
    "2023): per head, the Q-K map's sum of the query rows' Gram minus the key rows' Gram, "
    "the V-O map's value rows' Gram minus the output columns' Gram; per ReLU or gated FFN "
    "unit, its squared input norm minus its squared output norm. Their drift from the first "
    "checkpoint, relative to their size there, on a log axis: the zoo's SGD series without "
    "weight decay keeps them put, its AdamW runs (weight decay 0.05) do not. Weights only: "
    "the page's data and matchings are not used.",
    caption=_caption, doing=lambda v: "every checkpoint's quantities",
    busy="Reading the checkpoints")


CONSERVED = register(Measurement(
    "conserved", "Conserved quantities",
    "the conserved quantity of each continuous symmetry (Q-K, V-O maps per head, FFN unit "
    "scales) over a series of checkpoints, and its drift from its start",
    _run, PARAMS, summary=_summary, plot=conserved_figure, rows=rows, refusal=AT_SIZE,
    data=False, inputs=Inputs((("series", "the " + SERIES_HELP),), OneSeries.read,
                              default_specs=(), check=_check),
    progress=True, section=SECTION, order=155))

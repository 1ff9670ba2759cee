"""Barriers over training (Frankle et al., ICML 2020): two series of checkpoints paired by
step, each step's pair matched and its barrier measured as `rotviz barrier` does, one line
per matching (docs/landscape.md, "training").

Two records take more than one pair of endpoints, and this module measures the pairs of both
(`barriers_of`; rotviz.measures.spawn reads its spawn folder and draws its figure):
- barriers over training: two series of checkpoints, paired by step; at each common step the
  pair is matched (each matching asked for) and its barrier measured;
- instability against the spawn step: a spawn folder holding, for each step k of a parent
  run, two children trained from the parent's checkpoint at k to the end in different data
  orders; the barrier between the two children, for each matching, against k.

Each step's barrier is exactly `rotviz barrier`'s: the pair matched with `match_endpoints`,
then `curve_on` on the test split, max over alpha of L(alpha) minus the straight line
between the end losses. Every file is read through a `Confined` reader by `load_model`
(never remote code); folders are listed through the same reader.

Inputs:
- a series: a folder of `checkpoint-<step>/` model folders (Hugging Face Trainer's output
  layout), `zoo:NAME` (a series of the zoo), or a model of the local Hugging Face cache,
  `ORG/NAME` (every revision named `step<N>` it holds: Pythia's checkpoints) or
  `ORG/NAME@step1000,step2000` (those revisions), each step the model reference
  `ORG/NAME@step<N>` resolves to (rotviz.sources.hf_cache: an existing folder of that path wins,
  `hf-cache:` forces the cache; the cache is read as it is, nothing is downloaded);
- a spawn folder: `spawn-<k>/a/` and `spawn-<k>/b/` model folders, or `zoo:NAME`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rotviz import zoo_registry as zoo
from rotviz.confine import ANYWHERE, Confined
from rotviz.errors import RotvizError
from rotviz.limits import BATCH_SIZE, POINTS
from rotviz.measures.registry import Context, Inputs, Measurement, Section, register
from rotviz.params import Param
from rotviz.plots.figure_style import Style
from rotviz.sources import hf_cache

if TYPE_CHECKING:
    import torch

    from rotviz.data.split import Split
    from rotviz.types import Progress

CHECKPOINT = re.compile(r"checkpoint-(\d+)")
HF_STEP = re.compile(r"step(\d+)")
DEFAULT_MATCHES = ("none", "seed")
STEP = "training step (optimiser updates)"

SERIES_HELP = ("series: a folder of checkpoint-<step>/ model folders (Hugging Face "
               "Trainer's layout), zoo:NAME, or ORG/NAME from the local Hugging Face cache "
               "(its step<N> revisions, or those named: ORG/NAME@step1000,step2000; never "
               "downloaded)")

PARAMS = (
    Param("points", 11, f"number of alphas in [0, 1] on each step's path (default 11, "
          f"{POINTS.text})", POINTS, label="Points on each path", widget=(3, 41, 2),
          essential=True),
    Param("batch_size", 512, f"evaluation batch size (default 512, {BATCH_SIZE.text})",
          BATCH_SIZE, label="Evaluation batch size"),
)

AT_SIZE = ("it loads both models of every step in memory, one step at a time; run it on "
           "checkpoints that fit")


# ---- reading the inputs ------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """A run's checkpoints: its reference, and the model folder of each step."""

    ref: str
    steps: dict[int, Path]


def _steps_of(where: str, found: list[tuple[int, Path]]) -> dict[int, Path]:
    out: dict[int, Path] = {}
    for step, path in found:
        if step in out:
            raise RotvizError(f"'{where}' holds step {step} twice ({out[step].name} and "
                              f"{path.name}); keep one")
        out[step] = path
    return dict(sorted(out.items()))


def _cache_series(name: hf_cache.CacheName, confined: Confined) -> dict[int, Path]:
    """The checkpoints of a model in the local Hugging Face cache, by step: the revisions
    `step<N>` that `name` lists (`ORG/NAME@step1000,step2000`), or, without a revision, every
    ref named `step<N>` the cache holds (Pythia's checkpoints); each resolved to its snapshot
    folder by rotviz.sources.hf_cache, as any `ORG/NAME@step<N>` model reference is (never
    downloaded)."""
    if name.revision is None:
        refs = hf_cache.revisions(hf_cache.repository(name, confined), confined)
        revs = [r for r in refs if HF_STEP.fullmatch(r)]
    else:
        revs = name.revision.split(",")
        bad = [r for r in revs if not HF_STEP.fullmatch(r)]
        if bad:
            raise RotvizError(f"series '{name}' names revision '{bad[0]}', which is no step: "
                              "a series pairs checkpoints by step, so name revisions step<N> "
                              "(ORG/NAME@step1000,step2000), or ORG/NAME for all it holds")
    found = []
    for rev in revs:
        step = hf_cache.CacheName(name.repo_id, rev, name.explicit)
        found.append((int(HF_STEP.fullmatch(rev).group(1)), hf_cache.locate(step, confined)))
    return _steps_of(str(name), found)


def read_series(ref: str, confined: Confined = ANYWHERE) -> Series:
    """The checkpoints of series `ref` by step (a folder of checkpoint-<step>/, zoo:NAME or
    ORG/NAME[@step<N>,...] in the Hugging Face cache), listed through `confined`; one line
    when it holds none."""
    ref = str(ref)
    cached = hf_cache.cache_ref(ref)
    if cached is not None:
        steps = _cache_series(cached, confined)
    else:
        if ref.startswith("zoo:"):
            name = ref[4:]
            if name not in zoo.SERIES:
                raise RotvizError(f"'{ref}' is no series of the zoo; use one of "
                                  + ", ".join(f"zoo:{n}" for n in zoo.SERIES))
            folder = zoo.collection_path(name)
        else:
            folder = Path(ref).expanduser()
            if not folder.is_dir():
                raise RotvizError(f"no series folder at '{ref}': give a folder of "
                                  "checkpoint-<step>/ model folders, zoo:NAME or "
                                  "a cached ORG/NAME")
        found = [(int(m.group(1)), p) for p in confined.entries(folder, "series folder")
                 if (m := CHECKPOINT.fullmatch(p.name)) and p.is_dir()]
        steps = _steps_of(ref, found)
    if not steps:
        raise RotvizError(f"series '{ref}' holds no checkpoints (checkpoint-<step>/ folders, "
                          "or step<N> revisions in the Hugging Face cache)")
    return Series(ref, steps)


def paired(a: Series, b: Series) -> tuple[list[int], list[int], list[int]]:
    """The steps in both series, and those only in a, only in b; one line when none is
    common."""
    common = sorted(set(a.steps) & set(b.steps))
    if not common:
        raise RotvizError(f"series '{a.ref}' (steps {_few(a.steps)}) and '{b.ref}' (steps "
                          f"{_few(b.steps)}) have no step in common; pair runs saved at the "
                          "same steps")
    return common, sorted(set(a.steps) - set(b.steps)), sorted(set(b.steps) - set(a.steps))


def _few(steps) -> str:
    s = sorted(steps)
    return ", ".join(map(str, s[:6])) + (f", ... ({len(s)} in all)" if len(s) > 6 else "")


# ---- the inputs as the records take them --------------------------------------------------------


def specs_of(specs: Sequence[str] | None) -> tuple[str, ...]:
    """The matchings asked for, canonical and each once (default: none and seed)."""
    from rotviz.match.selection import label_of, match_options

    out: list[str] = []
    for s in specs or DEFAULT_MATCHES:
        options = match_options(s)
        label = "none" if options is None else label_of(options)
        if label not in out:
            out.append(label)
    return tuple(out)


@dataclass(frozen=True)
class TwoSeries:
    """What `rotviz training` measures: two series and the matchings, read and checked."""

    a: Series
    b: Series
    specs: tuple[str, ...]
    confined: Confined = ANYWHERE

    @classmethod
    def read(cls, refs: Sequence[str], specs: Sequence[str] | None = None,
             confined: Confined = ANYWHERE) -> TwoSeries:
        out = cls(read_series(refs[0], confined), read_series(refs[1], confined),
                  specs_of(specs), confined)
        paired(out.a, out.b)  # no common step: one line before any model is loaded
        return out

    def first_pair(self) -> tuple[Path, Path]:
        s = paired(self.a, self.b)[0][0]
        return self.a.steps[s], self.b.steps[s]


# ---- measuring ---------------------------------------------------------------------------------


@dataclass
class Barriers:
    """The barrier at each x (a training step, or a spawn step k), for each matching."""

    x: list[int]
    matches: list[str]
    barrier: dict[str, list[float]]  # matching -> one value per x
    mid_acc: dict[str, list[float]]  # accuracy at alpha 0.5
    loss_a: list[float]  # the end points' test losses (alpha 0 and 1, matched: the same)
    loss_b: list[float]
    acc_a: list[float]
    acc_b: list[float]
    distance_before: list[float]
    distance_after: dict[str, list[float]]
    points: int
    data: str
    split: str
    n: int
    device: str
    seconds: float
    stopped: str = ""  # "cancelled" when the caller's cancel() stopped it
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def barriers_of(pairs: Sequence[tuple[int, Path, Path]], specs: Sequence[str], split: Split,
                points: int = 11, device: str | torch.device = "cpu", batch_size: int = 512,
                progress: Progress | None = None, cancel: Callable[[], bool] | None = None,
                confined: Confined = ANYWHERE, time_limit: float | None = None) -> Barriers:
    """For each (x, model folder a, model folder b): both loaded through `confined`, matched
    with each SPEC (match_endpoints; `time_limit` bounds each weight matching's alternation)
    and the barrier measured as `rotviz barrier` does (curve_on on `split`, `points` alphas).
    The spawn record measures its pairs here too."""
    from rotviz.analysis.paths import check_path
    from rotviz.devices import resolve_device
    from rotviz.match.endpoints import as_options, match_endpoints
    from rotviz.match.options import with_time_limit
    from rotviz.measures.barrier import curve_on
    from rotviz.sources.loading import load_model

    check_path(points, 1, split)
    dev = resolve_device(device)
    t0 = time.perf_counter()
    specs = list(specs)
    out = Barriers([], specs, {s: [] for s in specs}, {s: [] for s in specs}, [], [], [], [],
                   [], {s: [] for s in specs}, points, split.data, split.split, split.n,
                   str(dev), 0.0)
    total, done = len(pairs) * len(specs), 0
    for x, pa, pb in pairs:
        if cancel is not None and cancel():
            out.stopped = "cancelled"
            break
        a, b = load_model(pa, confined=confined), load_model(pb, confined=confined)
        for spec in specs:
            ends = match_endpoints(a, b, with_time_limit(as_options(spec), time_limit), dev,
                                   data=split)
            c = curve_on(ends, split, points, dev, None, 1, 0, batch_size)
            assert c is not None  # one process
            out.barrier[spec].append(c.barrier)
            out.mid_acc[spec].append(c.mid_acc)
            out.distance_after[spec].append(c.distance_after)
            if spec == specs[0]:
                out.x.append(x)
                out.loss_a.append(c.loss[0])
                out.loss_b.append(c.loss[-1])
                out.acc_a.append(c.acc[0])
                out.acc_b.append(c.acc[-1])
                out.distance_before.append(c.distance_before)
            done += 1
            if progress is not None:
                progress(done, total, f"{x}: {spec} barrier {c.barrier:.4f}")
    out.seconds = time.perf_counter() - t0
    return out


def barriers_over_training(inputs: TwoSeries, split: Split, points: int = 11,
                           device: str | torch.device = "cpu", batch_size: int = 512,
                           progress: Progress | None = None,
                           cancel: Callable[[], bool] | None = None,
                           time_limit: float | None = None) -> Barriers:
    """The barrier between the two series at each common step, for each matching; the steps
    only one series holds are listed in `extra` (only_a, only_b)."""
    steps, only_a, only_b = paired(inputs.a, inputs.b)
    r = barriers_of([(s, inputs.a.steps[s], inputs.b.steps[s]) for s in steps], inputs.specs,
                    split, points, device, batch_size, progress, cancel, inputs.confined,
                    time_limit)
    r.extra = {"kind": "training", "series_a": inputs.a.ref, "series_b": inputs.b.ref,
               "only_a": only_a, "only_b": only_b}
    return r


def _run(inputs, ctx: Context, v: dict):
    return barriers_over_training(inputs, ctx.split, v["points"], ctx.device, v["batch_size"],
                                  ctx.progress, ctx.cancel, ctx.time_limit)


def steps_note(r) -> str:
    """The steps only one series holds, in a few words ('' when none)."""
    e = r.extra if hasattr(r, "extra") else r["extra"]
    parts = [f"{len(e[k])} step(s) only in {e[s]} ({', '.join(map(str, e[k][:5]))}"
             f"{', ...' if len(e[k]) > 5 else ''})" for k, s in (("only_a", "series_a"),
                                                                  ("only_b", "series_b"))
             if e[k]]
    return "; left out: " + "; ".join(parts) if parts else ""


def _summary(r, how: str) -> str:
    last = {m: r.barrier[m][-1] for m in r.matches}
    peak = {m: max(r.barrier[m]) for m in r.matches}
    said = ", ".join(f"{m} {last[m]:.4f} (peak {peak[m]:.4f})" for m in r.matches)
    return (f"barriers over training on {r.device}{how}: {len(r.x)} common steps "
            f"{r.x[0]}..{r.x[-1]}; barrier at the last step: {said}{steps_note(r)}; "
            f"{r.points} points on {r.n} {r.split} samples in {r.seconds:.2f} s")


def rows(d: dict) -> list[dict]:
    """One row per step (or spawn step) and matching."""
    key = "step" if d["extra"].get("kind") == "training" else "spawn_step"
    return [{key: x, "match": m, "barrier": d["barrier"][m][i], "mid_acc": d["mid_acc"][m][i],
             "loss_a": d["loss_a"][i], "loss_b": d["loss_b"][i],
             "distance_before": d["distance_before"][i],
             "distance_after": d["distance_after"][m][i]}
            for i, x in enumerate(d["x"]) for m in d["matches"]]


def lines_figure(d: Mapping, font_size: int, title: str, x_title: str, what: str):
    """One line per matching: the barrier in nats against `x_title` (a training step, a
    spawn step)."""
    import plotly.graph_objects as go

    from rotviz.plots import style

    fig = go.Figure()
    for i, m in enumerate(d["matches"]):
        name = style.nice_label(str(m))
        fig.add_scatter(
            x=list(d["x"]), y=[float(v) for v in d["barrier"][m]], mode="lines+markers",
            name=name, line={"color": style.color(i), "dash": style.dash(i), "width": 2.5},
            marker={"symbol": style.marker(i), "size": 8},
            hovertemplate=f"{what} %{{x}}: barrier %{{y:.4f}} nats<extra>{name}</extra>")
    fig = style.finish(fig, title, x_title, style.BARRIER, "matching option", font_size)
    fig.update_layout(legend={"orientation": "h", "y": -0.22, "x": 0})
    return fig


def training_figure(d: Mapping, style: Style | None = None, title: str | None = None):
    """The barrier between the two series at each common step, one line per matching
    (a `Barriers.to_dict()` of kind training)."""
    return lines_figure(d, (style or Style()).font_size,
                        title or "Barrier between the two runs over training", STEP, "step")


def _caption(d: dict) -> str:
    """The line under the chart on the Training page: the steps paired, and those left out."""
    e = d["extra"]
    left = [f"{len(e[k])} step(s) only in {e[s]}" for k, s in (("only_a", "series_a"),
                                                                ("only_b", "series_b"))
            if e[k]]
    return (f"{len(d['x'])} common steps on {d['n']} test samples"
            + (f"; left out: {'; '.join(left)}." if left else "."))


SECTION = Section(
    "training", 10, "1. The barrier between two runs over training",
    "Each series is a folder of `checkpoint-<step>/` model folders (Hugging Face Trainer's "
    "layout), `zoo:NAME`, or `ORG/NAME` from the local Hugging Face cache (its `step<N>` "
    "revisions, or those named: `ORG/NAME@step1000,step2000`; when the cache lies under the "
    "model roots). Steps are paired by number. The zoo's two runs share their start, so "
    "their barrier is 0 at step 0.",
    defaults={"points": 5}, caption=_caption,
    doing=lambda v: f"every matching at each step, {v['points']} points per path")


TRAINING = register(Measurement(
    "training", "Barriers over training",
    "the barrier between two runs at each common checkpoint step, per matching",
    _run, PARAMS, summary=_summary, plot=training_figure, rows=rows, refusal=AT_SIZE,
    inputs=Inputs((("series_a", "the first " + SERIES_HELP), ("series_b", "second series, the "
                   "same architecture, paired with the first by step")), TwoSeries.read),
    progress=True, section=SECTION, order=140))

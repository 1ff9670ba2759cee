"""The app's computations, without Streamlit: each takes the host's `Resources` and a plain
configuration dict (JSON types only) and returns plain data the pages cache, draw and export.

    from rotviz.app import Resources, run
    res = Resources()                       # loads afresh, keeps models and matched sources
    info = run("match", res, {"anchor": "zoo:vit-digits-s3", "source": "zoo:vit-digits-s6",
                              "spec": "seed", "layers": "", "device": "cpu"})

The pages pass their own `Resources` (rotviz.app.resources; rotviz/ui/runtime.py): models and
splits shared by every session, a lock per model, a bounded cache of matched sources. Long
steps report through a `progress(done, total, message)` callback; nothing here keeps state
between calls. A registered measurement runs through the one runner (rotviz.runner), as the
command line and `rotviz.measure` run it: this module passes only what the app does its own
way (its roots, its cached matching, its memory budget, progress and Stop).

Importing this module imports nothing heavy (no torch, transformers or scipy): every
computation imports what it needs when it runs, so a page paints before they load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rotviz.app import demos, roots, specs, summaries
from rotviz.app.budget import at_size, gb
from rotviz.app.resources import (
    Cancelled,
    PairConfig,
    Resources,
    endpoints,
    load_eval,
    load_test_split,
    matched,
    pair,
    spec_cfg,
    split_of,
)
from rotviz.errors import RotvizError
from rotviz.types import Progress

if TYPE_CHECKING:
    from rotviz.data.split import Split
    from rotviz.measures import Measurement
    from rotviz.sources.loading import Loaded

BARRIER_POINTS = 21  # the Barrier page's default points on the path


# ---- checks for the pages ------------------------------------------------------------------


def check_pair(anchor: Loaded, source: Loaded, split: Split | None = None,
               heads: bool = False) -> None:
    """A one-line RotvizError when the pair cannot be matched or the data does not fit
    (`split`; None: no data is checked, for a page that needs no loss on a pair no loss
    scores, `needs_data`). With `heads`, one body under two heads passes too (matching and
    the views of the weights compare such a pair; a loss does not)."""
    from rotviz.data.reading import check_fits
    from rotviz.sources.pairs import check_compatible

    check_compatible(anchor, source, heads=heads)
    if split is not None:
        check_fits(anchor, split)


def scored_pair(anchor: Loaded, source: Loaded) -> bool:
    """Whether a loss can be evaluated along this pair's path: both heads are scored
    (rotviz.heads) and they are one head (not one body under two heads,
    rotviz.sources.pairs.heads_differ, whose loss would run one head on both)."""
    from rotviz.sources.pairs import heads_differ

    return summaries.is_scored(anchor) and summaries.is_scored(source) and \
        heads_differ(anchor, source) is None


def needs_data(anchor: Loaded, source: Loaded, loss: bool) -> bool:
    """Whether a page must check the data against the pair: always for a page that
    evaluates a loss (`loss`; the check then refuses a head no loss scores, in one line),
    else only for a pair a loss scores (`scored_pair`: the Match page's barriers, the cards'
    metrics). A headless or question-answering pair is matched and viewed with no data."""
    return loss or scored_pair(anchor, source)


def measure_cfg(base: dict, spec: str, /, layers: str = "", learn_steps: int = 0,
                **params: Any) -> dict:
    """The configuration of one measurement: `base` (the sidebar's part: anchor, source,
    data, seed, n_eval, device), the SPEC, the layers to match and the measurement's own
    parameters (those not given keep the record's defaults; positional-only `base` and
    `spec`, so that a parameter may be called `base`: the merge's base model)."""
    return {**base, "layers": layers.strip(), **spec_cfg(spec, learn_steps), "params": params}


def barrier_defaults(base: dict, residual_why: str | None) -> list[dict]:
    """The curves the Barrier page draws on its first visit (its default options and
    points), for the pair in `base`: what the app may compute ahead, after the first page
    has painted, so that the Barrier page finds them ready."""
    from rotviz.measures.barrier import BARRIER

    return [measure_cfg(base, sp, points=BARRIER_POINTS, **BARRIER.animate_params)
            for sp in specs.offered(specs.DEFAULT_SPECS, residual_why)]


# ---- the computations behind `run(kind, res, cfg)`; each returns plain data --------------------


def card(res: Resources, cfg: dict, progress: Progress | None = None) -> dict:
    """The Models page's card of model `ref`: shape, size, head, test loss and accuracy (for
    a head a loss scores), and the check that a random symmetry leaves its function alone
    (summaries.model_card)."""
    m = res.load_eval(cfg["ref"])
    sp = split_of(res, cfg) if summaries.is_scored(m) else None  # no loss: no data read
    with res.using(cfg["ref"]):
        return summaries.model_card(m, sp)


def match(res: Resources, cfg: dict, progress: Progress | None = None) -> dict:
    """Matching `source` onto `anchor` with `spec` on `layers`: distances before and after
    (total, per layer, per kind), the per-head report and the function check."""
    c = PairConfig.of(cfg)
    m = matched(res, c, progress)
    if m is None:
        from rotviz.match.endpoints import unmatched
        from rotviz.match.pipeline import FUNCTION_TOLERANCE

        d = unmatched(*pair(res, c)).info.before
        return {"spec": "none", "report": {"distance_before": d, "distance_after": d, "heads": [],
                                           "max_output_diff": 0.0},
                "before_total": d["total"], "after_total": d["total"], "max_output_diff": 0.0,
                "preserved": True, "tolerance": FUNCTION_TOLERANCE}
    return summaries.match_summary(m, c.label)



def measure(name: str, res: Resources, cfg: dict, progress: Progress | None = None,
            cancel: Callable[[], bool] | None = None) -> dict:
    """The registered measurement `name` (rotviz.measures) on the configuration's endpoints,
    run by the one runner (rotviz.runner), as plain data, with the function check of the
    matched source (`preserved`, `max_output_diff`, `tolerance`). `cancel()` returning True
    stops a training measurement (the app's Stop, through `Context.cancel`); a stopped one
    raises `Cancelled`, so that a half-trained result is never returned, and so never
    cached."""
    from rotviz import runner
    from rotviz.measures import measurement

    record = measurement(name)
    if record.inputs is not None:  # series or a spawn folder: `refs` and `specs`
        return measure_inputs(record, res, cfg, progress, cancel)
    # a widget always holds a value: only those moved off their default count as given
    params = runner.given(record, cfg.get("params") or {}, moved=True)
    values = record.values(params)
    second = record.source is not None and bool(record.source(values)) and cfg.get("source")
    if not record.pair and not second:  # one model (`ref`, else the anchor), twice
        one = cfg.get("ref") or cfg["anchor"]
        cfg = {**cfg, "anchor": one, "source": one, "spec": "none", "layers": ""}
    return measure_pair(record, res, PairConfig.of(cfg), params, at_size(res, cfg), progress,
                        cancel, bool(second))


def measure_pair(record: Measurement, res: Resources, c: PairConfig, params: dict,
                 sizes: tuple[bool, int | None, int | None], progress: Progress | None,
                 cancel: Callable[[], bool] | None, second: bool = True) -> dict:
    """Record `record` on the pair of `c` through the one runner: in memory on the app's
    matched endpoints (cached in `res`), or over the memory budget (`sizes`: at size, the
    need, the budget) as `rotviz COMMAND --max-memory` runs it, with `at_size` in the result
    (the need, the budget, and the memory the run held above what the app held before)."""
    from rotviz import runner
    from rotviz.devices import resolve_device
    from rotviz.match.pipeline import FUNCTION_TOLERANCE
    from rotviz.memory import Watch

    sized, need, limit = sizes
    over = (f"{record.label} is off for this pair: the pair needs {gb(need)} in memory, over "
            f"the budget of {gb(limit)}, so it is read block by block")

    def split(model: Loaded) -> Split | None:
        if not (record.data or c.needs_data):
            return None
        if sized:  # the skeleton reads the data: no weights loaded
            return load_test_split(c.data, c.seed, c.n_eval, model, res.confined())
        return split_of(res, c)

    seen: dict[str, Any] = {}  # the endpoints the record ran on, for the function check
    host = runner.Host(
        resolve_device(c.device), load=res.load_eval, split=split,
        match=lambda a, b, options, data: endpoints(res, c, progress),
        confined=res.confined(), further=res.load,
        at_size_ref=lambda ref: str(roots.resolve_choice(ref)), using=res.using,
        progress=progress, cancel=cancel,
        write=lambda ends, result, ctx: seen.update(ends=ends),
        words=runner.Words(over, "raise the memory budget in the sidebar", "pick a matching"))
    with Watch() as held:
        result = runner.run(record, runner.Pair(c.anchor, c.source, c.label, c.layers or None,
                                                second, sized, c.time_limit), params, host)
    out = result.to_dict()
    if out.get("stopped") == "cancelled":
        raise Cancelled(f"{record.label} was stopped before it finished; nothing was kept. "
                        "Press Run to start again.")
    ends = seen["ends"]
    out.setdefault("match", ends.match)
    diff = ends.info.max_output_diff if ends.info is not None else None
    out.update(max_output_diff=diff, tolerance=FUNCTION_TOLERANCE,
               preserved=diff is None or diff <= FUNCTION_TOLERANCE)
    if sized:
        out["at_size"] = {"need": need, "budget": limit, "held": held.held, "peak": held.peak}
    return out


def inputs_cfg(base: dict, refs: list[str], matchings: list[str], /, **params: Any) -> dict:
    """The configuration of a measurement of series or a spawn folder (a record with
    `inputs`): the sidebar's data, seed, n_eval and device from `base`, the references, the
    matchings and the record's parameters."""
    keep = {k: base[k] for k in ("data", "seed", "n_eval", "device") if k in base}
    return {**keep, "refs": list(refs), "specs": [specs.spec_label(sp) for sp in matchings],
            "params": params}



def measure_inputs(record: Measurement, res: Resources, cfg: dict,
                   progress: Progress | None = None,
                   cancel: Callable[[], bool] | None = None) -> dict:
    """A record that takes series or a spawn folder, on `cfg["refs"]` read through the
    app's roots, each pair matched with every SPEC of `cfg["specs"]`, run by the one runner
    (rotviz.runner.run_inputs); the test split as the first pair's first model reads it."""
    from rotviz import runner

    assert record.inputs is not None
    confined = res.confined()
    refs = []
    for ref in cfg["refs"]:
        name = roots.cache_name(ref)  # the cache is read through `confined` (its roots)
        if name is not None:
            ref = name.forced().text
        elif not ref.startswith("zoo:"):
            roots.check_under_roots(ref, roots.model_roots())
        refs.append(ref)
    inputs = record.inputs.read(tuple(refs), tuple(cfg.get("specs") or ()) or None, confined)

    def split(folder) -> Split:
        return load_test_split(cfg["data"], int(cfg.get("seed", 0)),
                               int(cfg.get("n_eval", 0)), load_eval(str(folder), confined),
                               confined)

    result = runner.run_inputs(record, inputs,
                               runner.given(record, cfg.get("params") or {}, moved=True),
                               split, cfg.get("device", "cpu"), progress, cancel, res.load,
                               # the sidebar's budget: it reaches the matchings that alternate
                               time_limit=float(cfg["match_time"]) if cfg.get("match_time")
                               else None)
    out = result.to_dict()
    if out.get("stopped") == "cancelled":
        raise Cancelled(f"{record.label} was stopped before it finished; nothing was kept. "
                        "Press Run to start again.")
    return out


def learn(res: Resources, cfg: dict, progress: Progress | None = None) -> dict:
    """The Learn page's demo on model `ref`: scramble it with a random symmetry, show its
    outputs stay, match it back (kind rotate, permute, all or residual)."""
    m = res.load_eval(cfg["ref"])
    sp = split_of(res, cfg)
    with res.using(cfg["ref"]):
        return demos.learn_demo(m, sp, cfg["kind"], cfg["demo_seed"], cfg["layer"], cfg["head"])


# The computations that are not measurements of a matched pair; every registered measurement
# (rotviz.measures) is one more, by its name.
COMPUTE: dict[str, Callable[[Resources, dict, Progress | None], Any]] = {
    "card": card, "match": match, "learn": learn,
}


# What each of COMPUTE's computations is called when it is off at size.
WHOLE = {"card": "The model card", "match": "Matching in memory (the per-head report)",
         "learn": "The symmetry demo"}


def kinds() -> list[str]:
    """Every computation `run` knows: COMPUTE's and every registered measurement's."""
    from rotviz.measures import measurements

    return sorted(set(COMPUTE) | {m.name for m in measurements()})


def run(kind: str, res: Resources, cfg: dict, progress: Progress | None = None,
        cancel: Callable[[], bool] | None = None) -> Any:
    """The result of computation `kind` (a key of COMPUTE, or a registered measurement's
    name) for a configuration. `cancel` reaches a measurement's `Context` (training
    measurements such as bend stop when it returns True)."""
    if kind in COMPUTE:
        sized, need, limit = at_size(res, cfg)
        if sized and kind in WHOLE:
            raise RotvizError(f"{WHOLE[kind]} is off for this pair: it holds whole models, and "
                              f"they need {gb(need)} in memory, over the budget of "
                              f"{gb(limit)}; raise the memory budget in the sidebar")
        return COMPUTE[kind](res, cfg, progress)
    if kind in kinds():
        return measure(kind, res, cfg, progress, cancel)
    raise RotvizError(f"no computation '{kind}'; one of {', '.join(kinds())}")

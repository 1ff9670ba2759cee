"""The app's computations, without Streamlit: each takes the host's `Resources` and a plain
configuration dict (JSON types only) and returns plain data the pages cache, draw and export.

    from rotviz.app import Resources, run
    res = Resources()                       # loads afresh, keeps models and matched sources
    info = run("match", res, {"anchor": "zoo:vit-digits-s3", "source": "zoo:vit-digits-s6",
                              "spec": "seed", "layers": "", "device": "cpu"})

The pages pass their own `Resources` (app_pages/runtime.py): models and splits shared by every
session, a lock per model, a bounded cache of matched sources. Long steps report through a
`progress(done, total, message)` callback; nothing here keeps state between calls.

Importing this module imports nothing heavy (no torch, transformers or scipy): every
computation imports what it needs when it runs, so a page paints before they load.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rotviz.app import demos, roots, specs, summaries
from rotviz.app.cache import config_hash
from rotviz.errors import RotvizError
from rotviz.limits import DEFAULT_STEPS
from rotviz.types import Progress

if TYPE_CHECKING:
    from rotviz.confine import Confined
    from rotviz.data import Split
    from rotviz.match.pipeline import Matched
    from rotviz.models import Loaded

DEFAULT_LEARN_STEPS = DEFAULT_STEPS
BARRIER_POINTS = 21  # the Barrier page's default points on the path

# What a page run needs besides the pair: imported ahead by `warm_up` (see there).
COMPUTE_MODULES = ("rotviz.match.pipeline", "rotviz.analysis.landscape",
                   "rotviz.match.alternating", "rotviz.analysis.spectra", "rotviz.analysis.fusion",
                   "rotviz.match.selection")


class Cancelled(RotvizError):
    """Learned matching was cancelled before it finished: nothing of it is kept."""


class Resources:
    """Where the computations get models, splits and matched sources from.

    This default loads models and splits on first use and keeps them, and the matched
    sources, on the instance (never shared between instances: no global state); it locks
    nothing. A host (the app) overrides the methods to share, bound and lock them.
    Models handed out are shared: never modify them. Every file is read through
    `roots.app_confined()` (the model roots as they are configured when it reads).
    """

    def __init__(self) -> None:
        self._models: dict[tuple[str, bool], Loaded] = {}
        self._splits: dict[tuple[str, int, int], Split] = {}
        self._matched: dict[str, Any] = {}

    def load(self, ref: str) -> Loaded:
        """The model `ref` (zoo entry or folder under the model roots), checked on every call."""
        roots.resolve_choice(ref)
        if (ref, True) not in self._models:
            self._models[(ref, True)] = load_full(ref, self.confined())
        return self._models[(ref, True)]

    def load_eval(self, ref: str) -> Loaded:
        """The model `ref` for reading and evaluating only (`load_for_eval`: no transformers
        import where plain torch computes the same logits). Never matched or merged."""
        roots.resolve_choice(ref)
        for full in (True, False):
            if (ref, full) in self._models:
                return self._models[(ref, full)]
        self._models[(ref, False)] = load_eval(ref, self.confined())
        return self._models[(ref, False)]

    def split(self, data: str, seed: int, n: int, ref: str) -> Split:
        """The test split of `data` (its first `n` examples when 0 < n < its size), read the
        way model `ref` reads it (its tokenizer, rotviz.evaluation.split_for)."""
        key = (data, int(seed), int(n), ref)
        if key not in self._splits:
            self._splits[key] = load_test_split(data, seed, n, self.load_eval(ref),
                                                self.confined())
        return self._splits[key]

    def confined(self) -> Confined:
        """What models and data are read through: the app's roots (roots.app_confined)."""
        return roots.app_confined()

    @contextlib.contextmanager
    def using(self, *refs: str) -> Iterator[None]:
        """Held while the models `refs` run (a host serialises shared modules here)."""
        yield

    def remember(self, key: str, compute: Callable[[], Any]) -> Any:
        """The matched source under `key`, computed once (shared: never modify it)."""
        if key not in self._matched:
            self._matched[key] = compute()
        return self._matched[key]


# ---- loading, shared by every Resources --------------------------------------------------------


def load_full(ref: str, confined: Confined | None = None) -> Loaded:
    """A model with its own transformers (or timm) module (`Resources.load`), for a host
    that needs the model's own class; the computations here take `load_eval`'s. Read
    through `confined` (default: the app's, roots.app_confined)."""
    from rotviz.models import load_model

    return load_model(ref, confined=confined or roots.app_confined())


def load_eval(ref: str, confined: Confined | None = None) -> Loaded:
    """A model for reading its weights and evaluating it (rotviz.lite.load_for_eval), read
    through `confined` (default: the app's)."""
    from rotviz.lite import load_for_eval

    return load_for_eval(ref, confined=confined or roots.app_confined())


def load_test_split(data: str, seed: int, n: int, model: Loaded,
                    confined: Confined | None = None) -> Split:
    """The test split of `data` as `model` reads it (first `n` examples when 0 < n), its
    files (data, tokenizer, image processor) read through `confined` (default: the app's)."""
    from rotviz.evaluation import split_for

    s = split_for(model, data, "test", seed, confined=confined or roots.app_confined())
    return s.subset(n) if 0 < n < s.n else s


def warm_up() -> None:
    """Import what the computations need (torch, scipy, the solvers), so the first
    computation does not wait for it. A model's own transformers class is imported when it
    is loaded, and only where rotviz.lite does not compute the same logits."""
    import importlib

    for name in COMPUTE_MODULES:
        importlib.import_module(name)


# ---- checks for the pages ------------------------------------------------------------------


def check_pair(anchor: Loaded, source: Loaded, split: Split | None = None,
               heads: bool = False) -> None:
    """A one-line RotvizError when the pair cannot be matched or the data does not fit
    (`split`; None: no data is checked, for a page that needs no loss on a pair no loss
    scores, `needs_data`). With `heads`, one body under two heads passes too (matching and
    the views of the weights compare such a pair; a loss does not)."""
    from rotviz.evaluation import check_fits
    from rotviz.models import check_compatible

    check_compatible(anchor, source, heads=heads)
    if split is not None:
        check_fits(anchor, split)


def scored_pair(anchor: Loaded, source: Loaded) -> bool:
    """Whether a loss can be evaluated along this pair's path: both heads are scored
    (rotviz.heads) and they are one head (not one body under two heads,
    rotviz.models.heads_differ, whose loss would run one head on both)."""
    from rotviz.models import heads_differ

    return summaries.is_scored(anchor) and summaries.is_scored(source) and \
        heads_differ(anchor, source) is None


def needs_data(anchor: Loaded, source: Loaded, loss: bool) -> bool:
    """Whether a page must check the data against the pair: always for a page that
    evaluates a loss (`loss`; the check then refuses a head no loss scores, in one line),
    else only for a pair a loss scores (`scored_pair`: the Match page's barriers, the cards'
    metrics). A headless or question-answering pair is matched and viewed with no data."""
    return loss or scored_pair(anchor, source)


# ---- configurations ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PairConfig:
    """A computation's configuration, typed and with its matching SPEC parsed once.

    Pages keep configurations as plain dicts of JSON types (they are hashed for the result
    cache and written into exports); `PairConfig.of` reads one, checks its SPEC, and every
    computation here works on the result. `params` are the measurement's own parameters
    (rotviz.measures: points, grid, ...)."""

    anchor: str
    source: str
    label: str  # the canonical matching SPEC
    needs_data: bool  # the SPEC learns from data (act, learned)
    learns: bool  # the SPEC trains (learned)
    layers: str = ""
    device: str = "cpu"
    data: str = ""
    seed: int = 0
    n_eval: int = 0
    learn_steps: int = 0
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, cfg: dict) -> PairConfig:
        from rotviz.match.selection import parse_selection
        from rotviz.symmetry.registry import BY_NAME

        sel = parse_selection(cfg.get("spec", "none"))
        learns = bool(getattr(sel, "learned", False))
        steps = int(cfg.get("learn_steps") or DEFAULT_LEARN_STEPS) if learns else 0
        return cls(
            anchor=cfg["anchor"], source=cfg["source"], label=sel.label,
            needs_data=any(BY_NAME[f].needs_data for f in sel.flags), learns=learns,
            layers=(cfg.get("layers") or "").strip(), device=cfg.get("device", "cpu"),
            data=cfg.get("data", ""), seed=int(cfg.get("seed", 0)),
            n_eval=int(cfg.get("n_eval", 0)), learn_steps=steps,
            params=tuple(sorted((cfg.get("params") or {}).items())))

    @property
    def matched_key(self) -> str:
        """The hash a matched source is kept under: only what changes it (data, the step
        budget and the seed only for the SPECs that use them)."""
        return config_hash({
            "anchor": self.anchor, "source": self.source, "spec": self.label,
            "layers": self.layers, "device": self.device,
            "data": self.data if self.needs_data else "", "learn_steps": self.learn_steps,
            "learn_seed": self.seed if self.learns else 0})


def spec_cfg(spec: str, learn_steps: int = 0) -> dict:
    """The part of a configuration a matching SPEC decides: its canonical label, and the
    learned-matching step budget only when the SPEC learns (so data-free results are shared
    by every page whatever the budget field says)."""
    label = specs.spec_label(spec)
    out: dict[str, Any] = {"spec": label}
    if specs.learns(label):
        out["learn_steps"] = int(learn_steps or DEFAULT_LEARN_STEPS)
    return out


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


# ---- matching, shared by the computations ----------------------------------------------------


def pair(res: Resources, cfg: dict | PairConfig) -> tuple[Loaded, Loaded]:
    """Both models of a configuration, checked to be matchable. The computations here read
    and evaluate models and never save one, so they take them as `Resources.load_eval` gives
    them: plain torch where that computes the same logits (rotviz.lite: no transformers
    import, the same numbers), the model's own class otherwise. One body under two heads is
    a pair too (matching aligns the body); a measurement of the loss refuses it in one line
    (`measure`: rotviz.measures.refuse_heads)."""
    from rotviz.models import check_compatible

    anchor, source = (cfg.anchor, cfg.source) if isinstance(cfg, PairConfig) else \
        (cfg["anchor"], cfg["source"])
    a, b = res.load_eval(anchor), res.load_eval(source)
    check_compatible(a, b, heads=True)
    return a, b


def layers_of(text: str | None, n_layers: int) -> tuple[int, ...] | None:
    from rotviz.match.options import parse_layers

    return parse_layers((text or "").strip() or None, n_layers)


def n_layers(loaded: Loaded) -> int:
    from rotviz.match.pipeline import view_of

    return view_of(loaded).dims.n_layers


def options_of(c: PairConfig, a: Loaded):
    """The MatchOptions a configuration asks for (None for 'none'), on anchor `a`."""
    from rotviz.match.options import LearnOptions
    from rotviz.match.selection import match_options

    opts = match_options(c.label, layers_of(c.layers, n_layers(a)))
    if opts is not None and c.learns:
        opts = dataclasses.replace(opts, learn=LearnOptions(steps=c.learn_steps, seed=c.seed))
    return opts


def matched(res: Resources, cfg: dict | PairConfig, progress: Progress | None = None,
            cancel: Callable[[], bool] | None = None) -> Matched | None:
    """The source matched onto the anchor (a `Matched`, shared: never modify), or None for
    spec 'none'. Activation and learned matching train on `data`'s train split (learned
    matching checks its last maps on its val split, runs at most `learn_steps` steps and draws its
    batches with `seed`); `progress(done, total, message)` hears about every step, and
    `cancel()` returning True stops learned matching (then nothing is kept: `Cancelled`)."""
    c = cfg if isinstance(cfg, PairConfig) else PairConfig.of(cfg)
    if c.label == "none":
        return None

    def run():
        from rotviz.match.pipeline import match_models

        a, b = pair(res, c)
        opts = options_of(c, a)
        train = None
        if c.needs_data:  # read here, through the app's Confined: a data reference would be
            # read by the engine as the command line reads it (the engine's
            # train.sibling("train") reads the same split again, so the numbers are those of
            # the reference)
            from rotviz.evaluation import split_for

            train = split_for(a, c.data, "train", confined=res.confined())
        with res.using(c.anchor, c.source):
            m = match_models(a, b, opts, c.device, progress, train, cancel)
        learned = m.report.learned or {}
        if learned.get("stopped") == "cancelled":
            raise Cancelled(f"learned matching was cancelled after {learned.get('steps')} of "
                            f"{c.learn_steps} steps; nothing was kept. Press Run to start "
                            "again.")
        return m

    return res.remember(c.matched_key, run)


def endpoints(res: Resources, cfg: dict | PairConfig, progress: Progress | None = None):
    """The configuration's endpoints (rotviz.match.endpoints.HeldEndpoints), matched once
    through `res` and shared by every measurement of the pair."""
    from rotviz.match.endpoints import from_matched

    c = cfg if isinstance(cfg, PairConfig) else PairConfig.of(cfg)
    a, b = pair(res, c)
    m = matched(res, c, progress)
    return from_matched(a, b, m, None if m is None else options_of(c, a))


def _split_of(res: Resources, cfg: dict | PairConfig) -> Split:
    if isinstance(cfg, PairConfig):
        return res.split(cfg.data, cfg.seed, cfg.n_eval, cfg.anchor)
    return res.split(cfg["data"], cfg["seed"], cfg["n_eval"], cfg.get("anchor") or cfg["ref"])


# ---- at size: a pair larger than the memory budget ----------------------------------------------


def gb(n: int | None) -> str:
    """Bytes in words: GB from 0.1 GB up, MB below."""
    if n is None:
        return "an unknown amount"
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def check_pair_at_size(res: Resources, cfg: dict, loss: bool = True) -> None:
    """`check_pair` for a pair read block by block: both folders opened for streaming (their
    headers and configs checked as the command line checks them), matchable, and the data
    read as the anchor reads it, with no weights loaded (not read where `needs_data` says
    so: no `loss` and a head no loss scores)."""
    from rotviz.evaluation import check_fits
    from rotviz.models import check_compatible
    from rotviz.stream.blocks import open_streamed
    from rotviz.stream.sized import sized_loaded

    a = open_streamed(cfg["anchor"], res.confined())
    b = open_streamed(cfg["source"], res.confined())
    check_compatible(a, b)  # type: ignore[arg-type]  # duck-typed: meta state
    skeleton = sized_loaded(a)
    if not loss and not all(summaries.is_scored(m) for m in (a, b)):  # reads config only
        return  # a pair no loss scores, on a page that needs none: no data to check
    check_fits(skeleton, load_test_split(cfg["data"], int(cfg.get("seed", 0)),
                                         int(cfg.get("n_eval", 0)), skeleton, res.confined()))


def at_size(res: Resources, cfg: dict) -> tuple[bool, int | None, int | None]:
    """Whether the configuration's models must be read block by block: (at size, what
    holding them needs, the budget), in bytes. The budget is `max_memory` (bytes; absent or
    0: what the machine has free now), and the need is the command line's estimate from the
    safetensors headers (rotviz.stream.need.pair_bytes_in_memory); one model (`ref`)
    needs half its pair. A folder without safetensors cannot stream and is never at size."""
    from rotviz.memory import available_memory
    from rotviz.stream.need import pair_bytes_in_memory

    one = cfg.get("ref")
    anchor, source = (one, one) if one else (cfg.get("anchor"), cfg.get("source"))
    if not anchor or not source:
        return False, None, None
    limit = int(cfg.get("max_memory") or 0) or available_memory()
    need = pair_bytes_in_memory(anchor, source, res.confined())
    if need is not None and one:
        need //= 2
    return need is not None and limit is not None and need > limit, need, limit


def params_in(res: Resources, ref: str) -> int:
    """The parameters of model `ref`, from its safetensors headers when it has them (nothing
    loaded: a model larger than memory is counted too), else from the loaded model."""
    from rotviz.checkpoint import Checkpoint
    from rotviz.models import resolve_ref

    try:
        checkpoint = Checkpoint(resolve_ref(ref, res.confined()), res.confined())
    except RotvizError:
        return summaries.n_params(res.load_eval(ref))
    total = 0
    for e in checkpoint.entries.values():
        n = 1
        for d in e.shape:
            n *= d
        total += n
    return total


def residual_why(res: Resources, ref: str, sized: bool = False) -> str | None:
    """Why this model's residual stream cannot be matched (a tied output head, ...), or None;
    at size, asked of the model's skeleton (no weights read)."""
    if not sized:
        return summaries.residual_unsupported(res.load_eval(ref))
    from rotviz.heads import residual_refusal
    from rotviz.stream.blocks import open_streamed
    from rotviz.stream.sized import sized_loaded
    from rotviz.symmetry.residual import unsupported
    from rotviz.symmetry.view import read_view

    skeleton = sized_loaded(open_streamed(ref, res.confined()))  # weights on meta: no data
    return residual_refusal(skeleton.config) or \
        unsupported(read_view(skeleton.spec, skeleton.config, skeleton.state))


def _measure_at_size(record, res: Resources, c: PairConfig, values: dict,
                     sizes: tuple[int | None, int | None], progress: Progress | None,
                     cancel: Callable[[], bool] | None) -> dict:
    """A measurement of a pair over the memory budget, as `rotviz COMMAND --max-memory`
    runs it: the pair opened for streaming (headers only, through the app's roots), the
    source matched block by block into a temporary folder, then the record's at-size
    implementation, or a one-line refusal from the record. The result holds `at_size`: what
    the pair needs in memory, the budget, and the memory the run held above what the app
    held before it (sampled while it ran)."""
    from rotviz.devices import resolve_device
    from rotviz.match.pipeline import FUNCTION_TOLERANCE
    from rotviz.match.selection import match_options
    from rotviz.measures import Context
    from rotviz.memory import Watch
    from rotviz.models import check_compatible
    from rotviz.stream.blocks import open_streamed
    from rotviz.stream.endpoints import streamed_endpoints
    from rotviz.stream.sized import sized_loaded

    need, limit = sizes
    over = (f"the pair needs {gb(need)} in memory, over the budget of {gb(limit)}, so it is "
            "read block by block")
    why = record.why_not_at_size()
    if why:
        raise RotvizError(f"{record.label} is off for this pair: {over}, and {why}; raise the "
                          "memory budget in the sidebar")
    if record.at_size_check is not None:
        record.at_size_check(values)
    if values.get("base"):  # a merge's base, read block by block too: only under the roots
        values = {**values, "base": str(roots.resolve_choice(values["base"]))}
    a, b = open_streamed(c.anchor, res.confined()), open_streamed(c.source, res.confined())
    check_compatible(a, b)  # type: ignore[arg-type]  # duck-typed: meta state
    options = match_options(c.label, layers_of(c.layers, a.dims.n_layers))
    if record.needs_match and options is None:
        raise RotvizError(f"{record.label} at size needs a matched source for its second "
                          "direction: pick a matching, or raise the memory budget")
    split = None
    if record.data:
        split = load_test_split(c.data, c.seed, c.n_eval, sized_loaded(a), res.confined())
    device = resolve_device(c.device)
    with Watch() as held, streamed_endpoints(a, b, options, device) as ends:
        result = record.at_size(ends, Context(split, device, progress=progress,
                                              cancel=cancel), values)
    out = result.to_dict()
    if out.get("stopped") == "cancelled":
        raise Cancelled(f"{record.label} was stopped before it finished; nothing was kept. "
                        "Press Run to start again.")
    out.setdefault("match", ends.match)
    diff = ends.info.max_output_diff if ends.info is not None else None
    out.update(max_output_diff=diff, tolerance=FUNCTION_TOLERANCE,
               preserved=diff is None or diff <= FUNCTION_TOLERANCE,
               at_size={"need": need, "budget": limit, "held": held.held, "peak": held.peak})
    return out


# ---- the computations behind `run(kind, res, cfg)`; each returns plain data --------------------


def card(res: Resources, cfg: dict, progress: Progress | None = None) -> dict:
    """The Models page's card of model `ref`: shape, size, head, test loss and accuracy (for
    a head a loss scores), and the check that a random symmetry leaves its function alone
    (summaries.model_card)."""
    m = res.load_eval(cfg["ref"])
    sp = _split_of(res, cfg) if summaries.is_scored(m) else None  # no loss: no data read
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
    as plain data, with the function check of the matched source (`preserved`,
    `max_output_diff`, `tolerance`). `cancel()` returning True stops a training measurement
    (the app's Stop, through `Context.cancel`); a stopped one raises `Cancelled`, so that
    a half-trained result is never returned, and so never cached."""
    from rotviz.devices import resolve_device
    from rotviz.match.pipeline import FUNCTION_TOLERANCE
    from rotviz.measures import Context, measurement, refuse_heads

    record = measurement(name)
    if record.inputs is not None:  # series or a spawn folder: `refs` and `specs`
        return measure_inputs(record, res, cfg, progress, cancel)
    defaults = {p.name: p.default for p in record.parameters()}
    # a widget always holds a value: only those moved off their default count as given
    values = record.values({k: v for k, v in (cfg.get("params") or {}).items()
                            if k not in defaults or v != defaults[k]})
    second = record.source is not None and bool(record.source(values)) and cfg.get("source")
    if not record.pair and not second:  # one model (`ref`, else the anchor), twice
        one = cfg.get("ref") or cfg["anchor"]
        cfg = {**cfg, "anchor": one, "source": one, "spec": "none", "layers": ""}
    c = PairConfig.of(cfg)
    if record.match_check is not None:  # before any matching
        from rotviz.match.selection import match_options

        why = record.match_check(match_options(c.label))
        if why:
            raise RotvizError(why)
    sized, need, limit = at_size(res, cfg)
    if sized:
        return _measure_at_size(record, res, c, values, (need, limit), progress, cancel)
    ends = endpoints(res, c, progress)
    refuse_heads(record, ends)  # one body under two heads: no loss through one head on both
    split = _split_of(res, c) if record.data else None
    with res.using(c.anchor, c.source):
        result = record.run(ends, Context(split, resolve_device(c.device), progress=progress,
                                          cancel=cancel, load=res.load), values)
    out = result.to_dict()
    if out.get("stopped") == "cancelled":
        raise Cancelled(f"{record.label} was stopped before it finished; nothing was kept. "
                        "Press Run to start again.")
    out.setdefault("match", ends.match)
    diff = ends.info.max_output_diff
    out.update(max_output_diff=diff, tolerance=FUNCTION_TOLERANCE,
               preserved=diff is None or diff <= FUNCTION_TOLERANCE)
    return out


def inputs_cfg(base: dict, refs: list[str], matchings: list[str], /, **params: Any) -> dict:
    """The configuration of a measurement of series or a spawn folder (a record with
    `inputs`): the sidebar's data, seed, n_eval and device from `base`, the references, the
    matchings and the record's parameters."""
    keep = {k: base[k] for k in ("data", "seed", "n_eval", "device") if k in base}
    return {**keep, "refs": list(refs), "specs": [specs.spec_label(sp) for sp in matchings],
            "params": params}


def measure_inputs(record, res: Resources, cfg: dict, progress: Progress | None = None,
                   cancel: Callable[[], bool] | None = None) -> dict:
    """A record that takes series or a spawn folder, on `cfg["refs"]` read through the
    app's roots, each pair matched with every SPEC of `cfg["specs"]`; the test split as the
    first pair's first model reads it."""
    from rotviz.devices import resolve_device
    from rotviz.measures import Context

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
    defaults = {p.name: p.default for p in record.parameters()}
    given = dict(cfg.get("params") or {})
    moved = {k: v for k, v in given.items() if k not in defaults or v != defaults[k]}
    values = record.values(moved)
    if record.inputs.check is not None:
        record.inputs.check(inputs, values, set(moved))
    first = load_eval(str(inputs.first_pair()[0]), confined)
    split = load_test_split(cfg["data"], int(cfg.get("seed", 0)), int(cfg.get("n_eval", 0)),
                            first, confined)
    result = record.run(inputs, Context(split, resolve_device(cfg.get("device", "cpu")),
                                        progress=progress, cancel=cancel, load=res.load),
                        values)
    out = result.to_dict()
    if out.get("stopped") == "cancelled":
        raise Cancelled(f"{record.label} was stopped before it finished; nothing was kept. "
                        "Press Run to start again.")
    return out


def learn(res: Resources, cfg: dict, progress: Progress | None = None) -> dict:
    """The Learn page's demo on model `ref`: scramble it with a random symmetry, show its
    outputs stay, match it back (kind rotate, permute, all or residual)."""
    m = res.load_eval(cfg["ref"])
    sp = _split_of(res, cfg)
    with res.using(cfg["ref"]):
        return demos.learn_demo(m, sp, cfg["kind"], cfg["demo_seed"], cfg["layer"], cfg["head"])


# The computations that are not measurements of a matched pair; every registered measurement
# (rotviz.measures: barrier, plane, merge, distances, spectra, ...) is one more, by its name.
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

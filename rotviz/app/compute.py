"""The app's computations, without Streamlit: each takes the host's `Resources` and a plain
configuration dict (JSON types only) and returns plain data the pages cache, draw and export.

    from rotviz.app import Resources, run
    res = Resources()                       # loads afresh, keeps models and matched sources
    info = run("match", res, {"anchor": "zoo:vit-digits-s3", "source": "zoo:vit-digits-s6",
                              "spec": "seed", "layers": "", "device": "cpu"})

The pages pass their own `Resources` (pages/common.py): models and splits shared by every
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

from rotviz import appconfig, explore
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
    `appconfig.app_confined()` (the model roots as they are configured when it reads).
    """

    def __init__(self) -> None:
        self._models: dict[tuple[str, bool], Loaded] = {}
        self._splits: dict[tuple[str, int, int], Split] = {}
        self._matched: dict[str, Any] = {}

    def load(self, ref: str) -> Loaded:
        """The model `ref` (zoo entry or folder under the model roots), checked on every call."""
        appconfig.resolve_choice(ref)
        if (ref, True) not in self._models:
            self._models[(ref, True)] = load_full(ref, self.confined())
        return self._models[(ref, True)]

    def load_eval(self, ref: str) -> Loaded:
        """The model `ref` for reading and evaluating only (`load_for_eval`: no transformers
        import where plain torch computes the same logits). Never matched or merged."""
        appconfig.resolve_choice(ref)
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
        """What models and data are read through: the app's roots (appconfig.app_confined)."""
        return appconfig.app_confined()

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
    through `confined` (default: the app's, appconfig.app_confined)."""
    from rotviz.models import load_model

    return load_model(ref, confined=confined or appconfig.app_confined())


def load_eval(ref: str, confined: Confined | None = None) -> Loaded:
    """A model for reading its weights and evaluating it (rotviz.lite.load_for_eval), read
    through `confined` (default: the app's)."""
    from rotviz.lite import load_for_eval

    return load_for_eval(ref, confined=confined or appconfig.app_confined())


def load_test_split(data: str, seed: int, n: int, model: Loaded,
                    confined: Confined | None = None) -> Split:
    """The test split of `data` as `model` reads it (first `n` examples when 0 < n), its
    files (data, tokenizer, image processor) read through `confined` (default: the app's)."""
    from rotviz.evaluation import split_for

    s = split_for(model, data, "test", seed, confined=confined or appconfig.app_confined())
    return s.subset(n) if 0 < n < s.n else s


def warm_up() -> None:
    """Import what the computations need (torch, scipy, the solvers), so the first
    computation does not wait for it. A model's own transformers class is imported when it
    is loaded, and only where rotviz.lite does not compute the same logits."""
    import importlib

    for name in COMPUTE_MODULES:
        importlib.import_module(name)


# ---- small facts for the pages -------------------------------------------------


def residual_why(loaded: Loaded) -> str | None:
    """Why this model's residual stream cannot be matched (e.g. a tied output head), or
    None. Asked of the anchor: both models of a pair share the architecture."""
    return explore.residual_unsupported(loaded)


def check_pair(anchor: Loaded, source: Loaded, split: Split) -> None:
    """A one-line RotvizError when the pair cannot be matched or the data does not fit."""
    from rotviz.evaluation import check_fits
    from rotviz.models import check_compatible

    check_compatible(anchor, source)
    check_fits(anchor, split)


def n_params(loaded: Loaded) -> int:
    return explore.n_params(loaded)


def ended_by_cap(residual_info: dict) -> bool:
    """Whether the round cap, not the tolerance, ended some phase of the alternation."""
    from rotviz.match.alternating import ended_by_cap as ended

    return ended(residual_info)


def group_text(group: str) -> str | None:
    """The residual group's name in words (rotviz.symmetry.residual.GROUP_TEXT), None if unknown."""
    from rotviz.symmetry.residual import GROUP_TEXT

    return GROUP_TEXT.get(group)


# ---- matching, shared by the computations ----------------------------------------------------


def spec_cfg(spec: str, learn_steps: int = 0) -> dict:
    """The part of a configuration a matching SPEC decides: its canonical label, and the
    learned-matching step budget only when the SPEC learns (so data-free results are shared
    by every page whatever the budget field says)."""
    label = explore.spec_label(spec)
    out: dict[str, Any] = {"spec": label}
    if explore.learns(label):
        out["learn_steps"] = int(learn_steps or DEFAULT_LEARN_STEPS)
    return out


def curve_cfg(base: dict, spec: str, points: int = 21, layers: str = "",
              learn_steps: int = 0) -> dict:
    """The configuration of one Barrier-page curve: `base` (the sidebar's part: anchor,
    source, data, seed, n_eval, device), the SPEC, the points on the path and the layers."""
    return {**base, "layers": layers.strip(), **spec_cfg(spec, learn_steps), "points": points}


def barrier_defaults(base: dict, residual_why: str | None) -> list[dict]:
    """The curves the Barrier page draws on its first visit (its default options and
    points), for the pair in `base`: what the app may compute ahead, after the first page
    has painted, so that the Barrier page finds them ready."""
    return [curve_cfg(base, sp, BARRIER_POINTS)
            for sp in explore.offered(explore.DEFAULT_SPECS, residual_why)]


def pair(res: Resources, cfg: dict) -> tuple[Loaded, Loaded]:
    """Both models of a configuration, checked to be matchable. The computations here read
    and evaluate models and never save one, so they take them as `Resources.load_eval` gives
    them: plain torch where that computes the same logits (rotviz.lite: no transformers
    import, the same numbers), the model's own class otherwise."""
    from rotviz.models import check_compatible

    a, b = res.load_eval(cfg["anchor"]), res.load_eval(cfg["source"])
    check_compatible(a, b)
    return a, b


def layers_of(text: str | None, n_layers: int) -> tuple[int, ...] | None:
    from rotviz.match.options import parse_layers

    return parse_layers((text or "").strip() or None, n_layers)


def n_layers(loaded: Loaded) -> int:
    from rotviz.match.pipeline import view_of

    return view_of(loaded).dims.n_layers


def matched_key(anchor: str, source: str, spec: str, layers: str, device: str, data: str = "",
                learn_steps: int = 0, seed: int = 0) -> str:
    """The hash a matched source is kept under: only what changes it (data, the step budget
    and the seed only for the SPECs that use them)."""
    label = explore.spec_label(spec)
    needs, learns = explore.needs_data(label), explore.learns(label)
    steps = int(learn_steps or DEFAULT_LEARN_STEPS) if learns else 0
    return appconfig.config_hash({
        "anchor": anchor, "source": source, "spec": label, "layers": layers or "",
        "device": device, "data": data if needs else "", "learn_steps": steps,
        "learn_seed": seed if learns else 0})


def matched(res: Resources, anchor: str, source: str, spec: str, layers: str, device: str,
            data: str = "", learn_steps: int = 0, seed: int = 0,
            progress: Progress | None = None,
            cancel: Callable[[], bool] | None = None) -> Matched | None:
    """The source matched onto the anchor (a `Matched`, shared: never modify), or None for
    spec 'none'. Activation and learned matching train on `data`'s train split (learned
    matching early-stops on its val split, runs at most `learn_steps` steps and draws its
    batches with `seed`); `progress(done, total, message)` hears about every step, and
    `cancel()` returning True stops learned matching (then nothing is kept: `Cancelled`)."""
    label = explore.spec_label(spec)
    if label == "none":
        return None
    needs, learns = explore.needs_data(label), explore.learns(label)
    steps = int(learn_steps or DEFAULT_LEARN_STEPS) if learns else 0

    def run():
        from rotviz.match.options import LearnOptions
        from rotviz.match.pipeline import match_models
        from rotviz.match.selection import match_options

        a, b = pair(res, {"anchor": anchor, "source": source})
        opts = match_options(label, layers_of(layers, n_layers(a)))
        if learns:
            opts = dataclasses.replace(opts, learn=LearnOptions(steps=steps, seed=seed))
        train = None
        if needs:  # read here, through the app's Confined: a data reference would be read
            # by the engine as the command line reads it (the engine's train.sibling("train")
            # reads the same split again, so the numbers are those of the reference)
            from rotviz.evaluation import split_for

            train = split_for(a, data, "train", confined=res.confined())
        with res.using(anchor, source):
            m = match_models(a, b, opts, device, progress, train, cancel)
        learned = m.report.learned or {}
        if learned.get("stopped") == "cancelled":
            raise Cancelled(f"learned matching was cancelled after {learned.get('steps')} of "
                            f"{steps} steps; nothing was kept. Press Run to start again.")
        return m

    key = matched_key(anchor, source, label, layers, device, data, learn_steps, seed)
    return res.remember(key, run)


def _matched_of(res: Resources, cfg: dict, progress: Progress | None = None):
    return matched(res, cfg["anchor"], cfg["source"], cfg["spec"], cfg.get("layers", ""),
                   cfg["device"], cfg.get("data", ""), cfg.get("learn_steps", 0),
                   cfg.get("seed", 0), progress)


def _split_of(res: Resources, cfg: dict) -> Split:
    return res.split(cfg["data"], cfg["seed"], cfg["n_eval"], cfg.get("anchor") or cfg["ref"])


# ---- the computations behind `run(kind, res, cfg)`; each returns plain data --------------------


def card(res: Resources, cfg: dict, progress: Progress | None = None) -> dict:
    """The Models page's card of model `ref`: shape, size, test loss and accuracy, and the
    check that a random symmetry leaves its function alone (explore.model_card)."""
    m = res.load_eval(cfg["ref"])
    sp = _split_of(res, cfg)
    with res.using(cfg["ref"]):
        return explore.model_card(m, sp)


def match(res: Resources, cfg: dict, progress: Progress | None = None) -> dict:
    """Matching `source` onto `anchor` with `spec` on `layers`: distances before and after
    (total, per layer, per kind), the per-head report and the function check."""
    m = _matched_of(res, cfg, progress)
    if m is None:
        from rotviz.match.distances import distances
        from rotviz.match.pipeline import view_of

        a, b = pair(res, cfg)
        d = distances(view_of(b), view_of(a)).to_dict()
        return {"spec": "none", "report": {"distance_before": d, "distance_after": d, "heads": [],
                                           "max_output_diff": 0.0},
                "before_total": d["total"], "after_total": d["total"], "max_output_diff": 0.0,
                "preserved": True, "tolerance": explore.FUNCTION_TOLERANCE}
    return explore.match_summary(m, cfg["spec"])


def curve(res: Resources, cfg: dict, progress: Progress | None = None) -> dict:
    """Test loss and accuracy at `points` evenly spaced points of the straight path from the
    anchor to the matched source, its barrier, and the matching's distances and check."""
    from rotviz.analysis.landscape import interpolate

    a, b = pair(res, cfg)
    sp = _split_of(res, cfg)
    m = _matched_of(res, cfg, progress)
    state = b.state if m is None else m.state
    with res.using(cfg["anchor"], cfg["source"]):
        c = interpolate(a, b, sp, None, points=cfg["points"], device=cfg["device"],
                        source_state=state).to_dict()
    info = match(res, cfg, progress)
    c.update(match=cfg["spec"], distance_before=info["before_total"],
             distance_after=info["after_total"], max_output_diff=info["max_output_diff"],
             preserved=info["preserved"])
    return c


def plane(res: Resources, cfg: dict, progress: Progress | None = None) -> dict:
    """Test loss on a `grid` x `grid` plane through anchor, source and matched source."""
    from rotviz.analysis.landscape import loss_plane

    a, b = pair(res, cfg)
    sp = _split_of(res, cfg)
    m = _matched_of(res, cfg, progress)
    state = b.state if m is None else m.state
    with res.using(cfg["anchor"], cfg["source"]):
        p = loss_plane(a, b, sp, None, grid=cfg["grid"], device=cfg["device"], seed=cfg["seed"],
                       source_state=state)
    out = p.to_dict()
    out["match"] = cfg["spec"]
    return out


def circuits(res: Resources, cfg: dict, progress: Progress | None = None) -> dict:
    """Cross-matrix and invariant circuit spectra of anchor, source and matched source."""
    from rotviz.analysis.spectra import spectra
    from rotviz.match.pipeline import view_of
    from rotviz.symmetry.view import read_view

    a, b = pair(res, cfg)
    m = _matched_of(res, cfg, progress)
    mv = None if m is None else read_view(b.spec, b.config, m.state)
    lay = layers_of(cfg["layers"], n_layers(a))
    return spectra(view_of(a), view_of(b), mv, lay).to_dict()


def fusion(res: Resources, cfg: dict, progress: Progress | None = None) -> dict:
    """Merged accuracy for every method and matching option (rotviz.analysis.fusion.fusion_table, on
    sources matched through `res`, so they are shared with the other computations)."""
    a, b = pair(res, cfg)
    sp = _split_of(res, cfg)
    states = {}
    for spec in cfg["specs"]:
        m = _matched_of(res, {**cfg, **spec_cfg(spec, cfg.get("learn_steps", 0)), "layers": ""},
                        progress)
        states[explore.spec_label(spec)] = None if m is None else m.state
    with res.using(cfg["anchor"], cfg["source"]):
        return explore.fusion_with_states(a, b, sp, states, cfg["methods"], cfg["weight"],
                                          cfg["batches"], 32, cfg["alpha"], cfg["device"],
                                          cfg["seed"])


def learn(res: Resources, cfg: dict, progress: Progress | None = None) -> dict:
    """The Learn page's demo on model `ref`: scramble it with a random symmetry, show its
    outputs stay, match it back (kind rotate, permute, all or residual)."""
    m = res.load_eval(cfg["ref"])
    sp = _split_of(res, cfg)
    with res.using(cfg["ref"]):
        return explore.learn_demo(m, sp, cfg["kind"], cfg["demo_seed"], cfg["layer"], cfg["head"])


COMPUTE: dict[str, Callable[[Resources, dict, Progress | None], Any]] = {
    "card": card, "match": match, "curve": curve, "plane": plane, "learn": learn,
    "circuits": circuits, "fusion": fusion,
}


def run(kind: str, res: Resources, cfg: dict, progress: Progress | None = None) -> Any:
    """The result of computation `kind` (a key of COMPUTE) for a configuration."""
    try:
        fn = COMPUTE[kind]
    except KeyError:
        raise RotvizError(f"no computation '{kind}'; one of {sorted(COMPUTE)}") from None
    return fn(res, cfg, progress)

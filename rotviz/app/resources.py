"""Where the app's computations get models, splits and matched sources: `Resources` (the
default keeps them on the instance; the pages pass their own, shared and locked), loading
through the app's roots, a computation's configuration (`PairConfig`) and the matching every
computation of a pair shares (`matched`, `endpoints`).

Importing this module imports nothing heavy (no torch, transformers or scipy): each function
imports what it needs when it runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rotviz.app import roots, specs
from rotviz.app.cache import config_hash
from rotviz.errors import RotvizError
from rotviz.limits import DEFAULT_STEPS
from rotviz.types import Progress

if TYPE_CHECKING:
    from rotviz.confine import Confined
    from rotviz.data.split import Split
    from rotviz.match.pipeline import Matched
    from rotviz.sources.loading import Loaded

DEFAULT_LEARN_STEPS = DEFAULT_STEPS

# What a page run needs besides the pair: imported ahead by `warm_up` (see there).
COMPUTE_MODULES = ("rotviz.match.pipeline", "rotviz.analysis.paths", "rotviz.analysis.planes",
                   "rotviz.match.alternating", "rotviz.match.layer_solvers",
                   "rotviz.analysis.fusion", "rotviz.match.selection")


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
        way model `ref` reads it (its tokenizer, rotviz.data.reading.split_for)."""
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
    from rotviz.sources.loading import load_model

    return load_model(ref, confined=confined or roots.app_confined())


def load_eval(ref: str, confined: Confined | None = None) -> Loaded:
    """A model for reading its weights and evaluating it (rotviz.sources.plain_torch.load_for_eval),
    read through `confined` (default: the app's)."""
    from rotviz.sources.plain_torch import load_for_eval

    return load_for_eval(ref, confined=confined or roots.app_confined())


def load_test_split(data: str, seed: int, n: int, model: Loaded,
                    confined: Confined | None = None) -> Split:
    """The test split of `data` as `model` reads it (first `n` examples when 0 < n), its
    files (data, tokenizer, image processor) read through `confined` (default: the app's)."""
    from rotviz.data.reading import split_for

    s = split_for(model, data, "test", seed, confined=confined or roots.app_confined())
    return s.subset(n) if 0 < n < s.n else s


def warm_up() -> None:
    """Import what the computations need (torch, scipy, the solvers), so the first
    computation does not wait for it. A model's own transformers class is imported when it
    is loaded, and only where rotviz.sources.plain_torch does not compute the same logits."""
    import importlib

    for name in COMPUTE_MODULES:
        importlib.import_module(name)




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
    # seconds weight matching's alternation may take: the sidebar's budget, kept only for a
    # SPEC with the residual map (no other matching alternates); None: no limit
    time_limit: float | None = None

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
            params=tuple(sorted((cfg.get("params") or {}).items())),
            time_limit=float(cfg["match_time"]) if cfg.get("match_time") and getattr(
                sel, "residual", False) else None)

    @property
    def matched_key(self) -> str:
        """The hash a matched source is kept under: only what changes it (data, the step
        budget and the seed only for the SPECs that use them)."""
        return config_hash({
            "anchor": self.anchor, "source": self.source, "spec": self.label,
            "layers": self.layers, "device": self.device,
            "data": self.data if self.needs_data else "", "learn_steps": self.learn_steps,
            "learn_seed": self.seed if self.learns else 0,
            # only a budget that applies: every other matching keeps its key
            **({"time_limit": self.time_limit} if self.time_limit is not None else {})})


def spec_cfg(spec: str, learn_steps: int = 0) -> dict:
    """The part of a configuration a matching SPEC decides: its canonical label, and the
    learned-matching step budget only when the SPEC learns (so data-free results are shared
    by every page whatever the budget field says)."""
    label = specs.spec_label(spec)
    out: dict[str, Any] = {"spec": label}
    if specs.learns(label):
        out["learn_steps"] = int(learn_steps or DEFAULT_LEARN_STEPS)
    return out




# ---- matching, shared by the computations ----------------------------------------------------


def pair(res: Resources, cfg: dict | PairConfig) -> tuple[Loaded, Loaded]:
    """Both models of a configuration, checked to be matchable. The computations here read
    and evaluate models and never save one, so they take them as `Resources.load_eval` gives
    them: plain torch where that computes the same logits (rotviz.sources.plain_torch: no
    transformers import, the same numbers), the model's own class otherwise. One body under two
    heads is a pair too (matching aligns the body); a measurement of the loss refuses it in one line
    (`measure`, `fusion`: rotviz.measures.refuse_heads)."""
    from rotviz.sources.pairs import check_compatible

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
    from rotviz.match.options import LearnOptions, limited
    from rotviz.match.selection import match_options

    opts = limited(match_options(c.label, layers_of(c.layers, n_layers(a))), c.time_limit)
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
            from rotviz.data.reading import split_for

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


def split_of(res: Resources, cfg: dict | PairConfig) -> Split:
    if isinstance(cfg, PairConfig):
        return res.split(cfg.data, cfg.seed, cfg.n_eval, cfg.anchor)
    return res.split(cfg["data"], cfg["seed"], cfg["n_eval"], cfg.get("anchor") or cfg["ref"])



"""Training with and without teleport steps (Zhao, Dehmamy, Walters and Yu, NeurIPS 2022;
Zhao et al., ICLR 2024): the seeded training loop of rotviz.measures.teleport_train, the
fresh initialisation it starts from, and one function-checked teleport (grad-max along the
orbit, rotviz.analysis.teleporting.climb).

The two runs share everything but the teleports: the initial state, the optimiser and its
settings, and the data order (a numpy generator seeded with `seed` draws each step's batch
without replacement, as rotviz.measures.bend does; the teleport examples come from a second
generator, so the batches are the same in both runs). After steps K, 2K, ... (before the
next step; never after the last) the teleport run draws `examples` train examples (a fresh
random batch each time, as Zhao et al.'s code draws a teleport batch from its own shuffled
loader) and climbs the gradient norm on them. The group element is not applied to Adam's
moments: by default (`moments` "reset"), as in Zhao et al.'s code (the optimiser is made
anew after each teleport), the optimiser's state is reset; "keep" keeps the moments taken
at the old point (their coordinates no longer match the moved parameters)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch

from rotviz.errors import RotvizError

if TYPE_CHECKING:
    from rotviz.data.split import Split
    from rotviz.evaluation import Evaluator
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

Tensor = torch.Tensor
OPTIMIZERS = ("sgd", "adam")
LOSS_TOL = 1e-5  # a teleport's train loss on its examples, relative (float64)
LOGIT_TOL = 1e-4  # its logits there, relative to the largest |logit|


def fresh_state(loaded: Loaded, seed: int) -> dict[str, Tensor]:
    """`loaded`'s architecture re-initialised by its own Hugging Face init
    (`_init_weights` on every module) under a private RNG seeded with `seed`: the caller's
    RNG and the loaded model are untouched (a deep copy is initialised; a lite module,
    which has no Hugging Face init, is read again as the full model first)."""
    with torch.random.fork_rng(devices=[]):  # building a module draws numbers too
        model = _hf_module(loaded)
        _forget_loading(model)
        torch.manual_seed(int(seed))
        with torch.no_grad():
            model.apply(model._init_weights)
    st = model.state_dict()
    return {k: st[k].detach().clone().to(v.dtype) for k, v in loaded.state.items()}


def _hf_module(loaded: Loaded):
    """A copy of `loaded`'s module with its Hugging Face init: a deep copy, or for a lite
    module (which has none) the full model read again."""
    model = loaded.model
    if not hasattr(model, "_init_weights"):
        from rotviz.sources.loading import load_model

        try:
            model = load_model(loaded.path).model
        except RotvizError:
            model = None
        if model is None or not hasattr(model, "_init_weights"):
            raise RotvizError(f"--init fresh needs a Hugging Face model's own init "
                              f"(_init_weights), which {loaded.ref} lacks; use --init model")
        return model
    return copy.deepcopy(model)


def _forget_loading(model) -> None:
    """Clear transformers' marks of loaded tensors (`_is_hf_initialized`, on modules and,
    from version 5, on parameters), which make its init functions skip them."""
    for mod in model.modules():
        if getattr(mod, "_is_hf_initialized", False):
            mod._is_hf_initialized = False
    for t in [*model.parameters(), *model.buffers()]:
        if getattr(t, "_is_hf_initialized", False):
            t._is_hf_initialized = False


@dataclass
class RunLog:
    """One run: the train loss (its step's batch, before the update) per step, the test
    loss and accuracy every `eval_every` steps and at the end, the teleports (none for the
    plain run), and the run's seconds."""

    train_loss: list[float] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)  # {"step", "test_loss", "test_acc"}
    events: list[dict] = field(default_factory=list)
    final_test_loss: float = float("nan")
    final_test_acc: float = float("nan")
    teleport_seconds: float = 0.0
    seconds: float = 0.0
    stopped: str = "steps"  # or "cancelled"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Schedule:
    """What both runs share."""

    steps: int
    every: int  # a teleport after steps every, 2 every, ... (not after the last)
    teleport_steps: int
    optimizer: str = "adam"
    lr: float = 1e-3
    seed: int = 0
    batch_size: int = 64
    eval_every: int = 50
    examples: int = 128  # train examples each teleport climbs on
    max_condition: float = 30.0
    group: str = "qk,vo"
    moments: str = "reset"  # Adam's moments after a teleport: reset (Zhao et al.) or keep


def _optimizer(params: list[Tensor], how: Schedule):
    if how.optimizer == "sgd":
        return torch.optim.SGD(params, lr=how.lr)
    if how.optimizer == "adam":
        return torch.optim.Adam(params, lr=how.lr)
    raise RotvizError(f"--optimizer {how.optimizer}: use one of {', '.join(OPTIMIZERS)}")


def teleport_once(loaded: Loaded, state: Mapping[str, Tensor], split: Split, how: Schedule,
                  device, batch_size: int = 512) -> tuple[dict[str, Tensor], dict]:
    """Climb the gradient norm of the loss on `split` (the teleport's examples) along the
    orbit for `how.teleport_steps` steps from `state`. Returns the new state and the event
    (gradient norm and train loss before and after, the element's condition number, the
    function check); a teleport whose check fails is not taken (the state comes back as
    it was, `kept` False)."""
    from rotviz.analysis.hvp import Curvature
    from rotviz.analysis.orbit import Orbit, max_condition
    from rotviz.analysis.teleporting import _point, climb
    from rotviz.evaluation import Evaluator

    t0 = time.perf_counter()
    ev = Evaluator(loaded, split, device, batch_size)
    orbit = Orbit.of(loaded, how.group, state=state)
    start = _point(ev, dict(state), "grad-max", None, 0)
    run = climb(loaded, orbit, ev, start, "grad-max", how.teleport_steps, how.max_condition,
                None)
    after = run.here.state
    la, lb = (Curvature(ev, s, torch.float64).loss() for s in (state, after))
    x = ev.batches[0][0]
    ya, yb = (ev.logits(ev.params(s), x).double() for s in (state, after))
    logits = float((ya - yb).abs().max() / ya.abs().max().clamp_min(1e-30))
    loss_rel = abs(lb - la) / max(abs(la), 1e-30)
    kept = run.taken > 0 and loss_rel <= LOSS_TOL and logits <= LOGIT_TOL
    event = {"orbit_steps": run.taken, "grad_norm_before": start.grad_norm,
             "grad_norm_after": run.here.grad_norm, "train_loss_before": la,
             "train_loss_after": lb, "loss_relative": loss_rel, "logits_relative": logits,
             "condition": max_condition(run.element) if run.element else 1.0,
             "kept": kept, "seconds": time.perf_counter() - t0}
    return (dict(after) if kept else dict(state)), event


def train_run(loaded: Loaded, train: Evaluator, test: Evaluator, init: Mapping[str, Tensor],
              how: Schedule, teleport: bool, progress: Progress | None = None,
              cancel: Callable[[], bool] | None = None, label: str = "") -> tuple[dict, RunLog]:
    """Train from `init` for `how.steps` steps on `train`'s examples (seeded batches),
    with teleports when `teleport` (and `how.every` < steps); the test split evaluated
    every `how.eval_every` steps and at the end. Returns the final state (`init`'s keys and
    dtypes) and the log. `init` is never modified."""
    import numpy as np

    from rotviz.data.inputs import cat_inputs, map_inputs
    from rotviz.match.learned import _train_loss

    t0 = time.perf_counter()
    log = RunLog()
    base = {k: v.detach().clone() for k, v in init.items()}
    params = {k: v.clone().requires_grad_(v.is_floating_point())
              for k, v in train.params(base).items()}
    trained = [v for v in params.values() if v.requires_grad]
    optim = _optimizer(trained, how)
    order = np.random.default_rng(how.seed)
    draws = np.random.default_rng([how.seed, 1])  # the teleport examples: its own stream
    xs = cat_inputs([x for x, _ in train.batches])
    ys = torch.cat([y for _, y in train.batches])
    n = len(ys)
    size = min(how.batch_size, n)

    def state_now() -> dict[str, Tensor]:
        return {**base, **{k: v.detach().to(base[k].device) for k, v in params.items()}}

    def evaluate(step: int) -> None:
        loss, acc = test.evaluate(test.params(state_now()))
        log.evals.append({"step": step, "test_loss": loss, "test_acc": acc})

    evaluate(0)
    for step in range(1, how.steps + 1):
        if cancel is not None and cancel():
            log.stopped = "cancelled"
            break
        pick = torch.as_tensor(order.choice(n, size=size, replace=False)).to(ys.device)
        loss = _train_loss(train, params, map_inputs(xs, lambda v, i=pick: v[i]), ys[pick])
        optim.zero_grad()
        loss.backward()
        optim.step()
        log.train_loss.append(float(loss.detach()))
        if progress:
            progress(step, how.steps, f"{label}step {step}: train loss {log.train_loss[-1]:.3f}")
        if step % how.eval_every == 0 and step < how.steps:
            evaluate(step)
        if teleport and step % how.every == 0 and step < how.steps:
            idx = torch.as_tensor(np.sort(draws.choice(n, size=min(how.examples, n),
                                                       replace=False)))
            new, event = teleport_once(loaded, state_now(), train.split.take(idx), how,
                                       train.device)
            log.events.append({"step": step, **event})
            log.teleport_seconds += event["seconds"]
            if event["kept"]:
                with torch.no_grad():
                    for k, v in params.items():
                        v.copy_(new[k].to(v.device, v.dtype))
                if how.moments == "reset":  # a new optimiser, as Zhao et al.'s code
                    optim = _optimizer(trained, how)
    final = state_now()
    log.final_test_loss, log.final_test_acc = test.evaluate(test.params(final))
    last = log.evals[-1]["step"] if log.evals else -1
    done = len(log.train_loss)
    if last != done:
        log.evals.append({"step": done, "test_loss": log.final_test_loss,
                          "test_acc": log.final_test_acc})
    log.seconds = time.perf_counter() - t0
    return final, log

"""Teleporting while training (Zhao, Dehmamy, Walters and Yu, NeurIPS 2022; Zhao et al.,
ICLR 2024): two runs from one initialisation with the same seeded data order and the same
optimiser, one plain and one that teleports (climbs the gradient norm along the symmetry
orbit, loss unchanged) every K steps (docs/landscape.md, "teleport_train"). The record and
its figure (loss against step, the teleports marked); the training loop, the fresh
initialisation and the teleport step are rotviz.analysis.teleport_training's."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from rotviz.limits import BATCH_SIZE, LR, SEED, STEPS, Bound
from rotviz.measures.registry import Context, Measurement, Section, register
from rotviz.plots.figure_style import Style

if TYPE_CHECKING:
    from rotviz.data.split import Split
    from rotviz.sources.loading import Loaded
    from rotviz.types import Progress

INITS = ("fresh", "model")
OPTIMIZERS = ("sgd", "adam")
MOMENTS = ("reset", "keep")
EVERY = Bound("--every", 1, 100_000)
TELEPORT_STEPS = Bound("--teleport-steps", 1, 1_000)
EXAMPLES = Bound("--teleport-examples", 1, 100_000)
EVAL_EVERY = Bound("--eval-every", 1, 100_000)
CONDITION = Bound("--max-condition", 1.0, 1e6, integer=False)


def _params():
    from rotviz.params import Param

    return (
        Param("steps", 300, f"training steps of each run (default 300, {STEPS.text})", STEPS,
              label="Training steps", widget=(10, 1000, 10), essential=True),
        Param("every", 25, "teleport after every K-th step (never after the last; K >= "
              f"--steps: no teleport; default 25, {EVERY.text})", EVERY,
              label="Teleport every K steps", widget=(1, 500, 1), essential=True),
        Param("teleport_steps", 1, "gradient-ascent steps along the orbit per teleport "
              f"(default 1; more climb further, to sharper points; {TELEPORT_STEPS.text})",
              TELEPORT_STEPS,
              label="Steps per teleport", widget=(1, 50, 1)),
        Param("optimizer", "adam", "the optimiser of both runs: sgd (plain) or adam (its "
              "moments reset after each teleport; default adam)", choices=OPTIMIZERS,
              label="Optimiser", essential=True),
        Param("lr", 0.002, f"learning rate (default 0.002, {LR.text})", LR,
              label="Learning rate"),
        Param("moments", "reset", "Adam's moments after a teleport (the group element does "
              "not move them): reset, a new optimiser as in Zhao et al.'s code, or keep "
              "(default reset)", choices=MOMENTS, label="Adam's moments after a teleport"),
        Param("init", "fresh", "fresh: the model's architecture re-initialised by its own "
              "Hugging Face init (seeded with --seed); model: its own weights (default "
              "fresh)", choices=INITS, label="Initialisation"),
        Param("group", "all", "the symmetries to teleport along, a comma list of qk, vo, "
              "ffn-scale (gated and ReLU FFNs only); all: qk,vo and ffn-scale where the "
              "model has it (default all)", label="Symmetry groups", metavar="GROUPS"),
        Param("teleport_examples", 128, "train examples each teleport climbs on, a fresh "
              f"seeded draw each time (default 128, {EXAMPLES.text})", EXAMPLES,
              label="Examples per teleport", widget=(8, 1024, 8)),
        Param("eval_every", 50, "evaluate the test split every this many steps and at the "
              f"end (default 50, {EVAL_EVERY.text})", EVAL_EVERY, label="Evaluate every"),
        Param("max_condition", 30.0, "the largest condition number a teleport's element may "
              f"reach (default 30, {CONDITION.text})", CONDITION,
              label="Largest condition number"),
        Param("seed", 0, "seed of the initialisation (fresh), the batches and the teleport "
              "examples (default 0)", SEED, label="Seed"),
        Param("batch_size", 64, f"training batch size (default 64, {BATCH_SIZE.text})",
              BATCH_SIZE, label="Training batch size"),
    )


def _check(values: dict, given: set[str]) -> None:
    from rotviz.analysis.orbit import parse_groups

    if values["group"] != "all":
        parse_groups(values["group"])


@dataclass
class TeleportTrainResult:
    """Both runs; `to_dict()` is the JSON (the final states, `states`, are left out)."""

    model: str
    data: str
    split: str  # trained on
    test_split: str  # evaluated on
    group: list[str]
    n_params: int
    steps: int
    every: int
    teleport_steps: int
    teleport_examples: int
    optimizer: str
    lr: float
    init: str
    moments: str
    seed: int
    batch_size: int
    eval_every: int
    max_condition: float
    plain: dict
    teleport: dict
    seconds: float = 0.0
    device: str = "cpu"
    states: dict = field(default_factory=dict, repr=False)
    # the teleports' function check: the largest relative logit change of a teleport kept
    # (each on its own train examples), against the tolerance; None without a teleport
    function_check: dict | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("states")
        return d


def _groups(loaded: Loaded, group: str) -> str:
    """'all' read at this model: qk,vo, and ffn-scale where every FFN allows it."""
    if group != "all":
        return group
    from rotviz.analysis.tangents import ffn_has_scales
    from rotviz.symmetry.view import read_view

    view = read_view(loaded.spec, loaded.config, loaded.state)
    return "qk,vo,ffn-scale" if all(ffn_has_scales(b.ffn) for b in view.blocks) else "qk,vo"


def teleport_train(loaded: Loaded, train: Split, test: Split, steps: int = 300,
                   every: int = 25, teleport_steps: int = 1, optimizer: str = "adam",
                   lr: float = 0.002, init: str = "fresh", group: str = "all",
                   teleport_examples: int = 128, eval_every: int = 50,
                   max_condition: float = 30.0, seed: int = 0, batch_size: int = 64,
                   device="cpu", progress: Progress | None = None,
                   cancel=None, moments: str = "reset") -> TeleportTrainResult:
    """Train `loaded`'s architecture on `train` twice from one initialisation (`init`:
    fresh or the model's own weights), plain and with a teleport after every `every`-th
    step, both evaluated on `test`. Seeded: the same call gives the same histories; the
    loaded model and the caller's RNG are never touched. The result's `states` hold each
    run's final state."""
    from rotviz.analysis.orbit import Orbit
    from rotviz.analysis.teleport_training import Schedule, fresh_state, train_run
    from rotviz.errors import RotvizError
    from rotviz.evaluation import Evaluator

    if init not in INITS:
        raise RotvizError(f"--init {init}: use one of {', '.join(INITS)}")
    if moments not in MOMENTS:
        raise RotvizError(f"--moments {moments}: use one of {', '.join(MOMENTS)}")
    if optimizer not in OPTIMIZERS:
        raise RotvizError(f"--optimizer {optimizer}: use one of {', '.join(OPTIMIZERS)}")
    for b, v in ((STEPS, steps), (EVERY, every), (TELEPORT_STEPS, teleport_steps),
                 (EVAL_EVERY, eval_every), (EXAMPLES, teleport_examples)):
        b.check(v)
    t0 = time.perf_counter()
    group = _groups(loaded, group)
    orbit = Orbit.of(loaded, group)  # refuses ffn-scale on a GELU FFN, before any training
    start = fresh_state(loaded, seed) if init == "fresh" else dict(loaded.state)
    ev_train = Evaluator(loaded, train, device, 512)
    ev_test = Evaluator(loaded, test, device, 512)
    how = Schedule(steps, every, teleport_steps, optimizer, lr, seed, batch_size, eval_every,
                   teleport_examples, max_condition, group, moments)
    total = 2 * steps

    def part(offset: int):
        if progress is None:
            return None
        return lambda k, n, text: progress(offset + k, total, text)

    s_plain, plain = train_run(loaded, ev_train, ev_test, start, how, False, part(0), cancel,
                               "plain: ")
    s_tel, tel = train_run(loaded, ev_train, ev_test, start, how, True, part(steps), cancel,
                           "with teleport: ")
    n_params = sum(v.numel() for k, v in start.items() if k in ev_train.names)
    return TeleportTrainResult(
        loaded.ref, train.data, train.split, test.split, list(orbit.groups), n_params,
        steps, every, teleport_steps, teleport_examples, optimizer, lr, init, moments, seed,
        batch_size, eval_every, max_condition, plain.to_dict(), tel.to_dict(),
        seconds=time.perf_counter() - t0, device=str(ev_train.device),
        states={"plain": s_plain, "teleport": s_tel}, function_check=_checked(tel.to_dict()))


def _checked(run: dict) -> dict | None:
    """The worst kept teleport's logit change (relative) and train-loss change, or None."""
    from rotviz.analysis.teleport_training import LOGIT_TOL, LOSS_TOL

    kept = [e for e in run.get("events", []) if e.get("kept")]
    if not kept:
        return None
    rel = max(e["logits_relative"] for e in kept)
    loss = max(e["loss_relative"] for e in kept)
    return {"relative": rel, "tolerance": LOGIT_TOL, "loss_relative": loss,
            "loss_tolerance": LOSS_TOL, "preserved": rel <= LOGIT_TOL and loss <= LOSS_TOL,
            "what": f"the worst of the {len(kept)} teleports vs. the model before it, on the "
                    f"first batch of its train examples (train loss changed by at most "
                    f"{loss:.1g}, relative)"}


def _run(ends, ctx: Context, v: dict):
    r = teleport_train(ends.anchor, ctx.split.sibling("train"), ctx.split, v["steps"],
                       v["every"], v["teleport_steps"], v["optimizer"], v["lr"], v["init"],
                       v["group"], v["teleport_examples"], v["eval_every"],
                       v["max_condition"], v["seed"], v["batch_size"], ctx.device,
                       ctx.progress, ctx.cancel, v["moments"])
    r.model = ends.anchor_ref
    return r


def _events_text(d: dict) -> str:
    ev = d["teleport"]["events"]
    if not ev:
        return "no teleport"
    g = ", ".join(f"{e['grad_norm_before']:.3g}→{e['grad_norm_after']:.3g}" for e in ev[:4])
    more = ", ..." if len(ev) > 4 else ""
    return f"{len(ev)} teleports (gradient norm on their examples {g}{more})"


def _summary(r, how: str) -> str:
    d = r.to_dict()
    p, t = d["plain"], d["teleport"]
    return (f"teleport_train ({r.optimizer} lr {r.lr:g}, {r.init} init, {r.steps} steps, "
            f"every {r.every}) on {r.device}{how}: final {r.test_split} loss / accuracy "
            f"plain {p['final_test_loss']:.4f} / {p['final_test_acc']:.4f}, with teleport "
            f"{t['final_test_loss']:.4f} / {t['final_test_acc']:.4f}; {_events_text(d)}; "
            f"{r.seconds:.1f} s")


def _smooth(xs: list[float], w: int) -> list[float]:
    """The running mean over the last `w` steps (a batch's loss is noisy)."""
    out, s = [], 0.0
    for i, x in enumerate(xs):
        s += x - (xs[i - w] if i >= w else 0.0)
        out.append(s / min(i + 1, w))
    return out


def teleport_train_figure(d: dict, style: Style | None = None):
    """Train loss (running mean over 10 steps) against step, one line per run, the
    teleports marked; the test loss at the evaluations as markers; the final test
    accuracies in the legend."""
    import plotly.graph_objects as go

    from rotviz.plots import style as st

    style = style or Style()
    fig = go.Figure()
    for i, (key, name) in enumerate((("plain", "plain"), ("teleport", "with teleport"))):
        run = d[key]
        ys = _smooth(run["train_loss"], 10)
        acc = run["final_test_acc"]
        fig.add_scatter(x=list(range(1, len(ys) + 1)), y=ys, mode="lines",
                        name=f"{name}: train loss (final test acc {acc:.3f})",
                        line={"color": st.color(i), "dash": st.dash(i)})
        ev = run["evals"]
        fig.add_scatter(x=[e["step"] for e in ev], y=[e["test_loss"] for e in ev],
                        mode="markers", name=f"{name}: test loss",
                        marker={"color": st.color(i), "symbol": st.marker(i), "size": 9})
    for j, e in enumerate(d["teleport"]["events"]):
        fig.add_vline(x=e["step"], line={"color": st.color(2), "dash": "dot", "width": 1})
        fig.add_scatter(x=[e["step"]], y=[e["train_loss_before"]], mode="markers",
                        name="teleport (loss on its examples)", showlegend=j == 0,
                        marker={"color": st.color(2), "symbol": "star", "size": 12})
    st.finish(fig, f"Training {d['model']} ({d['init']} init, {d['optimizer']} lr "
              f"{d['lr']:g}) with and without teleporting every {d['every']} steps",
              "training step", "loss (cross-entropy, nats)", "run", style.font_size)
    if style.log:
        fig.update_yaxes(type="log")
    return fig


def _rows(d: dict) -> list[dict]:
    rows = []
    for key in ("plain", "teleport"):
        run = d[key]
        tel = {e["step"]: e for e in run["events"]}
        ev = {e["step"]: e for e in run["evals"]}
        for k, loss in enumerate(run["train_loss"], start=1):
            e, t = ev.get(k, {}), tel.get(k, {})
            rows.append({"run": key, "step": k, "train_loss": loss,
                         "test_loss": e.get("test_loss"), "test_acc": e.get("test_acc"),
                         "grad_norm_before": t.get("grad_norm_before"),
                         "grad_norm_after": t.get("grad_norm_after")})
    return rows


def _caption(d: dict) -> str:
    p, t = d["plain"], d["teleport"]
    return (f"{d['steps']} steps of {d['optimizer']} (lr {d['lr']:g}, batch "
            f"{d['batch_size']}) from the {d['init']} initialisation: final test loss "
            f"{p['final_test_loss']:.4f} plain, {t['final_test_loss']:.4f} with teleport; "
            f"test accuracy {p['final_test_acc']:.3f} plain, {t['final_test_acc']:.3f} with "
            f"teleport; {_events_text(d)}, each keeping its train loss; "
            f"{p['seconds']:.1f} s plain, {t['seconds']:.1f} s with teleport "
            f"({t['teleport_seconds']:.1f} s teleporting).")


SECTION = Section(
    "landscape", 70, "6. Teleporting while training",
    "Zhao et al. (2022, 2024) teleport during training: every K steps, climb the gradient "
    "norm along the symmetry orbit (the loss and every output unchanged), then train on. "
    "Two runs from one initialisation with the same batches and optimiser, plain and with "
    "teleports (the dotted lines); Adam's moments are reset after each teleport. Whether "
    "it speeds training up depends on the optimiser and the step: see docs/landscape.md "
    "for what we measured (on the zoo's digits ViT with Adam, no consistent gain: a "
    "larger gradient on the orbit comes with a sharper point, and resetting Adam's moments "
    "alone gives most of the early speed-up). Small defaults: a CPU Run takes seconds.",
    defaults={"steps": 200, "every": 25, "teleport_examples": 64, "eval_every": 25},
    caption=_caption,
    doing=lambda v: f"two training runs of {v['steps']} steps (teleport every {v['every']})")

TELEPORT_TRAIN = register(Measurement(
    "teleport_train", "Teleporting while training",
    "train one model's architecture twice from one initialisation, plain and with a "
    "gradient-norm teleport along its symmetry orbit every K steps: loss against step and "
    "the final test accuracy of each",
    _run, _params, summary=_summary, plot=teleport_train_figure, rows=_rows, pair=False,
    check=_check, progress=True,
    refusal="training runs the whole model forward and backward at every step and "
            "teleporting takes Hessian-vector products of it, held in memory",
    section=SECTION, order=106))

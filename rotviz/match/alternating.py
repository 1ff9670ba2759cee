"""Weight matching with the residual stream: alternate the per-layer maps and the residual map.

The residual map acts on the other side of every matrix than the FFN and head maps, so each
is solved exactly given the others: per-layer maps (the seed paper's) on the canonical forms,
then the residual map, and again, until a round gains less than `options.tol` of the starting
objective. With head permutation on, a second phase then alternates with it too: assigning
heads before the stream is aligned locks in poor choices (a higher barrier than when heads
join after convergence: bench/RESULTS.md). Every step includes the identity among its
choices, so the objective (squared distance to the anchor) never goes up; the report keeps
its history.

On large models the FFN solve (an m x m cost matrix per layer) is most of a round and, once
the units are in place, often moves none. With `options.ffn_backoff`, rounds then hold the
FFN maps and re-solve the rest, a fraction of a round, and the FFN solve comes back after 1,
2, 4, ... rounds and whenever the rest settles; a phase ends only on a round that solved
everything. It is off by default: it reaches a different local optimum (bench/weight.py).

The rounds (`alternate`) run on a state that holds the two canonical models: in memory
(rotviz.match.residual), or at size, read a block at a time from the checkpoints
(rotviz.match.at_size_residual), one pass per round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import torch

from rotviz.errors import RotvizError
from rotviz.match import joint as jn
from rotviz.match.distances import distances
from rotviz.match.memo import TensorMemo
from rotviz.match.options import MatchOptions
from rotviz.match.report import HeadReport
from rotviz.symmetry import residual as rs
from rotviz.symmetry.actions import LayerTransform
from rotviz.symmetry.view import ModelView
from rotviz.types import Progress

T = TypeVar("T")


def objective(src: ModelView, anc: ModelView, memo: TensorMemo | None = None) -> float:
    """The squared Euclidean distance that weight matching minimises."""
    return distances(src, anc, memo=memo).total ** 2


def ended_by_cap(info: dict) -> bool:
    """Whether a report's residual info (`MatchReport.residual`) says the round cap, not
    the stopping rule, ended some phase of the alternation."""
    return "rounds" in info.get("phase_ended", ["converged" if c else "rounds"
                                               for c in info.get("converged", [True])])


def summary_line(info: dict) -> str:
    """The alternation in words, one line: rounds run, the gain, the first round's share of
    it and why it stopped (the command line prints it at the end of a match)."""
    why = {"converged": "a round gained less than --tol of the start",
           "stalled": "a round gained less than --stall of the total gain",
           "time": "--time-limit was reached", "rounds": "--rounds was reached"}
    before = info["distance_canonical_before"]
    return (f"alternation: {info['rounds']} round(s), canonical distance {before:.4f} -> "
            f"{info['distance_canonical_after']:.4f} (gain {info.get('gain', 0.0):.4g} in "
            f"squared distance), first round {100 * info.get('first_share', 0.0):.1f}% of it; "
            f"ended {info['ended']}: {why.get(info['ended'], info['ended'])}")


def check_residual(view: ModelView, options: MatchOptions) -> str:
    """The residual group to use here, or a one-line error saying what is allowed."""
    why = rs.unsupported(view)
    if why:
        raise RotvizError(f"residual matching is unavailable for {view.spec.family}: {why}")
    return rs.check_group(view, options.residual_group)


@dataclass
class Step:
    """One round's per-layer maps: the new maps, the chosen layers' reports and the
    objective after them."""

    transforms: dict[int, LayerTransform]
    layers: list[HeadReport]
    objective: float
    # FFN units of the chosen layers, where `transforms` holds only some of them (one torchrun
    # process's blocks); None: count them in `transforms`
    units: int | None = None

    def moved(self) -> float:
        """The share of the FFN units this step moved (the same on every process)."""
        units = self.units if self.units is not None else sum(
            len(t.perm) for t in self.transforms.values() if t.perm is not None)
        return sum(rep.ffn_moved for rep in self.layers) / max(units, 1)


class State(Protocol):
    """The two canonical models an alternation works on (in memory, or at size)."""

    def initial(self) -> float:
        """The objective before the first step (known once a step or turn has run)."""

    def layers(self, options: MatchOptions, full: bool) -> Step:
        """Solve and apply the per-layer maps of `options` (`full`: a round that solves the
        FFN maps, which first catch up with the residual map when they lag behind it)."""

    def turn(self, group: str, settle: bool) -> tuple[torch.Tensor, float]:
        """Solve the residual map, apply it and return it with the objective after it
        (`settle`: the FFN tensors follow it now rather than lag behind)."""

    def cross(self) -> torch.Tensor:
        """The residual cross matrix M of the current state (d x d, float64)."""

    def move(self, q: torch.Tensor) -> None:
        """Turn the stream by `q` (the FFN tensors may lag behind it)."""

    def save(self) -> object:
        """What `load` needs to come back to the current state."""

    def load(self, saved: object) -> None:
        """Come back to a state `save` returned."""

    def agree(self, decision: T) -> T:
        """The main process's `decision`, on every process (one process: `decision`), so
        that all of torchrun's processes stop, step or go back together."""


@dataclass
class Alternated:
    """What the rounds found: per-layer maps (composed), the residual map, the first
    round's per-layer reports and the run's residual info for the report."""

    transforms: dict[int, LayerTransform]
    residual: torch.Tensor | None
    layers: list[HeadReport]
    info: dict


# A rotation stream's continuous block (rotviz.match.joint) ends when a step gains less than
# this share of `tol`, or after this many steps.
BLOCK_TOL, BLOCK_STEPS = 0.1, 30
RADIUS = 1.0  # the first quasi-Newton step's largest generator (Frobenius norm)
# A round that moves more than this share of the FFN units takes one plain step: the units
# follow the stream (measured: docs/solvers.md, "Joint steps on a rotation stream").
FOLLOW = 0.05


def joint_steps(options: MatchOptions, group: str) -> bool:
    """Whether the alternation takes joint quasi-Newton steps (rotviz.match.joint) on the
    continuous maps between full rounds: on rotation streams, unless the plain rounds (or the
    FFN back-off, which belongs to them) are asked for. A permutation stream's map is
    discrete and its plain rounds converge."""
    return group != "permutation" and not options.plain_rounds and not options.ffn_backoff


class _Run:
    """The bookkeeping of one alternation: the objective's history, the composed maps and
    the first round's per-layer reports."""

    def __init__(self, state: State):
        self.state = state
        self.history: list[float] = []
        self.transforms: dict[int, LayerTransform] = {}
        self.q_total: torch.Tensor | None = None
        self.first: Step | None = None

    def record(self, value: float) -> None:
        if not self.history:
            self.history.append(self.state.initial())
        self.history.append(value)

    def take(self, step: Step) -> None:
        """Compose a per-layer step's maps and record its objective."""
        self.first = self.first or step
        for i, t in step.transforms.items():
            self.transforms[i] = self.transforms[i].then(t) if i in self.transforms else t
        self.record(step.objective)

    def turned(self, q: torch.Tensor) -> None:
        self.q_total = q if self.q_total is None else self.q_total @ q


ENDINGS = ("converged", "stalled", "time", "rounds")  # how an alternation ends (`ended`)


def _now() -> float:
    """The alternation's clock, in seconds (a function of its own so that a test can drive
    the time limit round by round)."""
    return time.perf_counter()


def stop_reason(gain: float, total: float, start: float, options: MatchOptions) -> str | None:
    """Why the alternation stops after a round that gained `gain` (squared distance), with
    `total` gained since the start `start`: `converged` when the round gained at most `tol` of
    the start (the old rule), `stalled` when it gained less than `stall` of the total so far
    (the first rounds earn nearly everything; the later ones creep: docs/solvers.md), else
    None. When both hold, `converged` is said: it is the stronger statement."""
    if gain <= options.tol * start:
        return "converged"
    if gain < options.stall * total:
        return "stalled"
    return None


def _worst(endings: list[str]) -> str:
    """The one word for the whole run: the phase ending that says the most was left (time,
    then the round cap, then a stall, then convergence)."""
    for word in ("time", "rounds", "stalled"):
        if word in endings:
            return word
    return "converged"


class _Best:
    """The lowest objective at the end of any round, and what `State.load` and the run need
    to come back to it: the steps never raise the objective beyond float32 roundoff, but a
    run stopped by the clock returns its best state, not merely its last."""

    def __init__(self) -> None:
        self.value = float("inf")
        self.saved: tuple | None = None

    def keep(self, run: _Run) -> None:
        if run.history[-1] < self.value:
            self.value = run.history[-1]
            self.saved = (run.state.save(), dict(run.transforms), run.q_total)

    def restore(self, run: _Run) -> bool:
        """Come back to the best state when the last is higher; whether it did."""
        if self.saved is None or run.history[-1] <= self.value:
            return False
        saved, transforms, run.q_total = self.saved
        run.state.load(saved)
        run.transforms = dict(transforms)
        return True


def alternate(state: State, options: MatchOptions, group: str,
              progress: Progress | None = None,
              on_round: Callable[[int, int], None] | None = None,
              replay: Sequence[int] | None = None) -> Alternated:
    """The rounds and phases of the alternation (see module) on `state`. `on_round(phase,
    round)` is called after each round (phase 0 without head permutation, 1 with it; rounds
    from 1), while the state holds that round's result.

    A phase stops at the first round (one that solved everything) for which `stop_reason`
    says so, or at `options.rounds`; the whole run stops at the end of the round that
    crosses `options.time_limit` seconds (0: after the first round), and then returns the
    lowest-objective state any round ended at. `state.agree` makes every stopping decision
    one decision across torchrun's processes. `replay` (rounds per phase, a report's
    `phase_rounds`) takes the clock's place: the last of those phases ends after its rounds,
    so a run its time limit stopped is repeated round for round (rotviz.measures.rounds)."""
    # Head assignments made before the stream is aligned lock in poor choices, so with heads
    # on, a first phase alternates without them until it converges, then a second with them.
    phases = [replace(options, residual=False, heads=False)]
    if options.heads:
        phases.append(replace(options, residual=False))
    run = _Run(state)
    best = _Best()
    total = options.rounds * len(phases)
    rounds: list[int] = []
    endings: list[str] = []  # per phase: one of ENDINGS
    gains: list[float | None] = []  # per phase: its last round's gain / the start
    per_round: list[dict] = []  # the report's history, one entry per round
    held = steps = plain = 0
    joint = joint_steps(options, group)
    t0 = _now()
    clock = t0
    out_of_time = False
    for k, inner in enumerate(phases):
        rounds.append(0)
        endings.append("rounds")
        gains.append(None)
        phase = _joint_phase if joint else _plain_phase
        for r, start, counts in phase(run, inner, options, group, k, total, progress):
            held += counts[0]
            steps += counts[1]
            plain += counts[2]
            start = run.history[0] if start is None else start
            rounds[-1] = r + 1
            now = _now()
            per_round.append({"phase": k, "round": r + 1, "objective": run.history[-1],
                              "gain": start - run.history[-1], "seconds": now - clock,
                              "ffn_held": bool(counts[0]), "steps": counts[1] + counts[2],
                              "units_moved": counts[3]})
            clock = now
            best.keep(run)
            if on_round is not None:
                on_round(k, r + 1)
                clock = _now()  # the hook's time (the rounds record measures) is no round's
            origin = run.history[0]
            gains[-1] = (start - run.history[-1]) / origin if origin else 0.0
            why = None if counts[0] else stop_reason(
                start - run.history[-1], origin - run.history[-1], origin, options)
            if replay is not None:  # the rules are deterministic, the clock is not
                out_of_time = why is None and k == len(replay) - 1 and r + 1 >= replay[k]
            elif options.time_limit is not None and why is None:
                out_of_time = now - t0 >= options.time_limit
            why, out_of_time = state.agree((why, out_of_time))
            if out_of_time:
                endings[-1] = "time"
                break
            if why is not None:
                endings[-1] = why
                break
        if out_of_time:
            break
    if progress:
        progress(total, total, "done")
    restored = best.restore(run)
    layers = run.first.layers if run.first is not None else []
    describe(layers, run.transforms)
    q_total, history = run.q_total, run.history
    after = best.value if restored else history[-1]
    gained = history[0] - history[-1]  # what the rounds' gains add up to
    for x in per_round:
        x["distance"] = max(x["objective"], 0.0) ** 0.5
        x["share"] = x["gain"] / gained if gained > 0 else 0.0
    info = {
        "group": group,
        "rounds": sum(rounds),
        "phase_rounds": rounds,  # without head permutation, then with it (when on)
        # per phase: False where the round cap or the clock ended it
        "converged": [e in ("converged", "stalled") for e in endings],
        "ended": _worst(endings),  # one of ENDINGS, for the whole run
        "phase_ended": endings,  # per phase
        # per phase: its last round's gain, as a fraction of the starting squared distance
        "last_gain": gains,
        "ffn_held": held,  # rounds that held the FFN maps (options.ffn_backoff)
        # rotation streams: the continuous block's steps taken (joint quasi-Newton steps and
        # plain Procrustes steps), rotviz.match.joint
        "joint_steps": steps,
        "plain_steps": plain,
        "objective": history,  # squared canonical distance after each step
        # per round: phase, round, squared canonical distance after it ("objective") and its
        # root ("distance"), the round's gain in squared distance, its share of the total gain
        # and its seconds; the gains add up to the total gain
        "history": per_round,
        "gain": gained,  # squared canonical distance gained in all
        "first_share": per_round[0]["share"] if per_round else 0.0,
        "seconds": _now() - t0,
        "restored_best": restored,  # a later round ended higher (roundoff): the best came back
        "distance_canonical_before": history[0] ** 0.5,
        "distance_canonical_after": after ** 0.5,
        "angles": rs.angles(q_total, group) if q_total is not None else [],
        "moved": int((q_total.diagonal() < 0.5).sum()) if group == "permutation" else None,
    }
    return Alternated(run.transforms, q_total, layers, info)


def _plain_phase(run: _Run, inner: MatchOptions, options: MatchOptions, group: str, k: int,
                 total: int, progress: Progress | None):
    """The plain rounds of one phase: per-layer maps, then the residual map's Procrustes step.
    Yields (round, objective before it, (1 if it held the FFN, 0, 0)) after each round; the
    round counts for the stopping rule only when it solved everything."""
    state = run.state
    per_layer = options.ffn or options.attn or options.rescale
    moved_share = 0.0
    # The FFN solve costs the most (an m x m cost matrix per layer). While it moves units it
    # runs every round; after a solve that moves none it waits 1, then 2, 4, ... rounds
    # (back to every round once it moves units again), and always runs in the round after
    # the others settle, which only then may end the phase. Meanwhile the FFN tensors may lag
    # behind the residual map (the state's business).
    others = options.attn or options.rescale
    wait_next, waiting = 1, 0
    for r in range(options.rounds):
        start = run.history[-1] if run.history else None
        done = k * options.rounds + r
        full = waiting == 0 or not (options.ffn and others and options.ffn_backoff)
        step_options = inner if full else replace(inner, ffn=False)
        tag = f"round {r + 1}{' (heads)' if k else ''}{'' if full else ' (FFN held)'}"
        if progress:
            progress(done, total, f"{tag}: per-layer maps")
        if per_layer:
            step = state.layers(step_options, full)
            if full and options.ffn:  # back off while the units stay put
                moved = any(rep.ffn_moved for rep in step.layers)
                moved_share = step.moved()
                waiting, wait_next = (0, 1) if moved else (wait_next, 2 * wait_next)
            elif waiting:
                waiting -= 1
            run.take(step)
        if progress:
            progress(done, total, f"{tag}: residual map")
        q, value = state.turn(group, settle=not options.ffn_backoff)
        run.turned(q)
        run.record(value)
        before = run.history[0] if start is None else start
        settled = before - run.history[-1] <= options.tol * run.history[0]
        if settled and not full:
            waiting = 0
        yield r, start, (0 if full else 1, 0, 0, moved_share if full else 0.0)


def _joint_phase(run: _Run, inner: MatchOptions, options: MatchOptions, group: str, k: int,
                 total: int, progress: Progress | None):
    """The rounds of one phase on a rotation stream: every per-layer map (FFN units and heads
    too), then the continuous block with those held (`_block`). While a round still moves
    more than FOLLOW of the FFN units, its block is one plain Procrustes step: the units
    follow the stream, as in the plain rounds. Yields (round, objective before it, (0, joint
    steps, plain steps)) after each."""
    state = run.state
    per_layer = options.ffn or options.attn or options.rescale
    for r in range(options.rounds):
        start = run.history[-1] if run.history else None
        tag = f"round {r + 1}{' (heads)' if k else ''}"
        if progress:
            progress(k * options.rounds + r, total, f"{tag}: per-layer maps")
        moved = 0.0
        if per_layer:
            step = state.layers(inner, True)
            moved = step.moved()
            run.take(step)
        steps = 1 if state.agree(moved > FOLLOW) else BLOCK_STEPS
        counts = _block(run, inner, options, group, steps, lambda i, tag=tag, r=r: progress(
            k * options.rounds + r, total,
            f"{tag}: {'residual map' if i == 0 else f'joint step {i + 1}'}")
            if progress else None)
        yield r, start, (0, *counts, moved)


def _block(run: _Run, inner: MatchOptions, options: MatchOptions, group: str, steps: int,
           tick: Callable[[int], None]) -> tuple[int, int]:
    """The continuous block with FFN units and heads held (rotviz.match.joint): at most
    `steps` steps on the residual map, each followed by the per-head maps solved again. A
    quasi-Newton step (no longer than a trust radius) is kept only when the objective does
    not go up; otherwise the state goes back and takes the plain Procrustes step, which never
    raises it, the radius halves and the quasi-Newton memory restarts. The block ends at a
    step gaining less than BLOCK_TOL of `tol`. Returns the quasi-Newton and plain steps
    taken."""
    state = run.state
    held = replace(inner, ffn=False, heads=False)
    follow = options.attn or options.rescale  # per-head maps to solve after each step
    m = state.cross()
    value = run.history[-1] if run.history else state.initial()
    frame = jn.Frame.of(group, len(m), m.device)
    grad = jn.skew(frame.reduce(m))
    memory = jn.LBFGS()
    radius = RADIUS
    counts = [0, 0]
    for i in range(steps):
        tick(i)
        tried = None
        if memory.pairs:
            a = memory.direction(grad, jn.Preconditioner.of(frame.reduce(m)))
            size = float(a.norm())
            if size > radius:
                a, size = a * (radius / size), radius
            saved = state.save()
            tried = _try(state, frame.lift(jn.cayley(a)), m, value, held, follow)
            if state.agree(tried[0] > value):  # it would go up: back, and the plain step
                state.load(saved)
                tried = None
                memory.pairs.clear()
                radius = 0.5 * size
            else:
                radius = max(radius, 2.0 * size)
        counts[tried is None] += 1
        if tried is None:
            q = rs.solve(m, group)
            a = _generator(frame.reduce(q))
            tried = _try(state, q, m, value, held, follow)
        new_value, step, q = tried
        run.turned(q)
        if step is not None:
            run.take(step)
        else:
            run.record(new_value)
        m_new = state.cross()
        grad_new = jn.skew(frame.reduce(m_new))
        if a is not None:
            memory.push(a, grad, grad_new)
        gain = value - new_value
        value, m, grad = new_value, m_new, grad_new
        if state.agree(gain <= BLOCK_TOL * options.tol * run.history[0]):
            break
    return counts[0], counts[1]


def _generator(qr: torch.Tensor) -> torch.Tensor | None:
    """The skew generator A whose Cayley map (rotviz.match.joint.cayley) is the rotation
    `qr` (reduced coordinates), or None where it has none (a turn by pi)."""
    eye = torch.eye(len(qr), dtype=qr.dtype, device=qr.device)
    a = 2.0 * torch.linalg.solve((qr + eye).t(), (qr - eye).t()).t()
    return a if bool(torch.isfinite(a).all()) and float(a.abs().max()) < 1e6 else None


def _try(state: State, q: torch.Tensor, m: torch.Tensor, value: float, held: MatchOptions,
         follow: bool) -> tuple[float, Step | None, torch.Tensor]:
    """Turn the stream by `q` and solve the per-head maps again (`follow`): the objective
    after, their step, and `q`. The turn's own effect follows from `m` exactly."""
    state.move(q)
    if follow:
        step = state.layers(held, False)
        return step.objective, step, q
    eye = torch.eye(len(q), dtype=q.dtype, device=q.device)
    return value + 2.0 * float(((eye - q) * m).sum()), None, q


def describe(layers: list[HeadReport], transforms: dict[int, LayerTransform]) -> None:
    """Put into the first round's per-layer reports what the whole element does: units
    moved and head order (the rest of each report describes that round)."""
    for rep in layers:
        t = transforms.get(rep.layer)
        if t is not None and t.perm is not None:
            rep.ffn_moved = int((t.perm != torch.arange(len(t.perm))).sum())
        if t is not None and t.heads is not None:
            rep.head_perm = t.heads.tolist()



"""Time the landscape explorer's measurements side by side, in one run, and write the
`landscape` section of bench/RESULTS.md (`landscape-gpu` on a GPU).

    python bench/landscape.py [--device cpu|cuda|auto] [--threads 2] [--roberta yes|no]
                              [--roberta-steps N]

Targets, on the default pair (zoo:vit-digits-s3 and s6) and its digits test split:
- a 21 x 21 random-direction plane (filter normalised) around the anchor: at most 20 s;
- the top Hessian eigenvalue of the anchor: at most 10 s;
- the Bezier curve's training (300 Adam steps): at most 60 s;
- layer-wise barriers, by block, with the unmatched comparison: at most 10 s;
and, timed without a target, the top Hessian eigenvalue of a roberta-base-shaped masked LM
(12 layers, d 768, 12 heads, FFN 3072, vocabulary 50,265; random weights, built here) on 32
sequences of 128 random tokens: on a GPU by default, to convergence; on a CPU only with
`--roberta yes`, its Lanczos run bounded by `--roberta-steps` (each step is one
Hessian-vector product through the whole model), the table saying how many steps ran.

With `--peer yes` (alone: `--only peer`) it also writes the `landscape-peer` section: the
21 x 21 filter-normalised plane around the anchor, rotviz's against loss-landscapes 3.0.6's
`random_plane` on the same 397 digits, on the module rotviz evaluates and on the model as
transformers loads it, side by side in one process at one thread and at two (with
`--device cuda`, section `landscape-peer-gpu`: both on the GPU, at --threads); with
`--peer yes` (alone: `--only paths`) also the
`landscape-batched` section: the 21-point barrier and the layer-wise barriers evaluated as
before (the points in turn), as rotviz's rule picks now (rotviz.evaluation.points_per_pass),
and eight points a pass (torch.func.vmap) forced.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results import default_pair_on_test, machine, write_section  # noqa: E402


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def roberta_base_shape(folder: Path, seqs: int = 32, length: int = 128):
    """A roberta-base-shaped masked LM with random weights, saved in `folder` and loaded as
    rotviz loads any model, and a masked split of `seqs` random sequences of `length`
    tokens (15% masked, seeded) read in its vocabulary."""
    import torch

    from rotviz.data.split import Split
    from rotviz.data.splits import IGNORE
    from rotviz.data.tokens import encoding_fingerprint
    from rotviz.random_models import save_random
    from rotviz.sources.loading import load_model

    path = save_random("roberta", folder / "roberta-base-shape", seed=0, layers=12, d=768,
                       heads=12, ffn=3072, vocab=50265, positions=length)
    model = load_model(path)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 50265, (seqs, length), generator=gen)
    hidden = torch.rand((seqs, length), generator=gen) < 0.15
    labels = torch.where(hidden, ids, torch.full_like(ids, IGNORE))
    inputs = torch.where(hidden, torch.full_like(ids, 4), ids)  # a fixed mask id
    split = Split("random", "test", "masked", inputs, labels, 50265,
                  encoding_fingerprint(model.path, model.config, model.ref))
    return model, split


def peer_plane(module, split, steps: int = 21, device: str = "cpu") -> float:
    """Seconds loss-landscapes' random_plane takes for a `steps` x `steps` filter-normalised
    plane of `module` (a transformers image classifier) on the whole split as one batch, its
    Loss metric being the mean cross-entropy. Run under torch.no_grad (its metric would
    otherwise record a graph at every point), on a copy of the module moved to `device`
    with the split (on a GPU the clock stops after the device has finished)."""
    import copy

    import loss_landscapes
    import torch
    import torch.nn.functional as F
    from loss_landscapes.metrics import Loss

    class Logits(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(pixel_values=x).logits

    model = Logits(copy.deepcopy(module)).eval().to(device)
    metric = Loss(F.cross_entropy, split.inputs.to(device, torch.float32),
                  split.labels.to(device))
    torch.manual_seed(0)
    t = time.perf_counter()
    # The peer makes its random directions with torch's factory functions and no device, so
    # on a GPU they would land on the CPU (a device mismatch): make the GPU the default device.
    with torch.no_grad(), torch.device(device):
        loss_landscapes.random_plane(model, metric, distance=1, steps=steps,
                                     normalization="filter")
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t


def peer_section(a, split, ends, threads: list[int], device: str = "cpu") -> str:
    """The `landscape-peer` section's body (see the module docstring): rotviz's plane, then
    loss-landscapes' on the module rotviz evaluates (the same arithmetic a point: on the CPU
    the unfused twin, rotviz.sources.running.attending_module) and on the model as
    transformers loads it (its default attention), which is what a user of the peer runs.
    On a GPU (`device` cuda) one row, both on the GPU, at the threads given."""
    import torch
    from transformers import AutoModelForImageClassification

    from rotviz.analysis.loss_grid import slice_at
    from rotviz.evaluation import Evaluator

    as_loaded = AutoModelForImageClassification.from_pretrained(str(a.path)).eval()
    rows = []
    gpu = device.startswith("cuda")
    for n in threads:
        torch.set_num_threads(n)
        if gpu:  # the first plane pays CUDA's start-up (kernels, allocator) for both
            slice_at(a, split, dims=2, grid=3, device=device)
        ours, s = _timed(lambda: slice_at(a, split, dims=2, grid=21, device=device))
        same = peer_plane(Evaluator(a, split, device=device).module, split, device=device)
        theirs = peer_plane(as_loaded, split, device=device)
        where = f"{device}, " if gpu else ""
        rows.append(f"| 21 x 21 plane, {where}{n} thread{'s' if n > 1 else ''} | {ours:.2f} | "
                    f"{same:.2f} ({same / ours:.2f}x) | {theirs:.2f} ({theirs / ours:.2f}x) | "
                    f"centre loss {s.centre_loss:.4f} |")
        print(rows[-1], flush=True)  # a row as it comes: the machine may be slow
    return ("| what | rotviz s | loss-landscapes on rotviz's module s (speed-up) | "
            "loss-landscapes on the model as loaded s (speed-up) | note |\n"
            "|---|---|---|---|---|\n" + "\n".join(rows))


def paths_section(ends, split, threads: list[int]) -> str:
    """The `landscape-batched` section's body: the 21-point barrier and the layer-wise
    barriers timed three ways in one process: as before this change (the points in turn,
    on torch's own threads), as rotviz's rule picks now (several points a pass where that
    pays, else one a pass shared among workers, one per thread), and eight points a pass
    forced (torch.func.vmap)."""
    import contextlib

    import numpy as np
    import torch

    import rotviz.analysis.paths as paths
    import rotviz.analysis.tensor_groups as tensor_groups
    import rotviz.evaluation as evaluation
    from rotviz.evaluation import Evaluator, points_per_pass
    from rotviz.measures.layerwise import layerwise_on

    @contextlib.contextmanager
    def way(how: str):
        saved = (evaluation.MAX_POINTS_PER_PASS, evaluation.BATCHED_WORK, paths.path_many,
                 tensor_groups.series)
        if how == "eight":
            evaluation.MAX_POINTS_PER_PASS, evaluation.BATCHED_WORK = 8, 10**18
        if how == "before":
            paths.path_many = lambda ev, point: None
            series = saved[3]
            tensor_groups.series = lambda *a, many=None, **k: series(*a, **k)
        try:
            yield
        finally:
            (evaluation.MAX_POINTS_PER_PASS, evaluation.BATCHED_WORK, paths.path_many,
             tensor_groups.series) = saved

    rows = []
    for n in threads:
        torch.set_num_threads(n)
        ev = Evaluator(ends.anchor, split)
        pa, pm = ev.params(ends.anchor.state), ev.params(ends.matched)
        alphas = np.linspace(0, 1, 21)
        times: dict[str, list[float]] = {}
        for how in ("before", "rule", "eight"):
            with way(how):
                bar, c = _timed(lambda e=ev, x=pa, y=pm, al=alphas:
                                paths.path_curve(e, x, y, al))
                lw, lay = _timed(lambda e=ev: layerwise_on(ends, split, 11, "block", True,
                                                           evaluator=e))
            times[how] = [bar, lw]
            if how == "before":
                want = (c["barrier"], lay.full_barrier)
            assert abs(c["barrier"] - want[0]) <= 1e-6 and abs(lay.full_barrier - want[1]) <= 1e-6
        for k, what in enumerate(("21-point barrier (22 points)", "layer-wise barriers by "
                                  "block, 11 points, with the unmatched comparison")):
            before, rule, eight = (times[h][k] for h in ("before", "rule", "eight"))
            rows.append(f"| {what} | {n} | {before:.2f} | {rule:.2f} ({before / rule:.2f}x) | "
                        f"{eight:.2f} ({before / eight:.2f}x) |")
            print(rows[-1], flush=True)
        rule_n = points_per_pass(ev, 21)
    torch.set_num_threads(threads[0])
    return (f"The rule takes {rule_n} point(s) a pass for the default pair on the CPU (its pass "
            f"is bound by arithmetic: docs/conventions.md, Evaluation). Every way gives the "
            f"same barriers (1e-6, asserted).\n\n| what | threads | before s (points in turn) "
            f"| now s (the rule) | eight a pass s (vmap) |\n|---|---|---|---|---|\n"
            + "\n".join(rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--roberta", default="auto", choices=("auto", "yes", "no"),
                    help="time the roberta-base shape (auto: on a GPU only; on this 2-core "
                         "CPU one evaluation of it takes about a minute)")
    ap.add_argument("--roberta-steps", type=int, default=0,
                    help="Lanczos steps for the roberta-base shape (0: 100 on a GPU, 3 on a "
                         "CPU)")
    ap.add_argument("--peer", default="no", choices=("yes", "no"),
                    help="also time the plane against loss-landscapes' random_plane and the "
                         "barriers batched against one point a pass (section landscape-peer)")
    ap.add_argument("--only", default="", choices=("", "peer", "paths"),
                    help="peer: only the landscape-peer section; paths: only the "
                         "landscape-batched section")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)

    import torch

    from rotviz.analysis.loss_grid import slice_at
    from rotviz.devices import resolve_device
    from rotviz.evaluation import Evaluator, points_per_pass
    from rotviz.match.endpoints import match_endpoints
    from rotviz.measures.bend import bend_on
    from rotviz.measures.hessian import hessian
    from rotviz.measures.layerwise import layerwise_on

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    a, b, split = default_pair_on_test()
    ends = match_endpoints(a, b, "seed", device)
    load = os.getloadavg()[0]
    shared = (f"1-minute load average {load:.1f} at the start on {os.cpu_count()} cores; "
              "compare the columns of a row, measured in one process, rather than the "
              "absolute seconds")
    if args.peer == "yes" or args.only == "paths":
        body = (f"Run as `python bench/landscape.py --only paths` (the CPU; {shared}).\n\n"
                f"Machine: {machine('cpu')}.\n\nDefault pair ({a.ref}, {b.ref}) matched "
                f"with seed, on the digits test split ({split.n} images).\n\n"
                + paths_section(ends, split, [1, 2]))
        print(body)
        if not args.no_write:
            write_section("landscape-batched", body)
        torch.set_num_threads(args.threads)
        if args.only == "paths":
            return 0
    if args.peer == "yes" or args.only == "peer":
        gpu = device.type == "cuda"  # one row, both on the GPU, in a section of its own
        if gpu:
            run_as = (f"`python bench/landscape.py --only peer --device cuda --threads "
                      f"{args.threads}`: both on the GPU, one process")
            per_pass = points_per_pass(Evaluator(a, split, device=device), 441)
            batched = (f"; rotviz evaluates {per_pass} points a pass here "
                       "(rotviz.evaluation.points_per_pass)")
        else:
            run_as, batched = f"`python bench/landscape.py --only peer` (the CPU; {shared})", ""
        body = (f"Run as {run_as}.\n\nMachine: {machine(device.type)}.\n\n"
                f"Default pair ({a.ref}, {b.ref}) on the digits test split ({split.n} "
                f"images); loss-landscapes 3.0.6 run under torch.no_grad, on the module rotviz "
                f"evaluates and on the model as transformers loads it{batched}.\n\n"
                + peer_section(a, split, ends, [args.threads] if gpu else [1, 2], str(device)))
        print(body)
        if not args.no_write:
            write_section("landscape-peer-gpu" if gpu else "landscape-peer", body)
        torch.set_num_threads(args.threads)
        if args.only == "peer":
            return 0
    rows: list[tuple[str, float, str, str]] = []

    took, s = _timed(lambda: slice_at(a, split, dims=2, grid=21, device=device))
    rows.append(("21 x 21 random plane (filter normalised) around the anchor", took, "20",
                 f"centre loss {s.centre_loss:.4f}; {1e3 * took / 441:.1f} ms a point"))
    took, h = _timed(lambda: hessian(a, None, split, device, top=1))
    rows.append(("top Hessian eigenvalue of the anchor", took, "10",
                 f"lambda_1 {h.eigenvalues[0]:.4f}; {h.hvps} Hessian-vector products"))
    took, r = _timed(lambda: bend_on(ends, split, "bezier", 300, device=device))
    rows.append(("Bezier curve, 300 Adam steps trained, then evaluated", took, "60",
                 f"training {r.train_seconds:.1f} s; barrier {r.barrier:.4f} against the "
                 f"line's {r.line_barrier:.4f}"))
    took, lw = _timed(lambda: layerwise_on(ends, split, 11, "block", True, device))
    rows.append(("layer-wise barriers by block, 11 points, with the unmatched comparison",
                 took, "10", f"{len(lw.groups)} groups; full-path barrier "
                 f"{lw.full_barrier:.4f} (unmatched {lw.full_barrier_unmatched:.4f})"))
    if args.roberta == "yes" or (args.roberta == "auto" and device.type == "cuda"):
        steps = args.roberta_steps or (100 if device.type == "cuda" else 3)
        with tempfile.TemporaryDirectory() as tmp:
            model, text = roberta_base_shape(Path(tmp))
            n = sum(t.numel() for t in model.state.values())
            took, rh = _timed(lambda: hessian(model, None, text, device, top=1, steps=steps,
                                              batch_size=32))
        rows.append((f"roberta-base shape ({n / 1e6:.0f}M parameters), 32 x 128 tokens: top "
                     "Hessian eigenvalue", took, "",
                     f"{rh.hvps} Hessian-vector products ({took / max(1, rh.hvps):.1f} s "
                     f"each), Lanczos bounded to {steps} steps; lambda_1 "
                     f"{rh.eigenvalues[0]:.4g}"))

    lines = [f"| {w} | {t:.2f} | {target or '-'} | "
             f"{'-' if not target else ('met' if t <= float(target) else 'not met')} | {note} |"
             for w, t, target, note in rows]
    body = (f"Run as `python bench/landscape.py --device {args.device} --threads "
            f"{args.threads}`.\n\nMachine: {machine(device.type)}.\n\nDefault pair "
            f"({a.ref}, {b.ref}) on the digits test split ({split.n} images), device "
            f"{device}.\n\n| what | seconds | target s | | result |\n|---|---|---|---|---|\n"
            + "\n".join(lines))
    print(body)
    if not args.no_write:
        write_section("landscape-gpu" if device.type == "cuda" else "landscape", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

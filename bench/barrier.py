"""Benchmark the landscape engine: interpolation curves, the loss plane and fusion.

    python bench/barrier.py [--device cpu|cuda|auto] [--threads 2] [--quick]

Writes section `barrier` of bench/RESULTS.md (CPU), or `barrier-gpu` when run on a GPU.
Targets: a 21-point curve on the default pair <= 3 s on 2 CPU cores; RegMean on the
default pair <= 10 s on 2 CPU cores; on a GPU, a random gpt2-small-size pair with a
64 x 128-token batch <= 10 s for 21 points. Every number is the median of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.results import machine, write_section  # noqa: E402
from rotviz.data.split import Split, load_split  # noqa: E402
from rotviz.sources.loading import load_model  # noqa: E402


def default_pair_refs() -> tuple[str, str]:
    from rotviz.zoo_registry import default_pair

    a, b = default_pair()
    return a, b


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def random_vit(tmp: Path, name: str, seed: int, d: int, layers: int) -> str:
    from rotviz.random_models import save_random

    return str(save_random("vit", tmp / f"{name}-{seed}", seed=seed, layers=layers, d=d,
                           heads=4, ffn=2 * d, labels=10, image=8, patch=2, channels=1))


def random_gpt2(tmp: Path, seed: int, **sizes) -> str:
    import transformers as T

    torch.manual_seed(seed)
    cfg = T.GPT2Config(n_positions=128, bos_token_id=0, eos_token_id=0,
                       architectures=["GPT2LMHeadModel"], **sizes)
    out = tmp / f"gpt2-{seed}"
    T.GPT2LMHeadModel(cfg).save_pretrained(str(out))
    return str(out)


def matched_state(a, b, spec: str, device):
    """The source matched onto the anchor and what matching did: (state, report), the
    endpoints' matched state (rotviz.match.endpoints.match_endpoints)."""
    from rotviz.match.endpoints import match_endpoints

    ends = match_endpoints(a, b, spec, device)
    return ends.matched, ends.report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer sizes, no plane")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--body-out", default=None, help="also write the section body to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    from rotviz.devices import pick_device
    from rotviz.measures.barrier import interpolate
    from rotviz.measures.merge import merge
    from rotviz.measures.plane import loss_plane

    device = pick_device(args.device)
    dev = str(device)
    rep = args.repeat
    lines: list[str] = []
    ra, rb = default_pair_refs()
    t0 = time.perf_counter()
    a, b = load_model(ra), load_model(rb)
    load_s = time.perf_counter() - t0
    test, train = load_split("digits", "test"), load_split("digits", "train")
    interpolate(a, b, test, None, points=3, device=device)  # warm-up

    # -- the default pair -------------------------------------------------------------------
    rows = []
    for spec in ("none", "seed"):
        s, c = timed(lambda spec=spec: interpolate(a, b, test, spec, 21, device), rep)
        rows.append(f"| 21-point curve, match {spec} (end to end, matching included) | {s:.2f} | "
                    f"barrier {c.barrier:.3f}, mid acc {c.mid_acc:.3f} |")
    state, _ = matched_state(a, b, "seed", device)
    s_match, _ = timed(lambda: matched_state(a, b, "seed", device), rep)
    rows.append(f"| matching [seed] alone | {s_match:.2f} | |")
    for method in ("simple", "fisher", "regmean"):
        s, r = timed(lambda m=method: merge(a, b, m, "seed", test, train, device=device), rep)
        rows.append(f"| merge {method}, match seed (8 x 32 statistics samples, evaluation "
                    f"included) | {s:.2f} | merged acc {r.acc:.3f} |")
    if not args.quick:
        s, pl = timed(lambda: loss_plane(a, b, test, "seed", 21, device=device), 1)
        rows.append(f"| loss plane 21 x 21, match seed (446 evaluations) | {s:.2f} | "
                    f"AB' loss {pl.point_loss[chr(65) + 'B' + chr(39)]:.3f} |")
    lines += [f"Default pair ({ra}, {rb}) on the digits test split ({test.n} images), "
              f"device {dev}; models load in {load_s:.2f} s.", "",
              "| what | seconds | result |", "|---|---|---|", *rows, ""]

    # -- growth with the number of points ---------------------------------------------------
    lines += ["Time against the number of points (match seed, matching done beforehand):", "",
              "| points | seconds | ms per point |", "|---|---|---|"]
    for n in (3, 5, 11, 21, 41):
        s, _ = timed(lambda n=n: interpolate(a, b, test, "seed", n, device, source_state=state),
                     rep)
        lines.append(f"| {n} | {s:.3f} | {1000 * s / (n + (n % 2 == 0)):.1f} |")
    lines.append("")

    # -- growth with model size --------------------------------------------------------------
    sizes = [(64, 4), (128, 4), (256, 4)] if args.quick else [(64, 4), (128, 4), (256, 4), (128, 8),
                                                              (512, 4)]
    lines += ["Time against model size (random HF ViT pairs, patch 2 on 8 x 8 digits, FFN 2d, "
              "4 heads, 21 points, match seed):", "",
              "| d | layers | parameters | matching s | 21-point curve s (after matching) |",
              "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for d, layers in sizes:
            ma = load_model(random_vit(Path(tmp), f"vit{d}x{layers}", 0, d, layers))
            mb = load_model(random_vit(Path(tmp), f"vit{d}x{layers}", 1, d, layers))
            n_params = sum(p.numel() for p in ma.model.parameters())
            s_m, (st, _) = timed(lambda ma=ma, mb=mb: matched_state(ma, mb, "seed", device), 1)
            s_c, _ = timed(lambda ma=ma, mb=mb, st=st: interpolate(
                ma, mb, test, "seed", 21, device, source_state=st), rep)
            lines.append(f"| {d} | {layers} | {n_params:,} | {s_m:.2f} | {s_c:.2f} |")
        lines.append("")

        # -- GPU: gpt2-small-size pair ----------------------------------------------------------
        if device.type == "cuda":
            gpt = dict(n_layer=12, n_embd=768, n_head=12, n_inner=3072, vocab_size=50257)
            ga = load_model(random_gpt2(Path(tmp), 0, **gpt))
            gb = load_model(random_gpt2(Path(tmp), 1, **gpt))
            gen = torch.Generator().manual_seed(0)
            x = torch.randint(0, 50257, (64, 128), generator=gen)
            y = torch.randint(0, 50257, (64, 128), generator=gen)
            split = Split("random", "test", "text", x, y, 50257)
            interpolate(ga, gb, split, None, 3, device, batch_size=64)  # warm-up
            grow = []
            for spec in ("none", "seed"):
                s, c = timed(lambda spec=spec: interpolate(ga, gb, split, spec, 21, device,
                                                           batch_size=64), rep)
                grow.append(f"| gpt2-small size (124 M), 64 x 128 tokens, 21 points, match "
                            f"{spec}, end to end | {s:.2f} | match {c.match_seconds:.2f} s |")
            mem = torch.cuda.max_memory_allocated() / 2**30
            lines += ["GPU:", "", "| what | seconds | note |", "|---|---|---|", *grow,
                      f"| peak GPU memory | {mem:.2f} GiB | |", ""]

    body = f"Machine: {machine(dev)}.\n\n" + "\n".join(lines)
    print(body)
    if args.body_out:
        Path(args.body_out).write_text(body)
    if not args.no_write:
        write_section("barrier-gpu" if device.type == "cuda" else "barrier", body)


if __name__ == "__main__":
    main()
